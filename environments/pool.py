"""Score completions in a pool of worker processes.

Why processes and not threads: a verifier that hangs in a busy loop cannot be
stopped from a thread. Each worker scores one job at a time; a job's clock
starts when a worker takes it (not when it is queued), and a job past its
environment's `score_timeout_s` gets its worker killed (its sandboxed children
die with it, through PR_SET_PDEATHSIG) and a replacement started. A verifier
that raises or hangs gives `Score.zero(error=...)`; the other jobs go on.
At most `Environment.max_concurrency` jobs of one environment run at once.

    with ScoringPool(num_workers=2) as pool:
        fut = pool.submit("arith_multidigit", task, completion)   # Future[Score]
        for job_id, score in pool.imap_unordered(jobs):            # as they finish
            ...
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

from environments.base import Score, Task
from environments.registry import load_env_class

log = logging.getLogger(__name__)
_SECONDS_PER_CHAR = 1e-6


def _worker_main(conn: Connection) -> None:
    """Worker loop: receive (job_id, env_name, task, completion), send (job_id, Score)."""
    import os

    # One compute thread per scoring worker (and its sandboxed children), whatever the caller's
    # OMP_NUM_THREADS: verifiers are small, and the cores belong to the learner and rollout workers.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[var] = "1"
    from environments.registry import get_env

    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg is None:
            return
        job_id, env_name, task, completion = msg
        try:
            score = get_env(env_name).score(task, completion)
            if not isinstance(score, Score):
                score = Score.zero(error=f"verifier returned {type(score).__name__}, not Score")
        except Exception as exc:  # the verifier's bug (or untrusted input it mishandled): reward 0, logged
            tb = traceback.format_exc(limit=3)
            score = Score.zero(error=f"verifier raised {type(exc).__name__}: {exc}\n{tb}")
        conn.send((job_id, score))


@dataclass
class _Job:
    job_id: int
    env: str
    task: Task
    completion: str
    timeout_s: float
    future: Future


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
        if self._closed:
            raise RuntimeError("ScoringPool is closed")
        if env_name not in self._limits:
            cls = load_env_class(env_name)  # unknown names fail here, in the caller
            self._limits[env_name] = (max(1, int(cls.max_concurrency)), float(cls.score_timeout_s))
        # The bound grows linearly with the input (scorers are linear-time): 1 s more per MB of text.
        timeout_s = timeout_s or self._limits[env_name][1] + len(completion) * _SECONDS_PER_CHAR
        job = _Job(next(self._ids), env_name, task, completion, timeout_s, Future())
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
            _resolve(job, Score.zero(error="pool closed before the job finished"))
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

    def _next_job(self) -> _Job | None:
        """First queued job whose environment is under its concurrency limit."""
        with self._lock:
            for i, job in enumerate(self._pending):
                if self._running[job.env] < self._limits[job.env][0]:
                    del self._pending[i]
                    return job
        return None

    def _start_jobs(self) -> None:
        for w in self._workers:
            if w.job is not None:
                continue
            job = self._next_job()
            if job is None:
                return
            if not job.future.running() and not job.future.set_running_or_notify_cancel():
                continue  # cancelled while queued
            try:
                w.conn.send((job.job_id, job.env, job.task, job.completion))
            except OSError:  # the idle worker died: requeue the job, replace the worker
                with self._lock:
                    self._pending.appendleft(job)
                self._replace(w, "scoring worker died")
                continue
            w.job, w.deadline = job, time.monotonic() + job.timeout_s  # the clock starts now
            self._running[job.env] += 1

    def _finish(self, w: _Worker, score: Score) -> None:
        job, w.job, w.deadline = w.job, None, float("inf")
        if job is not None:
            self._running[job.env] -= 1
            _resolve(job, score)

    def _replace(self, w: _Worker, error: str) -> None:
        w.kill()
        self._workers[self._workers.index(w)] = _Worker(self._ctx)
        self.restarts += 1
        self._finish(w, Score.zero(error=error))

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
                _resolve(job, Score.zero(error=f"scoring pool failed: {exc!r}"))

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
                    _, score = w.conn.recv()
                    self._finish(w, score)
                except (EOFError, OSError):
                    self._replace(w, "scoring worker died")
            now = time.monotonic()
            for w in list(self._workers):
                if w.job is not None and now >= w.deadline:
                    self._replace(w, f"verifier timed out after {w.job.timeout_s:g}s")


def _resolve(job: _Job, score: Score) -> None:
    if not job.future.done():
        if job.future.running() or job.future.set_running_or_notify_cancel():
            job.future.set_result(score)
