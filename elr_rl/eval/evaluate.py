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
from environments.sandbox_tier import SandboxConfig


@dataclass
class EvalConfig:
    """What `elr-rl eval` measures."""

    envs: list[Any] = field(default_factory=lambda: ["even_odd"])
    """Environments to evaluate on: names, dataset environments (mappings; their first `num_tasks` rows by
    row hash: point them at a held-out file or split) or YAML files of them."""
    ks: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    """Loop counts."""
    difficulty: int = 1
    """Difficulty of every task (when `difficulties` is empty)."""
    difficulties: list[int] = field(default_factory=list)
    """Several difficulties in one run (one engine start): rows per (env, difficulty, k). Empty: [difficulty]."""
    num_tasks: int = 32
    """Tasks per environment."""
    seed_offset: int = 100_000
    """First held-out seed (training pools use small seeds)."""
    max_new_tokens: int = 64
    """Token budget per answer."""
    max_model_len: int = 512
    """Longest prompt + answer."""
    max_num_seqs: int = 64
    """Sequences the engine decodes at once (its KV cache holds this many of max_model_len). A larger batch
    runs a large eval faster when the model is small (the depth demo passes 256: its ladder evals generate
    1.26-1.51x faster than at 64 on the CPU, the same greedy results); a large model's KV cache grows with it."""
    samples: int = 0
    """Sampled completions per task for the sampled pass@1 (0: greedy only)."""
    temperature: float = 1.0
    """Sampling temperature of the sampled pass@1."""
    seed: int = 0
    """Sampling seed of the engine."""
    chat: ChatOptions = field(default_factory=ChatOptions)
    """How prompts are rendered with the checkpoint's chat template (system prompt, thinking switch)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Sandbox of model-written code (environments that run it): the tier, checked before the engine starts."""

    def validate(self) -> None:
        if not self.envs:
            raise ValueError("eval needs at least one environment (--envs)")
        if not self.ks or min(self.ks) < 1:
            raise ValueError(f"loop counts must be >= 1, got {self.ks}")
        if min(self.levels()) < 1:
            raise ValueError(f"difficulties must be >= 1, got {self.levels()}")
        if self.num_tasks < 1:
            raise ValueError(f"num_tasks must be >= 1, got {self.num_tasks}")
        if self.max_num_seqs < 1:
            raise ValueError(f"max_num_seqs must be >= 1, got {self.max_num_seqs}")
        if self.samples < 0 or (self.samples and self.temperature <= 0):
            raise ValueError(f"samples must be >= 0 with a temperature > 0, got {self.samples} at {self.temperature}")

    def levels(self) -> list[int]:
        """The difficulties evaluated, in order, without repeats."""
        return list(dict.fromkeys(self.difficulties or [self.difficulty]))


def held_out_tasks(cfg: EvalConfig) -> dict[tuple[str, int], list]:
    """The held-out set per (environment, difficulty): `num_tasks` tasks at seeds `seed_offset`,
    `seed_offset + 1`, ... (RL's validation during training uses the same set: elr_rl/rl/validation.py);
    a dataset environment's first `num_tasks` rows (environments.sources.eval_keys), once, under the
    first difficulty (its rows carry their own)."""
    from environments.registry import get_env, resolve_envs
    from environments.sources import eval_keys

    out = {}
    for e in resolve_envs(cfg.envs):
        env = get_env(e)
        for i, level in enumerate(cfg.levels()):
            if i and getattr(env, "prompt_keys", None) is not None:
                break  # a dataset: the same rows at every difficulty
            out[e, level] = [env.generate(s, d) for d, s in eval_keys(e, cfg.num_tasks, cfg.seed_offset, level)]
    return out


def evaluate(checkpoint: str, cfg: EvalConfig, progress: bool = True, pool=None,
             tasks: dict[tuple[str, int], list] | None = None) -> list[dict[str, Any]]:
    """One row per (env, difficulty, k): pass@1 (greedy), mean reward, mean response tokens, tasks, and with
    cfg.samples the sampled pass@1 (`pass_at_1_sampled`). Multi-turn environments are played as
    episodes (the RL workers' implementation), their turns answered by the scoring pool. `pool` and `tasks`
    (held_out_tasks(cfg)) let several checkpoints share one scoring pool and one task set."""
    from elr_rl.rollout.engine import EngineOptions, RolloutEngine
    from environments.pool import ScoringPool
    from environments.registry import get_env

    cfg.validate()
    codec = TextCodec.load(checkpoint, cfg.chat)  # before the engine: a missing tokenizer fails here
    tasks = held_out_tasks(cfg) if tasks is None else tasks
    cfg.sandbox.require_for(get_env(e) for e, _ in tasks)  # a sandbox that cannot run stops here, not per task
    if pool is None:
        with ScoringPool(2) as own:
            return evaluate(checkpoint, cfg, progress, own, tasks)
    engine = RolloutEngine(checkpoint, k=cfg.ks[0], cache_mode="per_loop", seed=cfg.seed,
                           options=EngineOptions(max_model_len=cfg.max_model_len, max_num_seqs=cfg.max_num_seqs))
    rows = []
    try:
        for k in tqdm(cfg.ks, desc="eval k", disable=not progress):
            engine.set_k(k)
            for (env_name, level), env_tasks in tasks.items():
                env = get_env(env_name)
                greedy = _run(engine, pool, codec, cfg, env, env_tasks, n=1, temperature=0.0)
                n = len(greedy)
                row = {
                    "env": env_name, "difficulty": level, "k": k, "tasks": n,
                    "pass_at_1": sum(s.accuracy for s, _ in greedy) / n,
                    "reward": sum(s.reward for s, _ in greedy) / n,
                    "response_tokens": sum(t for _, t in greedy) / n,
                }
                if cfg.samples:
                    sampled = _run(engine, pool, codec, cfg, env, env_tasks, n=cfg.samples,
                                   temperature=cfg.temperature)
                    row["pass_at_1_sampled"] = sum(s.accuracy for s, _ in sampled) / len(sampled)
                rows.append(row)
    finally:
        engine.shutdown()
    return rows


def _run(engine, pool, codec: TextCodec, cfg: EvalConfig, env, tasks: list, n: int, temperature: float) -> list:
    """(Score, model tokens) of n completions per task, task by task; whole episodes for a multi-turn env."""
    from elr_rl.rollout.episodes import play_episodes

    def sample(contexts: list[list[int]], n: int) -> list[list]:
        groups = engine.generate(contexts, n=n, max_tokens=cfg.max_new_tokens, temperature=temperature,
                                 stop_token_ids=codec.stop_token_ids)
        return [g.completions for g in groups]

    prompts = [codec.prompt_ids(t.prompt, system=t.system) for t in tasks]
    groups = sample(prompts, n)
    if not env.multi_turn:
        scores = pool.score_many([(env.name, t, codec.decode(c.token_ids)) for t, g in zip(tasks, groups) for c in g])
        return list(zip(scores, [len(c.token_ids) for g in groups for c in g]))
    out = []
    room = cfg.max_model_len - cfg.max_new_tokens
    for task, prompt, first in zip(tasks, prompts, groups):
        episodes = play_episodes(lambda ctxs: [g[0] for g in sample(ctxs, 1)], codec,
                                 [pool.episode(env.name, task) for _ in first], env.max_turns, prompt, first, room)
        out += [(ep.score, ep.model_tokens) for ep in episodes]
    return out


def format_table(rows: list[dict[str, Any]], title: str = "") -> str:
    """One line per environment (per environment and difficulty when several were evaluated), one column per k."""
    several = len({r.get("difficulty", 1) for r in rows}) > 1

    def label(r: dict[str, Any]) -> str:
        return f"{r['env']} (D={r.get('difficulty', 1)})" if several else r["env"]

    names = sorted({label(r) for r in rows})
    ks = sorted({r["k"] for r in rows})
    at = {(label(r), r["k"]): r for r in rows}
    width = max(len(e) for e in names + ["environment"])
    sampled = all("pass_at_1_sampled" in r for r in rows)
    w = 22 if sampled else 14
    lines = [title] if title else []
    lines.append(f"{'environment':<{width}} " + " ".join(f"{'k=' + str(k):>{w}}" for k in ks))
    for e in names:
        cells = []
        for k in ks:
            r = at[e, k]
            extra = f" / {r['pass_at_1_sampled']:.3f}" if sampled else ""
            cells.append(f"{r['pass_at_1']:>6.3f}{extra} ({r['response_tokens']:>4.1f}t)")
        lines.append(f"{e:<{width}} " + " ".join(f"{c:>{w}}" for c in cells))
    lines.append("cells: greedy pass@1" + (" / sampled pass@1" if sampled else "") + " (mean response tokens)")
    return "\n".join(lines)
