"""Score completions in a pool of worker processes.

Why processes and not threads: a verifier that hangs in a busy loop cannot be
stopped from a thread. Each worker scores one job at a time; a job's clock
starts when a worker takes it (not when it is queued), and a job past its
environment's `score_timeout_s` gets its worker killed (its sandboxed children
die with it, through PR_SET_PDEATHSIG) and a replacement started. A verifier
that raises or hangs gives `Score.zero(error=...)`; the other jobs go on.
At most `Environment.max_concurrency` jobs of one environment run at once.

Multi-turn environments take the same path: an episode is a session whose
`step` and `finish` calls are jobs with the same clock and error rule (a step
that raises or times out ends the episode with reward 0). Its state lives in
the worker process that took its first step, and its later jobs go to that
worker; if that worker is replaced (another job timed out on it), the episode
is rebuilt on another one by replaying its turns (`reset`, then `step` per turn).

    with ScoringPool(num_workers=2) as pool:
        fut = pool.submit("arith_multidigit", task, completion)   # Future[Score]
        for job_id, score in pool.imap_unordered(jobs):            # as they finish
            ...
        ep = pool.episode("shell_fs_tasks", task)                   # an EpisodeSession
        ep.step(turn).result()                                      # StepResult (error set if it failed)
        ep.finish().result()                                        # Score
"""

from __future__ import annotations

import collections
import itertools
import logging
import multiprocessing as mp
import threading
import time
import traceback
from collections.abc import Iterable, Iterator
from concurrent.futures import Future, as_completed
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait

from environments.base import Score, StepResult, Task
from environments.registry import load_env_class

log = logging.getLogger(__name__)
_SECONDS_PER_CHAR = 1e-6


def _worker_main(conn: Connection) -> None:
    """Worker loop: receive (job_id, kind, env_name, task, payload), send (job_id, result).

    kind "score": payload is the completion, the result a Score. "step" / "finish": payload is
    (session id, turns already applied, the new turn or None); the result a StepResult / Score.
    """
    import os

    # One compute thread per scoring worker (and its sandboxed children), whatever the caller's
    # OMP_NUM_THREADS: verifiers are small, and the cores belong to the learner and rollout workers.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    sessions: dict[int, list] = {}  # session id -> [state, turns applied]
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        job_id, kind, env_name, task, payload = msg
        try:
            result = _run_job(sessions, kind, env_name, task, payload)
        except Exception as exc:  # the verifier's bug (or untrusted input it mishandled): reward 0, logged
            tb = traceback.format_exc(limit=3)
            result = _failed(kind, f"verifier raised {type(exc).__name__}: {exc}\n{tb}")
            if kind != "score":
                _drop_session(sessions, env_name, task, payload[0])
        conn.send((job_id, result))


def _run_job(sessions: dict[int, list], kind: str, env_name: str, task: Task, payload) -> Score | StepResult:
    from environments.registry import get_env

    env = get_env(env_name)
    if kind == "score":
        score = env.score(task, payload)
        return score if isinstance(score, Score) else Score.zero(error=f"verifier returned {type(score).__name__}, not Score")
    sid, history, turn = payload
    entry = sessions.get(sid)
    if entry is None or entry[1] != len(history):  # first job here, or rebuilt after its worker was replaced
        _drop_session(sessions, env_name, task, sid)
        entry = sessions[sid] = [env.reset(task), 0]
        for past in history:
            env.step(task, entry[0], past)
        entry[1] = len(history)
    if kind == "step":
        result = env.step(task, entry[0], turn)
        entry[1] += 1
        return result if isinstance(result, StepResult) else _failed("step", f"step returned {type(result).__name__}")
    del sessions[sid]
    score = env.score_episode(task, entry[0])
    return score if isinstance(score, Score) else Score.zero(error=f"verifier returned {type(score).__name__}, not Score")


def _drop_session(sessions: dict[int, list], env_name: str, task: Task, sid: int) -> None:
    """Forget an episode's state, letting the environment release what it holds (its sandbox)."""
    from environments.registry import get_env

    entry = sessions.pop(sid, None)
    if entry is not None:
        try:
            get_env(env_name).score_episode(task, entry[0])
        except Exception:  # noqa: BLE001 - releasing a broken episode must not fail the next job
            pass


def _failed(kind: str, error: str) -> Score | StepResult:
    """What a failed job resolves to: reward 0 for a score, an episode-ending step for a step."""
    if kind == "step":
        return StepResult(f"[environment error: {error.splitlines()[0]}]", True, error)
    return Score.zero(error=error)


class EpisodeSession:
    """One multi-turn episode run in the pool: `step(turn)` then `finish()`, each a Future.

    A step that failed (raised, timed out) ends the episode: `finish()` then gives reward 0
    with that error, and the state is released on the worker."""

    def __init__(self, pool: "ScoringPool", env_name: str, task: Task, sid: int) -> None:
        self.pool, self.env, self.task, self.sid = pool, env_name, task, sid
        self.turns: list[str] = []  # turns the environment has applied
        self.worker: _Worker | None = None  # where the state lives (set when a job starts)
        self.error: str | None = None

    def step(self, turn: str) -> Future:
        """Future[StepResult]; resolved after the session has recorded the turn."""
        if self.error is not None:
            return _done(StepResult("The episode is over.", True, self.error))
        out: Future = Future()

        def done(f: Future) -> None:
            result = f.result()
            if result.error:
                self.error = result.error  # its state is gone (released, or its worker replaced)
            else:
                self.turns.append(turn)
            out.set_result(result)

        self.pool._submit("step", self.env, self.task, (self.sid, list(self.turns), turn), session=self).add_done_callback(done)
        return out

    def finish(self) -> Future:
        """Future[Score] of the episode; its state is released on the worker."""
        if self.error is not None:
            return _done(Score.zero(error=self.error))
        return self.pool._submit("finish", self.env, self.task, (self.sid, list(self.turns), None), session=self)


class LocalEpisode:
    """An episode stepped in this process (no timeout): `EpisodeSession`'s interface, for
    in-process scoring (profile's scoring_workers=0) and tests. Errors raise."""

    def __init__(self, env, task: Task) -> None:
        self.env, self.task, self.state = env, task, env.reset(task)

    def step(self, turn: str) -> Future:
        return _done(self.env.step(self.task, self.state, turn))

    def finish(self) -> Future:
        return _done(self.env.score_episode(self.task, self.state))


def _done(value) -> Future:
    fut: Future = Future()
    fut.set_result(value)
    return fut


@dataclass
class _Job:
    job_id: int
    kind: str  # "score", "step" or "finish"
    env: str
    task: Task
    payload: object  # the completion, or (session id, turns applied, turn)
    timeout_s: float
    future: Future
    session: EpisodeSession | None = None


class _Worker:
    def __init__(self, ctx: mp.context.BaseContext) -> None:
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True)
        self.proc.start()
        child.close()
        self.job: _Job | None = None
        self.deadline = float("inf")

    def kill(self) -> None:
        self.proc.kill()
        self.proc.join(timeout=5)
        self.conn.close()
        # A worker killed mid-job never ran its sandbox's cleanup: remove the job folders it made.
        from environments.sandbox import remove_leftovers

        remove_leftovers(self.proc.pid)


class ScoringPool:
    """A fixed number of scoring worker processes fed by one dispatcher thread."""

    def __init__(self, num_workers: int = 2, start_method: str = "spawn") -> None:
        if num_workers < 1:
            raise ValueError(f"num_workers must be >= 1, got {num_workers}")
        self._ctx = mp.get_context(start_method)
        self._workers = [_Worker(self._ctx) for _ in range(num_workers)]
        self._pending: collections.deque[_Job] = collections.deque()
        self._running: collections.Counter[str] = collections.Counter()
        self._limits: dict[str, tuple[int, float]] = {}  # env -> (max_concurrency, score_timeout_s)
        self._lock = threading.Lock()
        self._wake_r, self._wake_w = self._ctx.Pipe(duplex=False)
        self._wake_lock = threading.Lock()
        self._ids = itertools.count()
        self._closed = False
        self.restarts = 0  # workers replaced after a timeout or crash
        self._thread = threading.Thread(target=self._dispatch_loop, name="scoring-pool", daemon=True)
        self._thread.start()

    # -- public API -------------------------------------------------------

    def submit(self, env_name: str, task: Task, completion: str, timeout_s: float | None = None) -> Future:
        """Queue one scoring job; the Future resolves to a Score (never raises for verifier failures)."""
        return self._submit("score", env_name, task, completion, timeout_s=timeout_s)

    def episode(self, env_name: str, task: Task) -> EpisodeSession:
        """A multi-turn episode of `task`, stepped and scored by this pool's workers."""
        self._check_env(env_name)
        return EpisodeSession(self, env_name, task, next(self._ids))

    def _check_env(self, env_name: str) -> None:
        if self._closed:
            raise RuntimeError("ScoringPool is closed")
        if env_name not in self._limits:
            cls = load_env_class(env_name)  # unknown names fail here, in the caller
            self._limits[env_name] = (max(1, int(cls.max_concurrency)), float(cls.score_timeout_s))

    def _submit(self, kind: str, env_name: str, task: Task, payload: object, timeout_s: float | None = None,
                session: EpisodeSession | None = None) -> Future:
        self._check_env(env_name)
        # The bound grows linearly with the input (scorers are linear-time): 1 s more per MB of text.
        text = payload if kind == "score" else (payload[2] or "")
        timeout_s = timeout_s or self._limits[env_name][1] + len(text) * _SECONDS_PER_CHAR
        job = _Job(next(self._ids), kind, env_name, task, payload, timeout_s, Future(), session)
        with self._lock:
            self._pending.append(job)
        self._wake()
        return job.future

    def score_many(self, jobs: Iterable[tuple[str, Task, str]]) -> list[Score]:
        """Scores of (env_name, task, completion) jobs, in input order."""
        futures = [self.submit(*job) for job in jobs]
        return [f.result() for f in futures]

    def imap_unordered(self, jobs: Iterable[tuple[str, Task, str]]) -> Iterator[tuple[int, Score]]:
        """(index in `jobs`, Score) as each job finishes: a slow one never blocks the rest."""
        index = {self.submit(*job): i for i, job in enumerate(jobs)}
        for fut in as_completed(index):
            yield index[fut], fut.result()

    def close(self) -> None:
        """Stop the workers; jobs still queued resolve to Score.zero(error='pool closed')."""
        if self._closed:
            return
        self._closed = True
        self._wake()
        self._thread.join(timeout=10)
        with self._lock:
            leftover = list(self._pending) + [w.job for w in self._workers if w.job]
            self._pending.clear()
        for job in leftover:
            _resolve(job, _failed(job.kind, "pool closed before the job finished"))
        for w in self._workers:
            try:
                w.conn.send(None)
            except OSError:
                pass
        for w in self._workers:
            w.proc.join(timeout=2)
            if w.proc.is_alive():
                w.kill()

    def _wake(self) -> None:
        with self._wake_lock:  # Connection.send is not thread-safe; submit may be called from many threads
            self._wake_w.send(None)

    def __enter__(self) -> "ScoringPool":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- dispatcher thread ------------------------------------------------

    def _next_job(self, w: _Worker) -> _Job | None:
        """First queued job for worker `w` whose environment is under its concurrency limit: an
        episode's jobs go to the worker holding its state while that worker lives."""
        with self._lock:
            for i, job in enumerate(self._pending):
                home = job.session.worker if job.session is not None else None
                if home is not None and home is not w and home in self._workers:
                    continue
                if self._running[job.env] < self._limits[job.env][0]:
                    del self._pending[i]
                    return job
        return None

    def _start_jobs(self) -> None:
        for w in self._workers:
            if w.job is not None:
                continue
            job = self._next_job(w)
            if job is None:
                continue
            if not job.future.running() and not job.future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            if job.session is not None and job.session.worker is not w:
                job.timeout_s *= 1 + len(job.payload[1])  # the worker replays the episode's turns first
                job.session.worker = w
            try:
                w.conn.send((job.job_id, job.kind, job.env, job.task, job.payload))
            except OSError:  # the idle worker died: requeue the job, replace the worker
                with self._lock:
                    self._pending.appendleft(job)
                self._replace(w, "scoring worker died")
                continue
            w.job, w.deadline = job, time.monotonic() + job.timeout_s  # the clock starts now
            self._running[job.env] += 1

    def _finish(self, w: _Worker, result: Score | StepResult) -> None:
        job, w.job, w.deadline = w.job, None, float("inf")
        if job is not None:
            self._running[job.env] -= 1
            _resolve(job, result)

    def _replace(self, w: _Worker, error: str) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = _Worker(self._ctx)
        self.restarts += 1
        if w.job is not None:
            self._finish(w, _failed(w.job.kind, error))

    def _dispatch_loop(self) -> None:
        try:
            self._dispatch()
        except Exception as exc:  # a bug here must not leave callers waiting forever
            log.exception("scoring pool dispatcher failed")
            self._closed = True
            with self._lock:
                jobs = list(self._pending) + [w.job for w in self._workers if w.job]
                self._pending.clear()
            for job in jobs:
                _resolve(job, _failed(job.kind, f"scoring pool failed: {exc!r}"))

    def _dispatch(self) -> None:
        while not self._closed:
            self._start_jobs()
            now = time.monotonic()
            deadline = min(w.deadline for w in self._workers)
            ready = wait([self._wake_r, *(w.conn for w in self._workers)], timeout=max(0.0, min(deadline - now, 1.0)))
            for obj in ready:
                if obj is self._wake_r:
                    while self._wake_r.poll():
                        self._wake_r.recv()
                    continue
                w = next(w for w in self._workers if w.conn is obj)
                try:
                    _, result = w.conn.recv()
                    self._finish(w, result)
                except (EOFError, OSError):
                    self._replace(w, "scoring worker died")
            now = time.monotonic()
            for w in list(self._workers):
                if w.job is not None and now >= w.deadline:
                    self._replace(w, f"verifier timed out after {w.job.timeout_s:g}s")


def _resolve(job: _Job, result: Score | StepResult) -> None:
    if not job.future.done():
        if job.future.running() or job.future.set_running_or_notify_cancel():
            job.future.set_result(result)
