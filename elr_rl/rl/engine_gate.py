"""Who uses a rollout worker's vLLM engine, and when (the worker's calls run on several threads).

- Requests (`request`): up to `max_shared` at once, whose rows the engine decodes in one running batch:
  as a request's rows stop, the next request's rows take their slots, so the batch stays full instead of
  draining to a few long rows at the end of each request. Requests that share the engine run at one loop
  count and one set of weights (the engine's k is one value per batch, and each group is tagged with the
  policy version that sampled it). A request is admitted when the engine is idle (then `prepare(k)` runs
  first: staged weights are loaded, the loop count set), or when the engine runs its k, holds fewer than
  `max_shared` requests, and `may_join()` (no new weights wait: they wait for the engine to drain).
- Exclusive calls (`exclusive`): the engine idle and theirs alone (prompt logprobs, validation, loading
  weights).
- First come, first served: nobody is admitted ahead of an earlier caller still waiting (a request at
  another k waits for the engine to drain, and later ones at the running k wait behind it).
- Inside a request, prompts are added (`submit`) and the engine stepped (`drive`) by whichever thread is
  waiting; one thread steps at a time and submissions go in between steps.

The engine is held from the first admission until the last request or exclusive call leaves: that is the
worker's busy time (`busy_s`), and its cores are lent (learner.borrow_idle_cores) only while it is idle.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from contextlib import contextmanager
from typing import Any, Callable, Iterator


class EngineGate:
    def __init__(self, max_shared: int, lender: Any = None) -> None:
        """`lender`: a CoreLender (context manager: entered while the engine is held), or None."""
        if max_shared < 1:
            raise ValueError(f"max_shared={max_shared}: at least 1 request must be able to hold the engine")
        self.max_shared, self._lender = max_shared, lender
        self._cv = threading.Condition()
        self._line: deque[object] = deque()  # callers waiting to be admitted, oldest first
        self._shared = 0  # requests holding the engine
        self._exclusive = False
        self._k: int | None = None  # the loop count of the requests holding the engine
        self._driving = False  # a thread is inside the engine's step
        self._submitting = 0  # threads waiting to add prompts between steps
        self._held_since: float | None = None
        self._held_s = 0.0
        self.joined = 0  # requests admitted into a batch other requests were running

    # ------------------------------------------------------------------ admission
    @contextmanager
    def request(self, k: int, prepare: Callable[[int], None], may_join: Callable[[], bool] = lambda: True
                ) -> Iterator[bool]:
        """Hold the engine at loop count k with the requests already running there (see the module); yields
        whether this request joined a running batch."""
        with self._cv:
            self._wait_turn(lambda: not self._exclusive and (
                self._shared == 0 or (k == self._k and self._shared < self.max_shared and may_join())))
            joined = self._shared > 0
            if not joined:
                self._hold()
                try:
                    prepare(k)
                except BaseException:
                    self._release()
                    raise
                self._k = k
            else:
                self.joined += 1
            self._shared += 1
        try:
            yield joined
        finally:
            with self._cv:
                self._shared -= 1
                if self._shared == 0:
                    self._release()

    @contextmanager
    def exclusive(self, wait: bool = True) -> Iterator[bool]:
        """Hold the idle engine alone; yields whether it was got (always with `wait`; without it, only when
        the engine is idle, nobody waits and this thread gets the gate's lock at once)."""
        if wait:
            with self._cv:
                self._wait_turn(lambda: not self._exclusive and self._shared == 0)
                self._exclusive = True
                self._hold()
        else:
            if not self._cv.acquire(blocking=False):
                yield False
                return
            try:
                got = not (self._line or self._exclusive or self._shared)
                if got:
                    self._exclusive = True
                    self._hold()
            finally:
                self._cv.release()
            if not got:
                yield False
                return
        try:
            yield True
        finally:
            with self._cv:
                self._exclusive = False
                self._release()

    def _wait_turn(self, ready: Callable[[], bool]) -> None:
        me = object()
        self._line.append(me)
        try:
            self._cv.wait_for(lambda: self._line[0] is me and ready())
        finally:
            self._line.remove(me)
            self._cv.notify_all()  # the next in line may be admitted too (another request at the same k)

    def _hold(self) -> None:
        if self._held_since is None:
            self._held_since = time.perf_counter()
            if self._lender is not None:
                self._lender.__enter__()

    def _release(self) -> None:
        if self._held_since is not None:
            self._held_s += time.perf_counter() - self._held_since
            self._held_since = None
            if self._lender is not None:
                self._lender.__exit__(None, None, None)
        self._cv.notify_all()

    # ------------------------------------------------------------- inside a request
    def submit(self, add: Callable[[], Any]) -> Any:
        """Run `add` (adding prompts to the engine) between two engine steps; returns what it returns."""
        with self._cv:
            self._submitting += 1
            try:
                self._cv.wait_for(lambda: not self._driving)
                return add()
            finally:
                self._submitting -= 1
                self._cv.notify_all()

    def drive(self, done: Callable[[], bool], step: Callable[[], Any]) -> None:
        """Step the engine until `done()`: this thread steps while no other does (and nobody waits to
        submit); otherwise it waits for the steps another thread runs."""
        while True:
            with self._cv:
                self._cv.wait_for(lambda: done() or not (self._driving or self._submitting))
                if done():
                    return
                self._driving = True
            try:
                step()
            finally:
                with self._cv:
                    self._driving = False
                    self._cv.notify_all()

    # ------------------------------------------------------------------ accounting
    def busy_s(self) -> float:
        """Seconds the engine has been held so far (requests overlapping in time count once)."""
        with self._cv:
            now = time.perf_counter() - self._held_since if self._held_since is not None else 0.0
            return self._held_s + now

    def k(self) -> int | None:
        """The loop count of the requests holding the engine (None when none does)."""
        with self._cv:
            return self._k if self._shared else None
