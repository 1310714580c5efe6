"""pass@1 and response tokens per environment and loop count, on held-out seeds, with vLLM.

Greedy decoding (temperature 0) on seeds outside the training range; one engine
serves every k (set live between batches). With `samples` > 0, also the sampled pass@1:
the mean success of `samples` completions per task at `temperature` (the expected
success of one sample, which moves even when the greedy answer does not).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from elr_rl.text import ChatOptions, TextCodec


@dataclass
class EvalConfig:
    """What `elr-rl eval` measures."""

    envs: list[Any] = field(default_factory=lambda: ["even_odd"])
    """Environments to evaluate on: names, dataset environments (mappings; their first `num_tasks` rows by
    row hash: point them at a held-out file or split) or YAML files of them."""
    ks: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    """Loop counts."""
    difficulty: int = 1
    """Difficulty of every task."""
    num_tasks: int = 32
    """Tasks per environment."""
    seed_offset: int = 100_000
    """First held-out seed (training pools use small seeds)."""
    max_new_tokens: int = 64
    """Token budget per answer."""
    max_model_len: int = 512
    """Longest prompt + answer."""
    samples: int = 0
    """Sampled completions per task for the sampled pass@1 (0: greedy only)."""
    temperature: float = 1.0
    """Sampling temperature of the sampled pass@1."""
    seed: int = 0
    """Sampling seed of the engine."""
    chat: ChatOptions = field(default_factory=ChatOptions)
    """How prompts are rendered with the checkpoint's chat template (system prompt, thinking switch)."""

    def validate(self) -> None:
        if not self.envs:
            raise ValueError("eval needs at least one environment (--envs)")
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"loop counts must be >= 1, got {self.ks}")
        if self.num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {self.num_tasks}")
        if self.samples < 0 or (self.samples and self.temperature <= 0):
            raise ValueError(f"samples must be >= 0 with a temperature > 0, got {self.samples} at {self.temperature}")


def held_out_tasks(cfg: EvalConfig) -> dict[str, list]:
    """The held-out set: `num_tasks` tasks per environment at seeds `seed_offset`, `seed_offset + 1`, ...
    (RL's validation during training uses the same set: elr_rl/rl/validation.py); a dataset environment's
    first `num_tasks` rows (environments.sources.eval_keys)."""
    from environments.registry import get_env, resolve_envs
    from environments.sources import eval_keys

    return {e: [get_env(e).generate(s, d) for d, s in eval_keys(e, cfg.num_tasks, cfg.seed_offset, cfg.difficulty)]
            for e in resolve_envs(cfg.envs)}


def evaluate(checkpoint: str, cfg: EvalConfig, progress: bool = True) -> list[dict[str, Any]]:
    """One row per (env, k): pass@1 (greedy), mean reward, mean response tokens, tasks, and with
    cfg.samples the sampled pass@1 (`pass_at_1_sampled`)."""
    from elr_rl.rollout.engine import EngineOptions, RolloutEngine
    from environments.pool import ScoringPool
    from environments.registry import get_env

    cfg.validate()
    codec = TextCodec.load(checkpoint, cfg.chat)  # before the engine: a missing tokenizer fails here
    stop = codec.stop_token_ids
    tasks = held_out_tasks(cfg)
    engine = RolloutEngine(checkpoint, k=cfg.ks[0], cache_mode="per_loop", seed=cfg.seed,
                           options=EngineOptions(max_model_len=cfg.max_model_len, max_num_seqs=64))
    rows = []
    try:
        with ScoringPool(2) as pool:
            for k in tqdm(cfg.ks, desc="eval k", disable=not progress):
                engine.set_k(k)
                for env_name, env_tasks in tasks.items():
                    prompts = [codec.prompt_ids(t.prompt, system=t.system) for t in env_tasks]
                    groups = engine.generate(prompts, n=1, max_tokens=cfg.max_new_tokens, temperature=0.0,
                                             stop_token_ids=stop)
                    comps = [g.completions[0] for g in groups]
                    scores = pool.score_many([(env_name, t, codec.decode(c.token_ids)) for t, c in zip(env_tasks, comps)])
                    n = len(scores)
                    row = {
                        "env": env_name, "k": k, "tasks": n,
                        "pass_at_1": sum(s.accuracy for s in scores) / n,
                        "reward": sum(s.reward for s in scores) / n,
                        "response_tokens": sum(len(c.token_ids) for c in comps) / n,
                    }
                    if cfg.samples:
                        groups = engine.generate(prompts, n=cfg.samples, max_tokens=cfg.max_new_tokens,
                                                 temperature=cfg.temperature, stop_token_ids=stop)
                        sampled = pool.score_many([(env_name, t, codec.decode(c.token_ids))
                                                   for t, g in zip(env_tasks, groups) for c in g.completions])
                        row["pass_at_1_sampled"] = sum(s.accuracy for s in sampled) / len(sampled)
                    rows.append(row)
    finally:
        engine.shutdown()
    return rows


def format_table(rows: list[dict[str, Any]], title: str = "") -> str:
    envs = sorted({r["env"] for r in rows})
    ks = sorted({r["k"] for r in rows})
    at = {(r["env"], r["k"]): r for r in rows}
    width = max(len(e) for e in envs + ["environment"])
    lines = [title] if title else []
    lines.append(f"{'environment':<{width}} " + " ".join(f"{'k=' + str(k):>14}" for k in ks))
    sampled = all("pass_at_1_sampled" in r for r in rows)
    w = 22 if sampled else 14
    lines[-1] = f"{'environment':<{width}} " + " ".join(f"{'k=' + str(k):>{w}}" for k in ks)
    for e in envs:
        cells = []
        for k in ks:
            r = at[e, k]
            extra = f" / {r['pass_at_1_sampled']:.3f}" if sampled else ""
            cells.append(f"{r['pass_at_1']:>6.3f}{extra} ({r['response_tokens']:>4.1f}t)")
        lines.append(f"{e:<{width}} " + " ".join(f"{c:>{w}}" for c in cells))
    lines.append("cells: greedy pass@1" + (" / sampled pass@1" if sampled else "") + " (mean response tokens)")
    return "\n".join(lines)
