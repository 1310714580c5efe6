"""The scheduler: the queue of curriculum assignments and the generate requests in flight.

It hands prompts to rollout workers with room for a request (one loop count per
request, so a worker runs one batched vLLM generate), keeps async mode far enough ahead of the
learner and no further (more would only go stale), keeps sync mode to exactly
what the next step needs, and hands back finished requests as they come.

A worker holds up to `rollout.requests_per_worker` requests; those at one loop count
share its engine's batch (`EngineGate`). So a worker's next request is at the loop
count of the one it is running, where the queue has prompts there; a request with
none running is at the next loop count of an elevator's sweep (`sweep_loop_count`),
so the workers' depths change gradually.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any, Callable

from curriculum.routing import Assignment
from elr_rl.rl.config import RLConfig
from elr_rl.rl.messages import AsyncMode, GenerateReply
from elr_rl.rl.samples import sweep_loop_count, take_one_loop_count
from elr_rl.rl.stats import StepWindow


class Scheduler:
    def __init__(self, cfg: RLConfig, next_batch: Callable[[], list[Assignment]], metrics: Any, ledger: Counter,
                 window: StepWindow) -> None:
        """`next_batch`: the curriculum's next batch of assignments (a call to the curriculum service)."""
        self.cfg, self.next_batch, self.metrics, self.ledger, self.window = cfg, next_batch, metrics, ledger, window
        self.queue: deque[Assignment] = deque()  # assignments waiting for a worker
        self.inflight: dict[Any, tuple[int, list[Assignment]]] = {}  # request ref -> (worker index, assignments)
        self.last_k: int | None = None  # the loop count of the last request, and the sweep's direction
        self.rising = True

    def in_flight(self) -> int:
        """Prompt groups being generated."""
        return sum(len(work) for _, work in self.inflight.values())

    def fill(self, workers: list[Any], *, learner_busy: bool, downstream: int, step: int) -> None:
        """Hand prompts to idle workers. `downstream`: groups generated but not yet trained on
        (being scored or buffered). Sync mode sends only what the next step needs, never while training."""
        c = self.cfg
        need = c.algo.groups_per_step
        sync = c.async_.mode == AsyncMode.SYNC
        if sync and learner_busy:
            return
        limit = need if sync else async_lookahead(need, c.async_.max_staleness, learner_busy)
        # each round gives every worker at most one request, the idle ones first: the second request a worker
        # holds is for its engine's batch to stay full, the first for an idle worker to work at all
        for round_ in range(c.rollout.requests_per_worker):
            for i, worker in enumerate(workers):
                pending = downstream + self.in_flight()
                if pending >= limit:
                    return
                held = [work for j, work in self.inflight.values() if j == i]
                if len(held) != round_:
                    continue
                running = next((work[0].k for work in held if work), None)
                n = min(c.rollout.prompts_per_request, limit - pending)
                work = self._next_request(n, step, running)
                self.inflight[worker.generate.remote(work)] = (i, work)

    def _next_request(self, n: int, step: int, k: int | None = None) -> list[Assignment]:
        """Up to n queued assignments (oldest first) at loop count k where any are queued, else at the
        sweep's next loop count; the queue holds enough curriculum batches for every loop count to fill a
        request."""
        while len(self.queue) < n * len(self.cfg.curriculum.loop_counts):
            batch = self.next_batch()
            self.queue.extend(batch)
            self.ledger["scheduled"] += len(batch)
            # labelled with the step whose metrics row counts these prompts (curriculum/prompts_k*)
            self.metrics.log_routing(step + 1, _routing(batch))
            self.window.routed.extend(batch)
        if k is None or not any(a.k == k for a in self.queue):
            self.last_k, self.rising = sweep_loop_count({a.k for a in self.queue}, self.last_k, self.rising)
            k = self.last_k
        work, rest = take_one_loop_count(self.queue, n, k)
        self.queue = deque(rest)
        return work

    def collect(self, timeout: float, wake: list[Any] = ()) -> list[tuple[int, list[Assignment], GenerateReply | Exception]]:
        """Finished requests as (worker index, assignments, reply, or the error of a dead worker).

        Waits at most `timeout`, returning early when a request or one of the `wake` refs
        (the learner's step) finishes."""
        import ray
        from ray.exceptions import RayActorError

        waitables = list(self.inflight)
        if wake:
            waitables += ray.wait(list(wake), num_returns=len(wake), timeout=0)[1]
        if not waitables:
            time.sleep(timeout)
            return []
        ray.wait(waitables, num_returns=1, timeout=timeout)
        if not self.inflight:
            return []
        ready, _ = ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=0)
        out = []
        for ref in ready:
            i, work = self.inflight.pop(ref)
            try:
                out.append((i, work, ray.get(ref)))
            except RayActorError as exc:
                out.append((i, work, exc))
        return merge_deaths(out)

    def requeue_worker(self, i: int, work: list[Assignment]) -> int:
        """A worker died: its assignments (and any other request it held) go back to the front of the queue."""
        for ref, (j, other) in list(self.inflight.items()):
            if j == i:
                work = work + other
                del self.inflight[ref]
        self.queue.extendleft(reversed(work))
        self.ledger["requeued"] += len(work)
        return len(work)


def merge_deaths(results: list[tuple[int, list[Assignment], Any]]) -> list[tuple[int, list[Assignment], Any]]:
    """One entry per dead worker: a worker holding several requests fails them all at once, and its
    restart must happen once (the requests' assignments go back to the queue together, in order)."""
    out: list = []
    dead: dict[int, int] = {}  # worker index -> its entry in out
    for i, work, reply in results:
        if isinstance(reply, Exception) and i in dead:
            j = dead[i]
            out[j] = (i, out[j][1] + work, out[j][2])
            continue
        if isinstance(reply, Exception):
            dead[i] = len(out)
        out.append((i, work, reply))
    return out


def async_lookahead(groups_per_step: int, max_staleness: int, learner_busy: bool) -> int:
    """Groups async mode keeps pending (generating, scoring or buffered): as many as can still be trained.

    The learner holds version V; workers generate at V. While it trains the step to V + 1, what is
    generated now is trained at the steps starting from V + 1 .. V + S (staleness <= S): S steps' worth.
    While it waits for data, the next step starts from V itself: S + 1 steps' worth. Anything beyond
    is generated only to be dropped as stale (it once was S + 2 steps' worth: at S = 1, two of every
    three batches generated while the learner was the slower side went stale).
    """
    return groups_per_step * (max_staleness + (0 if learner_busy else 1))


def _routing(batch) -> dict[int, dict[str, list[float]]]:
    from elr_rl.metrics import routing_from_assignments

    return routing_from_assignments(batch)
