"""Pass-rate profiling: sample a checkpoint n times per prompt and loop count, count successes.

Layout under `<run_dir>/profile/` (the dashboard reads `profile/*.parquet`):

    {name}.parquet            the merged table, one row per (prompt, k) (PROFILE_COLUMNS + mean_reward)
    {name}.parts/meta.json    the settings the parts were made with (resume refuses a mismatch)
    {name}.parts/part-*.parquet   finished chunks, written atomically as they complete
    {name}.samples/part-*.parquet every sampled completion and its score (save_samples=true)

A (prompt, k) pair whose row sits in a finished part is never profiled again,
so an interrupted job resumes where it stopped, and a job grown by more seeds,
environments or loop counts profiles only what is new. Generation goes through a
small `GenerateFn` (token contexts, k, n) -> n completions each, so the
counting, episode and resume logic test without an engine; `elr_rl.profile.engines` wires
it to the vLLM rollout engine, locally or as several Ray workers.
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional, Protocol

from curriculum.passrates import PROFILE_COLUMNS, read_parquet
from curriculum.routing import Prompt
from elr_rl.text import ChatOptions, TextCodec
from environments.sandbox_tier import SandboxConfig


@dataclass
class EngineSettings:
    """How each profiling engine runs (elr_rl.rollout.engine.RolloutEngine options)."""

    dtype: str = "float32"
    """Engine compute dtype: float32, bfloat16 or float16 (bf16 is ~27% faster on this CPU)."""
    max_model_len: int = 1024
    """Longest prompt + completion, in tokens (a longer prompt is a clear error)."""
    max_num_seqs: int = 64
    """Sequences decoded together (on CPU the KV cache is sized so that all of them fit)."""
    cache_mode: Optional[str] = None
    """KV-cache mode (per_loop | last_loop); None = the checkpoint's own."""
    device: str = "auto"
    """auto (whatever the installed vLLM runs on), cpu or cuda."""
    gpu_memory_utilization: float = 0.9
    """CUDA only: share of the GPU's memory the engine takes; its KV cache is what is left of it after
    the weights (vLLM preempts sequences that do not fit)."""


@dataclass
class ProfileConfig:
    """`elr-rl profile` settings."""

    checkpoint: str = ""
    """Checkpoint directory (config.json, model.safetensors, tokenizer files) to profile."""
    run_dir: str = "runs/profile"
    """Run directory; the table goes to <run_dir>/profile/<name>.parquet."""
    name: str = "profile"
    """Table name (file stem). Tables are read in name order, so use e.g. step_000100 for a run."""
    envs: list[Any] = field(default_factory=lambda: ["arith_multidigit"])
    """Environments whose prompts are profiled: names, dataset environments (mappings, all their rows) or YAML
    files of them (see the RL config's envs.names)."""
    difficulties: list[int] = field(default_factory=lambda: [1, 2, 3])
    """Difficulty levels profiled in every environment."""
    seeds_per_difficulty: int = 16
    """Prompts per (environment, difficulty): task seeds seed_offset .. seed_offset + n - 1."""
    seed_offset: int = 0
    """First task seed (keep profiling prompts apart from held-out evaluation seeds)."""
    loop_counts: Optional[list[int]] = None
    """Loop counts to profile at; None = every k from 1 to the checkpoint's max_loops."""
    samples_per_prompt: int = 8
    """Completions sampled per prompt and loop count (n)."""
    max_tokens: int = 256
    """Longest completion, in tokens."""
    temperature: float = 1.0
    """Sampling temperature (1.0 = the policy's own distribution, as in RL rollouts)."""
    top_p: float = 1.0
    """Nucleus-sampling mass."""
    seed: int = 0
    """Sampling seed of the engines."""
    chunk_prompts: int = 16
    """Prompts per chunk; a chunk is the unit of work, of progress on disk and of resume."""
    num_engines: int = 1
    """Engines to spread chunks over; > 1 starts one Ray worker (one engine) per engine."""
    engine_cpus: float = 1.0
    """CPUs reserved by each Ray engine worker."""
    save_samples: bool = False
    """Also write every completion and its score to <name>.samples/."""
    scoring_workers: int = 2
    """Scoring processes (environments.pool.ScoringPool: enforced timeouts); 0 = score in this process."""
    engine: EngineSettings = field(default_factory=EngineSettings)
    """Engine settings."""
    chat: ChatOptions = field(default_factory=ChatOptions)
    """How prompts are rendered with the checkpoint's chat template (system prompt, thinking switch)."""
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    """Sandbox of model-written code (environments that run it): the tier, checked before any engine starts."""

    def validate(self) -> None:
        if not self.checkpoint:
            raise ValueError("profile: set checkpoint=PATH to the checkpoint directory to profile")
        if not Path(self.checkpoint).is_dir():
            raise ValueError(f"profile: checkpoint {self.checkpoint!r} is not a directory")
        if not self.envs:
            raise ValueError("profile: envs is empty: name at least one environment (see `elr-rl envs list`)")
        for key in ("samples_per_prompt", "seeds_per_difficulty", "chunk_prompts", "num_engines", "max_tokens"):
            if getattr(self, key) <= 0:
                raise ValueError(f"profile: {key} must be positive, got {getattr(self, key)}")
        if self.engine.max_model_len <= self.max_tokens:
            raise ValueError(
                f"profile: engine.max_model_len {self.engine.max_model_len} must exceed max_tokens {self.max_tokens}"
            )
        if not 0 < self.engine.gpu_memory_utilization <= 1:
            raise ValueError(f"profile: engine.gpu_memory_utilization must be a share in (0, 1], "
                             f"got {self.engine.gpu_memory_utilization}")
        if self.loop_counts is not None and (not self.loop_counts or min(self.loop_counts) < 1):
            raise ValueError(f"profile: loop_counts must be loop counts >= 1 (or null for all), got {self.loop_counts}")
        cfg_file = Path(self.checkpoint) / "config.json"
        max_loops = json.loads(cfg_file.read_text()).get("max_loops") if cfg_file.is_file() else None
        if self.loop_counts and max_loops is not None and max(self.loop_counts) > max_loops:
            raise ValueError(f"profile: loop_counts {self.loop_counts} exceed the checkpoint's max_loops={max_loops}; "
                             f"use loop counts between 1 and {max_loops}")
        if "/" in self.name or not self.name:
            raise ValueError(f"profile: name {self.name!r} must be a plain file stem")


@dataclass
class Completion:
    """One sampled completion (one model turn)."""

    token_ids: list[int]
    finish_reason: str = "stop"  # "stop" (end-of-sequence token) or "length" (max_tokens)


class GenerateFn(Protocol):
    def __call__(self, contexts: list[list[int]], k: int, n: int) -> list[list[Completion]]:
        """n completions for each token context, sampled at loop count k (stopping at <|eos|>)."""


# (tasks, completion texts) -> Scores, pairwise. Default: each environment's own `score`.
ScoreFn = Callable[[list[Any], list[str]], list[Any]]
# task -> a multi-turn episode's environment side (step / finish), e.g. ScoringPool.episode.
EpisodeFn = Callable[[Any], Any]


@dataclass
class Sampled:
    """One scored sample: the model's text (all turns), its model-token count and its Score."""

    text: str
    num_tokens: int
    score: Any


def profile_pool(cfg: ProfileConfig) -> list[Prompt]:
    """The prompts a profile job covers: envs x difficulties x seeds, and every row of a dataset environment."""
    from environments.sources import pool_keys

    seeds = range(cfg.seed_offset, cfg.seed_offset + cfg.seeds_per_difficulty)
    return [Prompt(*key) for key in pool_keys(cfg.envs, cfg.difficulties, seeds)]


def count_chunk(
    prompts: list[Prompt], k: int, groups: list[list[Sampled]]
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Table rows (pass_rate = successes / samples, success = Score.accuracy) and sample rows."""
    rows, samples = [], []
    for prompt, group in zip(prompts, groups, strict=True):
        for i, smp in enumerate(group):
            samples.append(dict(prompt_id=prompt.prompt_id, env=prompt.env, difficulty=prompt.difficulty,
                                seed=prompt.seed, k=k, sample=i, text=smp.text, num_tokens=smp.num_tokens,
                                reward=float(smp.score.reward), success=bool(smp.score.accuracy)))
        n = len(group)
        succ = sum(bool(smp.score.accuracy) for smp in group)
        rows.append(dict(prompt_id=prompt.prompt_id, env=prompt.env, difficulty=prompt.difficulty,
                         seed=prompt.seed, k=k, samples=n, successes=succ, pass_rate=succ / n,
                         mean_response_tokens=sum(smp.num_tokens for smp in group) / n,
                         mean_reward=sum(float(smp.score.reward) for smp in group) / n))
    return rows, samples


def run_chunk(
    generate: GenerateFn,
    score: ScoreFn,
    envs: dict[str, Any],
    prompts: list[Prompt],
    k: int,
    n: int,
    codec: TextCodec,
    max_context: int | None = None,
    episode: EpisodeFn | None = None,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Sample n completions per prompt at loop count k (whole episodes for multi-turn
    environments, their turns answered by `episode(task)` sessions: in process by default), score them, count them. Prompts are rendered with the checkpoint's chat
    template and completions decoded by `codec` (elr_rl.text).

    max_context: longest context a later turn of an episode may be sampled from
    (max_model_len - max_tokens); an episode that outgrows it ends there.
    """
    tasks = [envs[p.env].generate(p.seed, p.difficulty) for p in prompts]
    contexts = [codec.prompt_ids(t.prompt, system=t.system) for t in tasks]
    first = generate(contexts, k, n)
    if len(first) != len(prompts) or any(len(g) != n for g in first):
        raise RuntimeError(f"generate returned {[len(g) for g in first]} completions, expected {n} each")
    groups: list[list[Sampled]] = [[] for _ in prompts]
    single = [i for i, t in enumerate(tasks) if not envs[t.env].multi_turn]
    texts = [codec.decode(c.token_ids) for i in single for c in first[i]]
    scores = iter(score([tasks[i] for i in single for _ in first[i]], texts))
    flat = iter(texts)
    for i in single:
        groups[i] = [Sampled(next(flat), len(c.token_ids), next(scores)) for c in first[i]]
    episode = episode or local_episode(envs)
    for i, task in enumerate(tasks):
        if envs[task.env].multi_turn:
            sessions = [episode(task) for _ in first[i]]
            groups[i] = run_episodes(generate, codec, envs[task.env], sessions, contexts[i], first[i], k, max_context)
    return count_chunk(prompts, k, groups)


def run_episodes(
    generate: GenerateFn,
    codec: TextCodec,
    env: Any,
    sessions: list[Any],
    prompt_ids: list[int],
    first: list[Completion],
    k: int,
    max_context: int | None = None,
) -> list[Sampled]:
    """Play each first turn's episode, one session each (elr_rl.rollout.episodes, the RL workers'
    implementation; sessions of the scoring pool, or in process).

    The sample's text joins the model turns with the environments' turn separator, so
    `env.score(task, text)` replays the same episode.
    """
    from elr_rl.rollout.episodes import play_episodes
    from environments.base import TURN_SEPARATOR

    episodes = play_episodes(lambda ctxs: [g[0] for g in generate(ctxs, k, 1)], codec, sessions, env.max_turns,
                             prompt_ids, first, max_context)
    return [Sampled(TURN_SEPARATOR.join(ep.turns), ep.model_tokens, ep.score) for ep in episodes]


def local_episode(envs: dict[str, Any]) -> EpisodeFn:
    """Episodes stepped in this process (environments.pool.LocalEpisode)."""
    from environments.pool import LocalEpisode

    return lambda task: LocalEpisode(envs[task.env], task)


def env_scorer(envs: dict[str, Any]) -> ScoreFn:
    """Score in this process with each environment's `score` (which sandboxes code itself)."""

    def score(tasks: list[Any], texts: list[str]) -> list[Any]:
        return [envs[t.env].score(t, text) for t, text in zip(tasks, texts)]

    return score


class ProfileStore:
    """The on-disk parts of one profile table: what is finished, appending chunks, merging."""

    def __init__(self, run_dir: str | Path, name: str) -> None:
        self.dir = Path(run_dir) / "profile"
        self.table_path = self.dir / f"{name}.parquet"
        self.parts = self.dir / f"{name}.parts"
        self.samples = self.dir / f"{name}.samples"

    def check_meta(self, meta: dict[str, Any]) -> None:
        """Record the job's settings, or refuse to resume parts made with different ones."""
        path = self.parts / "meta.json"
        if path.is_file():
            old = json.loads(path.read_text())
            diff = {k: (old.get(k), v) for k, v in meta.items() if old.get(k) != v}
            if diff:
                raise ValueError(
                    f"{self.parts} holds a profile made with other settings {diff} (saved, now): "
                    "use another name=... or delete that folder to start over"
                )
        else:
            self.parts.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(meta, indent=1, sort_keys=True))

    def _part_files(self) -> list[Path]:
        return sorted(self.parts.glob("part-*.parquet")) if self.parts.is_dir() else []

    def finished_rows(self) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = []
        for f in self._part_files():
            rows.extend(read_parquet(f).to_list())
        return rows

    def finished(self) -> set[tuple[str, int]]:
        """(prompt_id, k) pairs with a row in a finished part."""
        return {(r["prompt_id"], int(r["k"])) for r in self.finished_rows()}

    def append(self, rows: list[dict[str, Any]], samples: list[dict[str, Any]] | None) -> Path:
        """Write one finished chunk (samples first: a part's existence means the chunk is done)."""
        # max + 1, not a count: a deleted part must never make a new one overwrite another
        index = max((int(f.stem.split("-")[1]) for f in self._part_files()), default=-1) + 1
        part = self.parts / f"part-{index:05d}.parquet"
        if samples:
            _write_parquet(samples, self.samples / part.name)
        _write_parquet(rows, part)
        return part

    def merge(self) -> list[dict[str, Any]]:
        """Write {name}.parquet from all parts, sorted by (env, difficulty, seed, k); returns its rows."""
        rows = sorted(self.finished_rows(), key=lambda r: (r["env"], r["difficulty"], r["seed"], r["k"]))
        keys = [(r["prompt_id"], r["k"]) for r in rows]
        if len(set(keys)) != len(keys):
            raise RuntimeError(f"{self.parts} holds duplicate (prompt, k) rows: delete the folder and re-run")
        _write_parquet(rows, self.table_path)
        return rows


def _write_parquet(rows: list[dict[str, Any]], path: Path) -> None:
    """Rows -> Parquet through `datasets`, atomically (temporary name, then rename)."""
    from datasets import Dataset

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    Dataset.from_list(rows).to_parquet(str(tmp))
    os.replace(tmp, path)


def plan_chunks(
    pool: list[Prompt], ks: list[int], done: set[tuple[str, int]], chunk_prompts: int
) -> list[tuple[int, list[Prompt]]]:
    """(k, prompts) work units for every (prompt, k) not yet done, chunk_prompts at a time."""
    chunks = []
    for k in ks:
        todo = [p for p in pool if (p.prompt_id, k) not in done]
        chunks.extend((k, todo[i : i + chunk_prompts]) for i in range(0, len(todo), chunk_prompts))
    return chunks


ChunkRunner = Callable[[list[tuple[int, list[Prompt]]]], Iterator[tuple[list[dict], list[dict]]]]


def run_profile(
    cfg: ProfileConfig,
    ks: list[int],
    run_chunks: ChunkRunner,
    progress: bool = True,
) -> list[dict[str, Any]]:
    """Profile every (prompt, k) not yet finished, appending chunks as they complete; merge at the end.

    `run_chunks` maps work units to (rows, samples) in any order (one engine
    in this process, or several Ray workers).
    """
    from tqdm.auto import tqdm

    store = ProfileStore(cfg.run_dir, cfg.name)
    store.check_meta(profile_meta(cfg))
    pool = profile_pool(cfg)
    done = store.finished()
    chunks = plan_chunks(pool, ks, done, cfg.chunk_prompts)
    total = len(pool) * len(ks)
    bar = tqdm(total=total, initial=total - sum(len(c) for _, c in chunks), unit="prompt",
               desc=f"profile {cfg.name}", disable=not progress)
    try:
        for rows, samples in run_chunks(chunks):
            store.append(rows, samples if cfg.save_samples else None)
            bar.update(len(rows))
    finally:
        bar.close()
    return store.merge()


def profile_meta(cfg: ProfileConfig) -> dict[str, Any]:
    """The settings that change what a row means; a resumed job must match them.

    Prompts and loop counts are not among them: a job can grow (more seeds,
    environments or k) and profiles only the (prompt, k) pairs it lacks.
    """
    keep = ("samples_per_prompt", "max_tokens", "temperature", "top_p")
    meta: dict[str, Any] = {k: getattr(cfg, k) for k in keep}
    meta["checkpoint"] = str(Path(cfg.checkpoint).resolve())
    meta["dtype"] = cfg.engine.dtype
    meta["cache_mode"] = cfg.engine.cache_mode
    return meta


def summarize(rows: Iterable[dict[str, Any]]) -> str:
    """A text table: per (env, k) the prompt count, mean pass rate and a pass-rate histogram.

    Buckets: exactly 0, (0, .25), [.25, .5), [.5, .75), [.75, 1), exactly 1 (the ends
    matter most to the curriculum: unsolved and always-solved prompts).
    """
    labels = ["=0", "<.25", "<.5", "<.75", "<1", "=1"]
    groups: dict[tuple[str, int], list[float]] = defaultdict(list)
    for r in rows:
        groups[(r["env"], int(r["k"]))].append(float(r["pass_rate"]))
    env_w = max([len("env")] + [len(e) for e, _ in groups])
    head = f"{'env'.ljust(env_w)}  {'k':>2}  {'prompts':>7}  {'mean':>5}  " + "  ".join(f"{x:>5}" for x in labels)
    lines = [head, "-" * len(head)]
    for (env, k), rates in sorted(groups.items()):
        hist = [0] * len(labels)
        for p in rates:
            hist[0 if p <= 0 else 5 if p >= 1 else 1 + min(int(p * 4), 3)] += 1
        mean = sum(rates) / len(rates)
        lines.append(f"{env.ljust(env_w)}  {k:>2}  {len(rates):>7}  {mean:5.3f}  " + "  ".join(f"{h:>5}" for h in hist))
    return "\n".join(lines)


def check_table_columns(rows: list[dict[str, Any]]) -> None:
    """Every row carries PROFILE_COLUMNS (the curriculum and the dashboard rely on them)."""
    for r in rows:
        missing = [c for c in PROFILE_COLUMNS if c not in r]
        if missing:
            raise ValueError(f"profile row for {r.get('prompt_id')!r} lacks {missing}")
