"""The driver's queued learner steps (`async_.queued_steps`), without Ray: when a step may be submitted
behind the running one, and that a queued step counts staleness from the weights it will update."""

from __future__ import annotations

import collections
import types

import pytest

from curriculum.routing import Assignment
from elr_rl.rl.config import RLConfig
from elr_rl.rl.driver import Driver, queued_start
from elr_rl.rl.fleet import RolloutFleet
from elr_rl.rl.messages import FinishReason, Group, Sample, StepResult


def _driver(mode: str = "async", queued_steps: int = 1, save_interval: int = 1000, step: int = 0,
            running: int = 0) -> Driver:
    cfg = RLConfig(model_path="unused")
    cfg.async_.mode, cfg.async_.queued_steps, cfg.run.save_interval = mode, queued_steps, save_interval
    cfg.algo.groups_per_step = 2
    cfg.algo.dynamic_sampling = False
    d = Driver(cfg)
    d.step = d.version = step
    d.trainings = collections.deque(types.SimpleNamespace(parity=None) for _ in range(running))
    return d


@pytest.mark.parametrize("kw, stop_at, expected", [
    ({"running": 0}, 10, True),  # nothing running: always
    ({"running": 1}, 10, True),  # async: one step may wait behind the running one
    ({"running": 2}, 10, False),  # ... but only queued_steps of them
    ({"running": 2, "queued_steps": 2}, 10, True),
    ({"running": 1, "queued_steps": 0}, 10, False),  # off: each step waits for the previous one to end
    ({"running": 1, "mode": "sync"}, 10, False),  # sync mode never overlaps anything with training
    ({"running": 1, "step": 9}, 10, False),  # the running step is the run's last
    ({"running": 1, "step": 8}, 10, True),
    ({"running": 1, "step": 3, "save_interval": 4}, 10, False),  # the running step is saved: its weights, not later ones
    ({"running": 2, "step": 2, "save_interval": 4, "queued_steps": 3}, 10, False),  # a queued one is saved
    ({"running": 1, "step": 4, "save_interval": 4}, 10, True),
])
def test_a_step_is_queued_only_where_nothing_reads_the_weights_in_between(kw, stop_at, expected):
    assert _driver(**kw)._may_submit(stop_at) is expected


class _Learner:
    def __init__(self) -> None:
        self.calls = []

    def train_step(self, microbatches, ks, lr, parity):
        self.calls.append((microbatches, ks, lr, parity))
        return ["ref"]


def _group(i: int, version: int) -> Group:
    samples = [Sample([5, 6], [7, 8], [1, 1], [-0.5, -0.25], FinishReason.STOP, text="x", reward=r)
               for r in (1.0, 0.0)]
    return Group(Assignment(f"p{i}", "even_odd", i, 1, 1, q=0.5, score=0.5, batch=0, epoch=0), samples, version)


def test_a_queued_step_counts_staleness_from_the_weights_it_will_update():
    """Learner at version 5 running the step to 6; a step queued behind it updates 6, so at max_staleness
    1 a group sampled at 4 is stale for it (though fresh for the running one) and 5 is the oldest it takes."""
    d = _driver(running=1, step=5)
    d.cfg.curriculum.loop_counts = [1]
    d.depth = lambda k: k
    d.learner = _Learner()
    d.fleet = RolloutFleet(d.cfg, "unused", d.version)
    for i, version in enumerate([4, 5, 4, 5, 5]):
        d.buffer.add(_group(i, version))
    training = d._start_training()
    assert [g.prompt_id for g in training.info.groups] == ["p1", "p3"]
    assert training.info.staleness == [1, 1] and training.info.queued
    assert d.buffer.dropped_stale == 2 and [g.prompt_id for g in d.buffer.groups] == ["p4"]
    # the parity check's sequences ride with the step: rank 0 scores them with the weights it publishes
    seqs, k = training.parity
    assert k == 1 and seqs == [[5, 6, 7, 8], [5, 6, 7, 8]] and d.learner.calls[0][3] == training.parity
    # with nothing running, the same buffer state trains on the learner's own version
    d2 = _driver(step=5)
    d2.cfg.curriculum.loop_counts, d2.depth, d2.learner, d2.fleet = [1], d.depth, _Learner(), d.fleet
    for i, version in enumerate([4, 5]):
        d2.buffer.add(_group(i, version))
    t2 = d2._start_training()
    assert [g.prompt_id for g in t2.info.groups] == ["p0", "p1"] and t2.info.staleness == [1, 0]
    assert not t2.info.queued


def test_the_learner_scores_spot_check_sequences_for_steps_not_queued_behind_one_that_carries_them():
    """Rank 0 scores the parity sequences with its new weights for every step submitted behind none that
    carries them: every step in sync mode, every other one while steps queue. Behind a step that carries
    them its check would still be in flight as this step ended, and this step's scoring thrown away.
    A check in flight now does not matter: it is answered long before this step ends."""
    def submit(running_parity: list, in_flight: bool):
        d = _driver(running=len(running_parity), step=5)
        d.trainings = collections.deque(types.SimpleNamespace(parity=p) for p in running_parity)
        d.cfg.curriculum.loop_counts = [1]
        d.depth = lambda k: k
        d.learner = _Learner()
        d.fleet = RolloutFleet(d.cfg, "unused", d.version)
        if in_flight:
            d.fleet._parity = (5, [[0.0]], "ref")
        for i in range(2):
            d.buffer.add(_group(i, 5))
        training = d._start_training()
        assert d.learner.calls[0][3] == training.parity
        return training.parity

    assert submit([], in_flight=False) == ([[5, 6, 7, 8], [5, 6, 7, 8]], 1)
    assert submit([None], in_flight=False) is not None  # the running step carries none
    assert submit([], in_flight=True) == ([[5, 6, 7, 8], [5, 6, 7, 8]], 1)
    assert submit([None], in_flight=True) is not None
    assert submit([([[1, 2]], 1)], in_flight=False) is None


def test_a_check_due_while_one_is_in_flight_is_counted_not_started():
    """One check at a time at worker 0 (its threads: a generate, one parity call, a control call); the one
    skipped is counted in summary.json's parity_checks, as are those never compared."""
    fleet = RolloutFleet(RLConfig(model_path="unused"), "unused", 3)
    fleet._parity = (3, [[0.0]], "ref")
    fleet.start_parity_check(([[1, 2]], 1), [[-0.5]])
    assert fleet._parity == (3, [[0.0]], "ref")
    fleet.start_parity_check(None, None)  # a step that carried none: nothing to count
    assert fleet.parity_summary() == {"compared": 0, "worker_busy": 1, "newer_weights": 0, "worker_died": 0,
                                      "worker_error": 0, "unfinished": 1, "worst_abs_diff": None}


def test_collected_checks_are_compared_only_for_the_version_the_learner_scored(ray_cluster):
    """collect_parity against real object refs: a worker answer for the published version is compared (the
    worker's scores cover the whole sequence, the learner's its tail); one with newer weights is counted,
    not compared; an answer not there yet stays in flight."""
    import ray

    fleet = RolloutFleet(RLConfig(model_path="unused"), "unused", 3)
    fleet._parity = (3, [[-0.5, -0.25]], ray.put((3, [[-9.0, -0.5, -0.2]])))
    assert fleet.collect_parity(timeout=10) == pytest.approx(0.05)
    fleet._parity = (4, [[-0.5]], ray.put((5, [[-3.0]])))  # the worker loaded version 5 first
    assert fleet.collect_parity(timeout=10) is None and fleet._parity is None

    @ray.remote
    def later():
        import time
        time.sleep(30)
        return 6, [[0.0]]

    pending = later.remote()
    fleet._parity = (6, [[0.0]], pending)
    assert fleet.collect_parity() is None and fleet._parity is not None  # not answered: still in flight
    assert fleet.parity_summary() == {"compared": 1, "worker_busy": 0, "newer_weights": 1, "worker_died": 0,
                                      "worker_error": 0, "unfinished": 1, "worst_abs_diff": pytest.approx(0.05)}
    ray.cancel(pending, force=True)

    @ray.remote
    def out_of_memory():
        raise MemoryError("prompt logprobs of an 8,192-token sequence")

    fleet._parity = (7, [[0.0]], out_of_memory.remote())  # the worker's call failed: counted, the run goes on
    assert fleet.collect_parity(timeout=30) is None and fleet._parity is None
    assert fleet.parity_summary()["worker_error"] == 1


def _result(ended_unix):
    return StepResult([0.0], 1.0, [], 0.0, ended_unix=ended_unix)


def test_a_queued_step_is_timed_from_when_the_ranks_returned_the_one_ahead():
    """The driver notices a finished step late (busy collecting rollouts); the queued step began on the ranks
    when the first of them returned, so the driver's view of it starts there (a CI run once had the learner's
    own compute time exceed the driver's view of the step, by that lag)."""
    now, now_unix = 1000.0, 5_000.0
    results = [_result(now_unix - 0.8), _result(now_unix - 0.3)]  # ranks returned 0.8 and 0.3 s ago
    assert queued_start(990.0, results, now, now_unix) == pytest.approx(999.2)
    # never before the queued step was submitted
    assert queued_start(999.5, results, now, now_unix) == 999.5
    # a rank's clock ahead of the driver's (another node): no negative lag
    assert queued_start(990.0, [_result(now_unix + 2.0)], now, now_unix) == now
    # results without an end time (an older rank): from when the driver noticed, as before
    assert queued_start(990.0, [_result(None)], now, now_unix) == now
