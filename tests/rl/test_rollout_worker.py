"""The rollout worker's requests share its engine: a real Ray actor and its real vLLM engine.

Two requests at one loop count decode in one batch; weights that arrive meanwhile wait for the engine to
drain (each request is sampled by one policy version), and a request at another k waits for it too."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from curriculum.routing import Assignment
from tests.rl.helpers import make_config

pytestmark = pytest.mark.slow


def _work(first: int, n: int, k: int) -> list[Assignment]:
    return [Assignment(f"p{i}", "even_odd", i, 1, k, 0.5, 0.5, 0, 0) for i in range(first, first + n)]


@pytest.fixture(scope="module")
def worker(toy_checkpoint, ray_cluster, tmp_path_factory):
    import ray

    from elr_rl.rl.fleet import RolloutFleet

    cfg = make_config(toy_checkpoint, tmp_path_factory.mktemp("run"), rollout={"requests_per_worker": 2})
    fleet = RolloutFleet(cfg, weights_from=str(toy_checkpoint), version=0)
    fleet.start()
    (handle,) = fleet.workers
    yield handle
    ray.get(handle.shutdown.remote())
    ray.kill(handle)


def _versions(reply) -> set[int]:
    return {g.version for g in reply.groups}


def test_two_requests_at_one_loop_count_share_the_engine(worker):
    import ray

    start = time.perf_counter()
    a, b = worker.generate.remote(_work(0, 4, 1)), worker.generate.remote(_work(4, 4, 1))
    ra, rb = ray.get([a, b])
    wall = time.perf_counter() - start
    assert [g.assignment.prompt_id for g in ra.groups] == [f"p{i}" for i in range(4)]
    assert [g.assignment.prompt_id for g in rb.groups] == [f"p{i}" for i in range(4, 8)]
    assert all(len(g.samples) == 8 for g in ra.groups + rb.groups)
    assert ra.joined != rb.joined  # one request's rows went into the batch the other was running
    assert _versions(ra) == _versions(rb) == {0}
    # overlapping requests count once in the worker's busy time: together no more than the wall time
    assert 0 < ra.busy_s + rb.busy_s <= wall


def test_weights_that_arrive_mid_request_wait_for_the_engine_to_drain(worker, toy_checkpoint):
    import ray

    weights = next(Path(toy_checkpoint).glob("*.safetensors")).read_bytes()
    for attempt, version in enumerate((1, 2, 3)):
        long = worker.generate.remote(_work(100, 16, 1))  # 128 rows against 32 slots: several rounds
        deadline = time.monotonic() + 60
        while ray.get(worker.in_flight.remote()) == 0:
            assert time.monotonic() < deadline, "the request never started"
            time.sleep(0.01)
        loaded_at_once = ray.get(worker.update_weights.remote(weights, version))
        later = worker.generate.remote(_work(200, 2, 1))  # the same k, but new weights wait
        deeper = worker.generate.remote(_work(300, 2, 2))
        r_long, r_later, r_deeper = ray.get([long, later, deeper])
        if loaded_at_once:  # the long request finished before the weights came: try again
            continue
        assert _versions(r_long) == {version - 1}  # sampled by the weights it started with, throughout
        assert _versions(r_later) == _versions(r_deeper) == {version}
        assert not r_later.joined  # it did not join the old weights' batch
        assert {g.k for g in r_deeper.groups} == {2} and {g.k for g in r_long.groups} == {1}
        assert ray.get(worker.in_flight.remote()) == 0
        return
    pytest.fail("the long request always finished before the weights arrived")
