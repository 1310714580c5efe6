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

The actor is threaded (`max_concurrency` calls at once). Up to
`rollout.requests_per_worker` generate calls share the engine (`EngineGate`):
a request at the running loop count joins the batch, its rows taking the slots
that the first request's finished rows free, so the engine decodes a full batch
instead of each request's thinning tail. New weights can arrive meanwhile:
`update_weights` only stages them, no request joins while they wait, and the
engine loads them once it drains (at once when it is idle), so each request is
sampled by one policy version. The learner never waits for a worker's
in-flight generation.
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

WEIGHTS_FILE_PREFIX = "elr-rl-worker-"  # + pid-worker_id.safetensors: staged weights, alive only while loaded
STALE_WEIGHTS_AGE_S = 600.0  # a load takes seconds; an older file of a dead pid is a killed worker's


def max_concurrency(requests_per_worker: int) -> int:
    """The actor's threads: its generate calls, a parity logprob call waiting for the engine, a control call."""
    return requests_per_worker + 2


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
        from elr_rl.rl.cores import actor_core_budget, lender_for
        from elr_rl.rl.engine_gate import EngineGate
        from elr_rl.rollout.engine import EngineOptions, RolloutEngine

        self.worker_id, self.cfg, self.version = worker_id, cfg, version
        self.cores = actor_core_budget()  # threads and cores from this actor's Ray CPUs (the engine inherits them)
        # learner.borrow_idle_cores: the worker's cores are lent while it has no engine call (busy until started)
        self._lender = lender_for(self.cores, holders=1)
        self.codec = TextCodec.load(model_path, cfg.chat)
        options = EngineOptions(device=cfg.device, max_model_len=cfg.max_model_len,
                                max_num_seqs=max(8, cfg.group_size * cfg.prompts_per_request),
                                cpu_threads=self.cores.threads, gpu_memory_utilization=cfg.gpu_memory_utilization,
                                cpu_attention=cfg.cpu_attention, share_prompt_tail=cfg.share_prompt_tail,
                                huge_pages=cfg.huge_pages)
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
        self.gate = EngineGate(cfg.requests_per_worker, self._lender)  # requests share the engine, or one call
        self._pending: tuple[bytes, int] | None = None  # staged weights and their policy version
        self._pending_lock = threading.Lock()
        self._load_s = 0.0  # seconds spent loading weights since the last generate reply
        self._busy_reported = 0.0  # of the gate's busy seconds, those already in a reply
        # lock order: _reply_lock, then the gate's; the gate's, then _pending_lock (a request's prepare loads
        # staged weights while it holds the gate)
        self._reply_lock = threading.Lock()
        self._episode_pool = None  # a ScoringPool for multi-turn episodes, started when the first one comes
        if self._lender is not None:
            self._lender.__exit__(None, None, None)  # started: lend the cores until the first engine call

    # ------------------------------------------------------------------ control
    def ping(self) -> int:
        return self.version

    def in_flight(self) -> int:
        """Prompts the engine is generating now (all requests together)."""
        return self.engine.in_flight()

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
        with self.gate.exclusive(wait=False) as idle:
            if idle:
                self._load_pending()
        return idle  # else requests are running: the weights load when the engine drains

    def _weights_wait(self) -> bool:
        with self._pending_lock:
            return self._pending is not None

    def _prepare(self, k: int) -> None:
        """The engine is idle and about to serve requests at k: newest weights, loop count k."""
        self._load_pending()
        self.set_k(k)

    def _load_pending(self) -> None:
        """Load staged weights in place (caller holds the engine alone)."""
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
        with self._pending_lock:
            self._load_s += time.perf_counter() - t0

    def logprobs(self, sequences: list[list[int]], k: int) -> tuple[int, list[list[float]]]:
        """The engine's prompt logprobs of whole sequences, with the policy version that scored them."""
        with self.gate.exclusive():
            self._prepare(k)
            return self.version, self.engine.prompt_logprobs(sequences)

    def validate(self, tasks: list, k: int, max_tokens: int) -> list[dict[str, Any]]:
        """One greedy completion per task (all of one environment) at loop count k, with the newest weights
        (held-out validation, elr_rl/rl/validation.py): `[{"text", "tokens", "finish_reason", "score"}]` in
        order; "score" is set for a multi-turn environment, whose episodes are played and scored here."""
        from environments.registry import get_env

        env = get_env(tasks[0].env) if tasks else None
        with self.gate.exclusive():
            self._prepare(k)

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
        held, release = threading.Event(), threading.Event()

        def hold() -> None:  # the engine, once running requests finish, until it is shut down
            with self.gate.exclusive():
                held.set()
                release.wait()

        threading.Thread(target=hold, daemon=True).start()
        held.wait(30)  # running requests get at most 30 s to finish
        try:
            self.engine.shutdown()
            self.weights_path.unlink(missing_ok=True)
            if self._episode_pool is not None:
                self._episode_pool.close()
            if self._lender is not None:
                self._lender.close()
        finally:
            release.set()

    # ---------------------------------------------------------------- generation
    def generate(self, assignments: list[Assignment]) -> GenerateReply:
        """One group of G samples per assignment; the assignments whose prompt does not fit the
        engine's context come back in `skipped` (not sampled)."""
        skipped: list[Assignment] = []
        joined: list[bool] = []
        groups = self._generate(assignments, skipped, joined)
        with self._reply_lock:  # what this reply adds to the worker's busy time: overlapping requests count once
            busy = self.gate.busy_s()
            busy, self._busy_reported = busy - self._busy_reported, busy
            with self._pending_lock:
                load_s, self._load_s = self._load_s, 0.0
        return GenerateReply(groups, skipped, busy, load_s, joined=any(joined))

    def _generate(self, assignments: list[Assignment], skipped: list[Assignment], joined: list[bool]) -> list[Group]:
        from environments.registry import get_env

        groups: list[Group] = []
        room = self.cfg.max_model_len - self.cfg.max_new_tokens
        by_k: dict[int, list[Assignment]] = {}
        for a in assignments:
            by_k.setdefault(a.k, []).append(a)
        for k, batch in sorted(by_k.items()):
            envs = [get_env(a.env) for a in batch]
            tasks = [env.generate(a.seed, a.difficulty) for env, a in zip(envs, batch)]
            prompts = [self.codec.prompt_ids(t.prompt, system=t.system) for t in tasks]
            fits = [len(p) <= room for p in prompts]
            skipped += [a for a, ok in zip(batch, fits) if not ok]
            batch, envs, tasks, prompts = (
                [x for x, ok in zip(xs, fits) if ok] for xs in (batch, envs, tasks, prompts))
            if not batch:
                continue
            # weights that arrived meanwhile load before an idle engine admits this; each group is tagged
            # with the version that sampled it
            with self.gate.request(k, self._prepare, may_join=lambda: not self._weights_wait()) as shared:
                joined.append(shared)
                version = self.version
                outs = self._sample(prompts, n=self.cfg.group_size)
                for a, env, task, prompt, completions in zip(batch, envs, tasks, prompts, outs):
                    samples = [self._to_sample(prompt, c) for c in completions]
                    if env.multi_turn:  # played and scored here, turn by turn, in this worker's scoring pool
                        self._run_episodes(env, task, samples, completions)
                    groups.append(Group(a, samples, version, self.worker_id, task=task, scored=env.multi_turn))
        return groups

    def _sample(self, prompts: list[list[int]], n: int):
        """n completions per prompt (token ids, sampled-token logprobs, finish reason), in the running batch
        shared with the worker's other requests (the caller holds a `gate.request`)."""
        c = self.cfg
        ticket = self.gate.submit(lambda: self.engine.submit(
            prompts, n=n, max_tokens=c.max_new_tokens, temperature=c.temperature, top_p=c.top_p,
            stop_token_ids=self.codec.stop_token_ids))
        self.gate.drive(lambda: ticket.done, self.engine.step)
        return [g.completions for g in self.engine.collect(ticket)]

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
