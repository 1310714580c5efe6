"""Rollout worker: a Ray actor that owns one vLLM engine and turns assignments into sample groups.

Each call carries (prompt, k) assignments from the curriculum; the worker sets
its engine's loop count per k (a live change, no restart), samples G
completions per prompt, and tags every group with the policy version it holds.
Prompts are rendered with the checkpoint's chat template and completions stop on
its stop ids (`elr_rl.text.TextCodec`). Multi-turn episodes run token-in/token-out:
environment turns are appended as template-rendered tokens (masked out of the loss),
and the model's sampled ids are never re-tokenised from decoded text. Each turn is
answered, and the finished episode scored, by the worker's own scoring pool
(environments/pool.py: the environment's timeout, reward 0 when it fails), the
path single-turn groups take in the driver. A prompt too
long for the engine's context is not sent: its assignment comes back in `skipped`.

The actor is threaded (`MAX_CONCURRENCY` calls at once) so that new weights
can arrive while a request is generating: `update_weights` only stages them,
and the engine loads them between requests (at once when it is idle). The
learner never waits for a worker's in-flight generation.
"""

from __future__ import annotations

import logging
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from curriculum.routing import Assignment
from elr_rl.rl.config import RolloutConfig
from elr_rl.rl.messages import FinishReason, GenerateReply, Group, Sample
from elr_rl.text import TextCodec

log = logging.getLogger(__name__)

MAX_CONCURRENCY = 3  # a generate call, a parity logprob call waiting for the engine, and a control call
WEIGHTS_FILE_PREFIX = "elr-rl-worker-"  # + pid-worker_id.safetensors: staged weights, alive only while loaded
STALE_WEIGHTS_AGE_S = 600.0  # a load takes seconds; an older file of a dead pid is a killed worker's


def sweep_stale_weight_files(directory: Path, min_age_s: float = STALE_WEIGHTS_AGE_S) -> list[Path]:
    """Remove the weights files of workers killed while loading them (a killed worker cannot unlink its
    file): the pid in the name is gone and the file is older than `min_age_s`. Returns what was removed."""
    removed, now = [], time.time()
    for path in directory.glob(f"{WEIGHTS_FILE_PREFIX}*-*.safetensors"):
        try:
            pid = int(path.name[len(WEIGHTS_FILE_PREFIX):].split("-", 1)[0])
            if _alive(pid) or now - path.stat().st_mtime < min_age_s:
                continue
            path.unlink()
        except (ValueError, OSError):  # not ours after all, or gone meanwhile
            continue
        removed.append(path)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: nothing is sent, only whether the process exists
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, someone else's
        return True
    return True


class RolloutWorker:
    def __init__(self, worker_id: int, model_path: str, cfg: RolloutConfig, seed: int, version: int = 0) -> None:
        from elr_rl.rl.cores import LendingLock, actor_core_budget, lender_for
        from elr_rl.rollout.engine import EngineOptions, RolloutEngine

        self.worker_id, self.cfg, self.version = worker_id, cfg, version
        self.cores = actor_core_budget()  # threads and cores from this actor's Ray CPUs (the engine inherits them)
        # learner.borrow_idle_cores: the worker's cores are lent while it has no engine call (busy until started)
        self._lender = lender_for(self.cores, holders=1)
        self.codec = TextCodec.load(model_path, cfg.chat)
        options = EngineOptions(device=cfg.device, max_model_len=cfg.max_model_len,
                                max_num_seqs=max(8, cfg.group_size * cfg.prompts_per_request),
                                cpu_threads=self.cores.threads, gpu_memory_utilization=cfg.gpu_memory_utilization)
        self.engine = RolloutEngine(
            model_path, k=1, cache_mode=cfg.cache_mode, dtype=cfg.dtype, seed=seed + 1000 * worker_id, options=options,
        )
        self.k = 1
        shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
        self.weights_path = shm / f"{WEIGHTS_FILE_PREFIX}{os.getpid()}-{worker_id}.safetensors"
        stale = sweep_stale_weight_files(shm)
        if stale:
            log.warning("removed %d weights file(s) of rollout workers killed while loading them, e.g. %s",
                        len(stale), stale[0])
        self.busy_s = 0.0
        self._engine_lock = LendingLock(self._lender)  # one engine call at a time
        self._pending: tuple[bytes, int] | None = None  # staged weights and their policy version
        self._pending_lock = threading.Lock()
        self._load_s = 0.0  # seconds spent loading weights since the last generate reply
        self._episode_pool = None  # a ScoringPool for multi-turn episodes, started when the first one comes
        if self._lender is not None:
            self._lender.__exit__(None, None, None)  # started: lend the cores until the first engine call

    # ------------------------------------------------------------------ control
    def ping(self) -> int:
        return self.version

    def pid(self) -> int:
        return os.getpid()

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def sees(self, path: str) -> bool:
        """Whether `path` exists where this worker runs (the run folder must be shared storage)."""
        return os.path.exists(path)

    def set_k(self, k: int) -> None:
        if k != self.k:
            self.engine.set_k(k)
            self.k = k

    def update_weights(self, weights: bytes, version: int) -> bool:
        """Stage the learner's weights (safetensors bytes) for the next request; load them now if idle.

        Returns whether they were loaded at once. Newer weights replace older staged ones.
        """
        with self._pending_lock:
            if self._pending is None or version >= self._pending[1]:
                self._pending = (weights, version)
        if not self._engine_lock.acquire(blocking=False):
            return False  # a request is running: it is loaded before the next one
        try:
            self._load_pending()
        finally:
            self._engine_lock.release()
        return True

    def _load_pending(self) -> None:
        """Load staged weights in place (caller holds the engine lock)."""
        with self._pending_lock:
            pending, self._pending = self._pending, None
        if pending is None:
            return
        weights, version = pending
        t0 = time.perf_counter()
        if self.engine.options.in_process:  # the engine reads the bytes in place
            self.engine.update_weights(weights)
        else:  # staged in a file the engine's process reads (and the next worker sweeps if this one dies)
            self.weights_path.write_bytes(weights)
            try:
                self.engine.update_weights(str(self.weights_path))
            finally:  # the engine holds the weights now; a worker killed later leaves nothing in /dev/shm
                self.weights_path.unlink(missing_ok=True)
        self.version = version
        self._load_s += time.perf_counter() - t0

    def logprobs(self, sequences: list[list[int]], k: int) -> tuple[int, list[list[float]]]:
        """The engine's prompt logprobs of whole sequences, with the policy version that scored them."""
        with self._engine_lock:
            self._load_pending()
            self.set_k(k)
            return self.version, self.engine.prompt_logprobs(sequences)

    def validate(self, tasks: list, k: int, max_tokens: int) -> list[dict[str, Any]]:
        """One greedy completion per task (all of one environment) at loop count k, with the newest weights
        (held-out validation, elr_rl/rl/validation.py): `[{"text", "tokens", "finish_reason", "score"}]` in
        order; "score" is set for a multi-turn environment, whose episodes are played and scored here."""
        from environments.registry import get_env

        env = get_env(tasks[0].env) if tasks else None
        with self._engine_lock:
            t0 = time.perf_counter()
            self._load_pending()
            self.set_k(k)

            def greedy(contexts: list[list[int]]) -> list:
                groups = self.engine.generate(contexts, n=1, max_tokens=max_tokens, temperature=0.0,
                                              stop_token_ids=list(self.codec.stop_token_ids))
                return [g.completions[0] for g in groups]

            ids = [self.codec.prompt_ids(t.prompt, system=t.system) for t in tasks]
            outs = greedy(ids)
            if env is not None and env.multi_turn:
                out = [self._validate_episode(env, t, p, c, greedy) for t, p, c in zip(tasks, ids, outs)]
            else:
                out = [{"text": self.codec.decode(c.token_ids), "tokens": len(c.token_ids),
                        "finish_reason": str(c.finish_reason), "score": None} for c in outs]
            self.busy_s += time.perf_counter() - t0
        return out

    def _validate_episode(self, env, task, prompt: list[int], first, greedy) -> dict[str, Any]:
        from elr_rl.rollout.episodes import play_episodes
        from environments.base import TURN_SEPARATOR

        room = self.cfg.max_model_len - self.cfg.max_new_tokens
        (ep,) = play_episodes(greedy, self.codec, [self._episodes().episode(env.name, task)], env.max_turns, prompt,
                              [first], max_context=room)
        return {"text": TURN_SEPARATOR.join(ep.turns), "tokens": ep.model_tokens, "finish_reason": ep.finish_reason,
                "score": ep.score}

    def _episodes(self):
        """This worker's scoring pool for multi-turn episodes (started on first use)."""
        from environments.pool import ScoringPool

        if self._episode_pool is None:
            self._episode_pool = ScoringPool(self.cfg.episode_workers)
        return self._episode_pool

    def shutdown(self) -> None:
        got = self._engine_lock.acquire(timeout=30)  # let a running request finish first
        try:
            self.engine.shutdown()
            self.weights_path.unlink(missing_ok=True)
            if self._episode_pool is not None:
                self._episode_pool.close()
            if self._lender is not None:
                self._lender.close()
        finally:
            if got:
                self._engine_lock.release()

    # ---------------------------------------------------------------- generation
    def generate(self, assignments: list[Assignment]) -> GenerateReply:
        """One group of G samples per assignment; the assignments whose prompt does not fit the
        engine's context come back in `skipped` (not sampled)."""
        with self._engine_lock:
            t0 = time.perf_counter()
            skipped: list[Assignment] = []
            groups = self._generate(assignments, skipped)
            busy = time.perf_counter() - t0
            self.busy_s += busy
            load_s, self._load_s = self._load_s, 0.0
        return GenerateReply(groups, skipped, busy, load_s)

    def _generate(self, assignments: list[Assignment], skipped: list[Assignment]) -> list[Group]:
        from environments.registry import get_env

        groups: list[Group] = []
        room = self.cfg.max_model_len - self.cfg.max_new_tokens
        by_k: dict[int, list[Assignment]] = {}
        for a in assignments:
            by_k.setdefault(a.k, []).append(a)
        for k, batch in sorted(by_k.items()):
            self._load_pending()  # weights that arrived meanwhile: each group is tagged with what sampled it
            version = self.version
            self.set_k(k)
            envs = [get_env(a.env) for a in batch]
            tasks = [env.generate(a.seed, a.difficulty) for env, a in zip(envs, batch)]
            prompts = [self.codec.prompt_ids(t.prompt, system=t.system) for t in tasks]
            fits = [len(p) <= room for p in prompts]
            skipped += [a for a, ok in zip(batch, fits) if not ok]
            batch, envs, tasks, prompts = (
                [x for x, ok in zip(xs, fits) if ok] for xs in (batch, envs, tasks, prompts))
            if not batch:
                continue
            outs = self._sample(prompts, n=self.cfg.group_size)
            for a, env, task, prompt, completions in zip(batch, envs, tasks, prompts, outs):
                samples = [self._to_sample(prompt, c) for c in completions]
                if env.multi_turn:  # played and scored here, turn by turn, in this worker's scoring pool
                    self._run_episodes(env, task, samples, completions)
                groups.append(Group(a, samples, version, self.worker_id, task=task, scored=env.multi_turn))
        return groups

    def _sample(self, prompts: list[list[int]], n: int):
        """n completions per prompt (token ids, sampled-token logprobs, finish reason)."""
        c = self.cfg
        groups = self.engine.generate(
            prompts, n=n, max_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p,
            stop_token_ids=self.codec.stop_token_ids,
        )
        return [g.completions for g in groups]

    def _to_sample(self, prompt: list[int], completion) -> Sample:
        ids = list(completion.token_ids)  # the stop id stays in: the policy learns to stop
        return Sample(
            prompt_ids=list(prompt), response_ids=ids, response_mask=[1] * len(ids),
            rollout_logprobs=[float(x) for x in completion.logprobs],
            finish_reason=FinishReason(completion.finish_reason), text=self.codec.decode(ids),
        )

    def _run_episodes(self, env, task, samples: list[Sample], completions) -> None:
        """Continue each sample's episode turn by turn (token in / token out), stepped and scored in
        this worker's scoring pool (the environment's timeout; an error gives reward 0)."""
        from elr_rl.rollout.episodes import play_episodes
        from environments.base import TURN_SEPARATOR
        prompt = samples[0].prompt_ids
        room = self.cfg.max_model_len - self.cfg.max_new_tokens
        sessions = [self._episodes().episode(env.name, task) for _ in samples]
        episodes = play_episodes(lambda ctxs: [g[0] for g in self._sample(ctxs, n=1)], self.codec, sessions,
                                 env.max_turns, prompt, completions, max_context=room)
        for s, ep in zip(samples, episodes):
            s.response_ids, s.response_mask, s.rollout_logprobs = ep.response_ids, ep.response_mask, ep.logprobs
            s.finish_reason, s.text = FinishReason(ep.finish_reason), TURN_SEPARATOR.join(ep.turns)
            s.reward, s.accuracy, s.error = float(ep.score.reward), bool(ep.score.accuracy), ep.score.error
