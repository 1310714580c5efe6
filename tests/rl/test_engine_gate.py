"""The rollout worker's engine gate: which calls share the engine, in what order, and one engine step at a time.

Threads stand in for the actor's concurrent calls; a fake engine counts steps (the gate is what is tested:
tests/rl/test_rollout_worker.py runs the real worker and vLLM engine)."""

from __future__ import annotations

import threading
import time

import pytest

from elr_rl.rl.engine_gate import EngineGate


def _run(target, *args):
    t = threading.Thread(target=target, args=args, daemon=True)
    t.start()
    return t


def _until(condition, timeout=5.0):
    end = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.005)


class _Calls:
    """Records prepare(k) calls and which requests are inside the gate."""

    def __init__(self):
        self.prepared, self.inside, self.log = [], set(), []
        self.release = {}

    def request(self, gate, name, k, may_join=lambda: True):
        self.release[name] = threading.Event()

        def body():
            with gate.request(k, self.prepared.append, may_join):
                self.inside.add(name)
                self.log.append(name)
                self.release[name].wait(5)
                self.inside.discard(name)

        return _run(body)


def test_requests_at_one_loop_count_share_the_engine_and_another_k_waits_for_it_to_drain():
    gate, calls = EngineGate(max_shared=2), _Calls()
    calls.request(gate, "a", 1)
    _until(lambda: "a" in calls.inside)
    calls.request(gate, "b", 1)
    _until(lambda: "b" in calls.inside)  # joined the running batch: prepared once, for a
    assert calls.prepared == [1] and gate.joined == 1 and gate.k() == 1
    calls.request(gate, "c", 2)
    time.sleep(0.05)
    calls.request(gate, "d", 1)  # at the running k, but after c: first come, first served
    time.sleep(0.1)
    assert calls.inside == {"a", "b"}
    calls.release["a"].set()
    time.sleep(0.1)
    assert calls.inside == {"b"}  # c waits for the engine to drain; d waits behind c
    calls.release["b"].set()
    _until(lambda: "c" in calls.inside)
    assert calls.prepared == [1, 2] and gate.k() == 2
    time.sleep(0.05)
    assert "d" not in calls.inside
    calls.release["c"].set()
    _until(lambda: "d" in calls.inside)
    calls.release["d"].set()
    assert calls.log == ["a", "b", "c", "d"] and calls.prepared == [1, 2, 1]


def test_no_request_joins_while_new_weights_wait_and_at_most_max_shared_hold_it():
    gate, calls = EngineGate(max_shared=2), _Calls()
    weights_wait = threading.Event()
    calls.request(gate, "a", 3, lambda: not weights_wait.is_set())
    _until(lambda: "a" in calls.inside)
    weights_wait.set()
    calls.request(gate, "b", 3, lambda: not weights_wait.is_set())
    time.sleep(0.1)
    assert calls.inside == {"a"}  # b would be sampled by the old weights: it waits for the drain
    calls.release["a"].set()
    _until(lambda: "b" in calls.inside)
    assert calls.prepared == [3, 3]  # the drained engine prepared again (loads the weights) for b
    weights_wait.clear()
    calls.request(gate, "c", 3)
    _until(lambda: "c" in calls.inside)
    calls.request(gate, "d", 3)
    time.sleep(0.1)
    assert calls.inside == {"b", "c"}  # max_shared = 2
    calls.release["b"].set()
    _until(lambda: "d" in calls.inside)
    calls.release["c"].set()
    calls.release["d"].set()


def test_exclusive_calls_wait_for_requests_and_a_non_waiting_one_gives_up():
    gate, calls = EngineGate(max_shared=2), _Calls()
    calls.request(gate, "a", 1)
    _until(lambda: "a" in calls.inside)
    with gate.exclusive(wait=False) as got:
        assert not got
    order = []

    def exclusive():
        with gate.exclusive():
            order.append("exclusive")

    t = _run(exclusive)
    time.sleep(0.05)
    calls.request(gate, "b", 1)  # after the exclusive call: it does not join a's batch ahead of it
    time.sleep(0.1)
    assert order == [] and calls.inside == {"a"}
    calls.release["a"].set()
    t.join(5)
    _until(lambda: "b" in calls.inside)
    assert order == ["exclusive"] and calls.prepared == [1, 1]
    calls.release["b"].set()
    _until(lambda: not calls.inside)
    with gate.exclusive(wait=False) as got:
        assert got


def test_a_failed_prepare_frees_the_engine_for_the_next_caller():
    gate = EngineGate(max_shared=2)

    def fail(k):
        raise RuntimeError("weights refused")

    with pytest.raises(RuntimeError):
        with gate.request(1, fail):
            pass
    with gate.exclusive(wait=False) as got:
        assert got


class _Engine:
    """Steps advance every submitted ticket by one token; a step and a submit never overlap."""

    def __init__(self):
        self.left, self.steps, self.busy = {}, 0, False

    def submit(self, name, tokens):
        assert not self.busy, "a submit ran during a step"
        self.left[name] = tokens

    def step(self):
        assert not self.busy, "two steps at once"
        self.busy = True
        time.sleep(0.002)
        for name in list(self.left):
            self.left[name] -= 1
            if self.left[name] == 0:
                del self.left[name]
        self.steps += 1
        self.busy = False


def test_requests_in_one_batch_are_stepped_together_by_one_thread_at_a_time():
    gate, engine, errors = EngineGate(max_shared=2), _Engine(), []

    def request(name, tokens):
        try:
            with gate.request(1, lambda k: None):
                gate.submit(lambda: engine.submit(name, tokens))
                gate.drive(lambda: name not in engine.left, engine.step)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [_run(request, "long", 60), _run(request, "short", 20)]
    for t in threads:
        t.join(10)
    assert not errors and not engine.left
    # stepped together: the short request's tokens rode along the long one's steps (alone: 80 steps)
    assert engine.steps <= 62


def test_busy_time_counts_overlapping_requests_once():
    gate = EngineGate(max_shared=2)
    started = time.perf_counter()
    release = threading.Event()

    def hold():
        with gate.request(1, lambda k: None):
            release.wait(5)

    threads = [_run(hold), _run(hold)]
    time.sleep(0.2)
    release.set()
    for t in threads:
        t.join(5)
    elapsed = time.perf_counter() - started
    assert 0.15 < gate.busy_s() <= elapsed


def test_a_gate_needs_room_for_one_request():
    with pytest.raises(ValueError, match="at least 1"):
        EngineGate(max_shared=0)
