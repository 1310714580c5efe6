"""Where profiling chunks run: one engine in this process, or several engines as Ray workers.

Each runner maps (k, prompts) work units to (rows, samples) as they finish.
Heavy imports (vLLM, Ray) happen inside the functions that need them.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, Iterator

from elr_rl.profile.profiler import (
    ChunkRunner,
    Completion,
    EpisodeFn,
    GenerateFn,
    ProfileConfig,
    ScoreFn,
    env_scorer,
    local_episode,
    run_chunk,
)
from curriculum.routing import Prompt
from elr_rl.text import TextCodec

# Builds a GenerateFn (and a close() for it) inside the process that will use it.
GenerateFactory = Callable[[ProfileConfig], tuple[GenerateFn, Callable[[], None]]]


def load_envs(entries: list[Any]) -> dict[str, Any]:
    """name -> environment instance of `envs` entries (names, dataset environments), through the registry."""
    from environments.registry import get_env, resolve_envs

    return {name: get_env(name) for name in resolve_envs(entries)}


def check_profilable(envs: dict[str, Any], difficulties: list[int]) -> None:
    """Refuse difficulties an environment does not have, before any engine starts."""
    for env in envs.values():
        if hasattr(env, "prompt_keys"):  # a dataset environment: its rows carry their own difficulties
            continue
        for d in difficulties:
            env.check_difficulty(d)


def make_scorer(cfg: ProfileConfig, envs: dict[str, Any]) -> tuple[ScoreFn, EpisodeFn, Callable[[], None]]:
    """Scoring and multi-turn episodes in process (scoring_workers=0), or in a ScoringPool whose
    timeouts are enforced: (score, episode, close)."""
    if cfg.scoring_workers <= 0:
        return env_scorer(envs), local_episode(envs), lambda: None
    from environments.pool import ScoringPool

    pool = ScoringPool(num_workers=cfg.scoring_workers)

    def score(tasks: list[Any], texts: list[str]) -> list[Any]:
        return pool.score_many([(t.env, t, text) for t, text in zip(tasks, texts)])

    return score, lambda task: pool.episode(task.env, task), pool.close


def max_context(cfg: ProfileConfig) -> int:
    """Longest context a later episode turn can be sampled from: max_model_len - max_tokens."""
    return cfg.engine.max_model_len - cfg.max_tokens


def local_runner(
    generate: GenerateFn, envs: dict[str, Any], n: int, codec: TextCodec, score: ScoreFn | None = None,
    context: int | None = None, episode: EpisodeFn | None = None,
) -> ChunkRunner:
    """Run chunks one after another with one generate function in this process."""
    score = score or env_scorer(envs)

    def run(chunks: list[tuple[int, list[Prompt]]]) -> Iterator[tuple[list[dict], list[dict]]]:
        for k, prompts in chunks:
            yield run_chunk(generate, score, envs, prompts, k, n, codec, context, episode)

    return run


class ProfileWorker:
    """One engine plus the environments' scorers, as a Ray actor (`ray.remote(ProfileWorker)`)."""

    def __init__(self, cfg: ProfileConfig, factory: GenerateFactory) -> None:
        self.envs = load_envs(cfg.envs)
        self.score, self.episode, self._close_scorer = make_scorer(cfg, self.envs)
        self.generate, self._close = factory(cfg)
        self.n = cfg.samples_per_prompt
        self.context = max_context(cfg)
        self.codec = TextCodec.load(cfg.checkpoint, cfg.chat)

    def run(self, k: int, prompts: list[Prompt]) -> tuple[list[dict], list[dict]]:
        return run_chunk(self.generate, self.score, self.envs, prompts, k, self.n, self.codec, self.context,
                         self.episode)

    def close(self) -> None:
        self._close()
        self._close_scorer()


def ray_runner(cfg: ProfileConfig, factory: GenerateFactory) -> tuple[ChunkRunner, Callable[[], None]]:
    """cfg.num_engines ProfileWorker actors; chunks go to whichever worker is free.

    Returns the runner and a shutdown function that closes the engines, kills
    the actors, and stops Ray if this function started it (a Ray cluster that
    was already running, e.g. the RL job's, is left running).
    """
    import ray
    from ray.util import ActorPool

    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(address="local", include_dashboard=False, configure_logging=False)
    actor_cls = ray.remote(ProfileWorker).options(num_cpus=cfg.engine_cpus)
    # Each engine its own sampling seed, so two engines never draw the same random stream.
    workers = [actor_cls.remote(replace(cfg, seed=cfg.seed + i), factory) for i in range(cfg.num_engines)]

    def run(chunks: list[tuple[int, list[Prompt]]]) -> Iterator[tuple[list[dict], list[dict]]]:
        pool = ActorPool(workers)
        yield from pool.map_unordered(lambda w, chunk: w.run.remote(*chunk), chunks)

    def shutdown() -> None:
        for w in workers:
            try:
                ray.get(w.close.remote(), timeout=60)
            except Exception:  # a worker that already died has nothing left to close
                pass
            ray.kill(w)
        if started_ray:
            ray.shutdown()

    return run, shutdown


class EngineGenerate:
    """GenerateFn over elr_rl.rollout.engine.RolloutEngine: one engine, k switched between chunks."""

    def __init__(self, cfg: ProfileConfig) -> None:
        from elr_rl.rollout.engine import EngineOptions, RolloutEngine

        e = cfg.engine
        options = EngineOptions(device=e.device, max_model_len=e.max_model_len, max_num_seqs=e.max_num_seqs,
                                gpu_memory_utilization=e.gpu_memory_utilization,
                                enforce_eager=True)  # eager: set_k works on the live engine
        self.engine = RolloutEngine(cfg.checkpoint, cache_mode=e.cache_mode, dtype=e.dtype, seed=cfg.seed,
                                    options=options)
        self.cfg = cfg
        self.stop_token_ids = TextCodec.load(cfg.checkpoint, cfg.chat).stop_token_ids

    def __call__(self, contexts: list[list[int]], k: int, n: int) -> list[list[Completion]]:
        if k != self.engine.k:
            self.engine.set_k(k)
        c = self.cfg
        groups = self.engine.generate(contexts, n=n, max_tokens=c.max_tokens, temperature=c.temperature,
                                      top_p=c.top_p, stop_token_ids=self.stop_token_ids)
        return [[Completion(list(x.token_ids), str(x.finish_reason)) for x in g.completions] for g in groups]

    def close(self) -> None:
        self.engine.shutdown()


def rollout_engine_factory(cfg: ProfileConfig) -> tuple[GenerateFn, Callable[[], None]]:
    """A GenerateFn over the project's vLLM rollout engine, and its shutdown."""
    gen = EngineGenerate(cfg)
    return gen, gen.close
