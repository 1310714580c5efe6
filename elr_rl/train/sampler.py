"""Mixed-depth loop sampling, as small pure pieces.

Every draw is a pure function of (seed, step, microbatch, rank): no hidden RNG
state, so all ranks agree on who is forced to k = 1 without communicating, and
a resumed run draws exactly the k's the uninterrupted run would have drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from elr_rl.train.config import LoopConfig


def expected_p1(K: int, f: float) -> float:
    """P(k = 1) = 1/K + (1 - 1/K) f: forced ranks always, the others with chance 1/K."""
    return 1.0 / K + (1.0 - 1.0 / K) * f


def expected_k_bar(K: int, f: float) -> float:
    """E[k] = f * 1 + (1 - f) (K + 1) / 2."""
    return f + (1.0 - f) * (K + 1) / 2.0


def forced_ranks(step: int, world_size: int, f: float) -> frozenset[int]:
    """Ranks forced to k = 1 for optimizer step `step`: a window of f * W ranks rotating over steps.

    Step s forces ranks m mod W for m in [floor(s f W), floor((s + 1) f W)). Over s steps every rank
    is forced floor-or-ceil(s f) times, so each rank's forced fraction is f and each step forces
    floor or ceil of f W ranks (f W need not be an integer).
    """
    if f <= 0.0:
        return frozenset()
    if f >= 1.0:
        return frozenset(range(world_size))
    fw = f * world_size
    lo = math.floor(step * fw + 1e-9)
    hi = math.floor((step + 1) * fw + 1e-9)
    return frozenset(m % world_size for m in range(lo, hi))


def draw_uniform_k(seed: int, step: int, micro: int, rank: int, K: int) -> int:
    """k ~ Uniform{1..K}, a pure function of (seed, step, micro, rank)."""
    rng = np.random.default_rng([seed, step, micro, rank])
    return int(rng.integers(1, K + 1))


def loop_count(cfg: LoopConfig, K: int, seed: int, step: int, micro: int, rank: int, world_size: int) -> int:
    """The loop count of microbatch `micro` of optimizer step `step` on `rank` (mixed phase)."""
    if cfg.mode == "fixed":
        return cfg.fixed_k
    if rank in forced_ranks(step, world_size, cfg.force_one_fraction):
        return 1
    # Synchronized: the rank is left out of the draw so every rank gets the same k.
    draw_rank = rank if cfg.mode == "independent" else -1
    return draw_uniform_k(seed, step, micro, draw_rank + 1, K)


def switch_step(delay_fraction: float, total_steps: int) -> int:
    """First optimizer step of mixed depth: tokens before it >= rho * total tokens.

    Every step trains the same number of tokens, so the token fraction rho is the step
    fraction: switch = ceil(rho * total_steps).
    """
    return math.ceil(delay_fraction * total_steps - 1e-9)


@dataclass
class LoopSampler:
    """Stateful wrapper the trainer uses: k per microbatch plus the delayed-switch bookkeeping."""

    cfg: LoopConfig
    K: int
    seed: int
    rank: int
    world_size: int
    total_steps: int
    switched: bool = False

    def __post_init__(self) -> None:
        self.switch_at = switch_step(self.cfg.delay_fraction, self.total_steps)
        if self.switch_at <= 0:
            self.switched = True  # no delay phase

    def in_delay(self, step: int) -> bool:
        """True while delayed mixed depth still trains at k = 1."""
        return step < self.switch_at

    def should_switch(self, step: int) -> bool:
        """True exactly at the first mixed-depth step of a run that had a delay phase."""
        return not self.switched and step >= self.switch_at

    def mark_switched(self) -> None:
        self.switched = True

    def k(self, step: int, micro: int) -> int:
        """Loop count for (step, micro) on this rank."""
        if self.in_delay(step):
            return 1
        return loop_count(self.cfg, self.K, self.seed, step, micro, self.rank, self.world_size)

    def state_dict(self) -> dict:
        return {"switched": self.switched, "switch_at": self.switch_at}

    def load_state_dict(self, state: dict) -> None:
        self.switched = bool(state["switched"])
