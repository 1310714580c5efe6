"""Learning-rate schedules as pure functions of the optimizer step.

The engine sets the lr from `lr_at(step)` before every optimizer step, so the
schedule carries no state and a resumed run gets exactly the same lr.
"""

from __future__ import annotations

import math

from elr_rl.train.config import ScheduleConfig


def warmup_factor(step: int, warmup_steps: int) -> float:
    """Linear warm-up: (step + 1) / warmup_steps until warm-up ends, then 1."""
    if warmup_steps <= 0 or step >= warmup_steps:
        return 1.0
    return (step + 1) / warmup_steps


def cosine_factor(progress: float, min_ratio: float) -> float:
    """min + (1 - min) * (1 + cos(pi * p)) / 2 for progress p in [0, 1]."""
    p = min(max(progress, 0.0), 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * p))


def linear_factor(progress: float, min_ratio: float) -> float:
    """min + (1 - min) * (1 - p)."""
    p = min(max(progress, 0.0), 1.0)
    return min_ratio + (1.0 - min_ratio) * (1.0 - p)


def minus_sqrt_factor(step: int, total_steps: int, decay_fraction: float, min_ratio: float) -> float:
    """Warm-up-stable-decay with the 1 - sqrt cooldown (Dory1.0's schedule).

    Stable at 1 until the last `decay_fraction` of steps, then
    min + (1 - min) * (1 - sqrt(q)), q = fraction of the cooldown done.
    """
    decay_steps = max(1, round(total_steps * decay_fraction))
    start = total_steps - decay_steps
    if step < start:
        return 1.0
    q = min(1.0, (step - start + 1) / decay_steps)
    return min_ratio + (1.0 - min_ratio) * (1.0 - math.sqrt(q))


def lr_at(step: int, total_steps: int, peak_lr: float, cfg: ScheduleConfig) -> float:
    """The learning rate of optimizer step `step` (0-based) of `total_steps`."""
    w = warmup_factor(step, cfg.warmup_steps)
    if cfg.name == "constant" or step < cfg.warmup_steps:
        return peak_lr * w
    progress = (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps)
    if cfg.name == "cosine":
        return peak_lr * cosine_factor(progress, cfg.min_lr_ratio)
    if cfg.name == "linear":
        return peak_lr * linear_factor(progress, cfg.min_lr_ratio)
    if cfg.name == "minus_sqrt":
        return peak_lr * minus_sqrt_factor(step, total_steps, cfg.decay_fraction, cfg.min_lr_ratio)
    raise ValueError(f"schedule.name: unknown schedule {cfg.name!r}")
