"""Thread and core budgets come from an actor's Ray CPUs, never from the caller's OMP_NUM_THREADS."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from elr_rl.rl.cores import CoreBudget, core_budget, layout_offsets, visible_cores


def test_threads_follow_reserved_cpus_and_slots_are_disjoint():
    assert core_budget(1.0, [0, 1], offset=0) == CoreBudget(threads=1, cpus=(0,))
    assert core_budget(1.0, [0, 1], offset=1) == CoreBudget(threads=1, cpus=(1,))
    assert core_budget(2.0, [4, 5, 6, 7], offset=2) == CoreBudget(threads=2, cpus=(6, 7))
    assert core_budget(0.5, [0, 1], offset=0).threads == 1  # a fractional CPU still runs one thread
    assert core_budget(8, [0, 1], offset=0) == CoreBudget(threads=2, cpus=(0, 1))  # never more than the node has
    # More CPUs reserved than the node has: no pinning rather than stacking actors on one core.
    assert core_budget(1, [0, 1], offset=2) == CoreBudget(threads=1, cpus=())
    with pytest.raises(ValueError, match="num_cpus"):
        core_budget(-1, [0])


def test_layout_puts_learner_then_rollout_then_scoring():
    lay = layout_offsets(learner_ranks=2, cpus_per_rank=2, workers=3, cpus_per_worker=1)
    assert lay == {"learner": [0, 2], "rollout": [4, 5, 6], "scoring": [7]}
    # The default RL layout on a 2-core machine: learner on core 0, the rollout worker on core 1.
    small = layout_offsets(1, 1.0, 1, 1.0)
    budgets = [core_budget(1.0, [0, 1], o) for o in small["learner"] + small["rollout"]]
    assert [b.cpus for b in budgets] == [(0,), (1,)]


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(visible_cores()) < 2, reason="needs 2 cores")
@pytest.mark.parametrize("caller_threads", ["2", None])
def test_applied_budget_ignores_the_callers_omp_num_threads(caller_threads):
    code = ("import json, os, torch; from elr_rl.rl.cores import apply_core_budget; b = apply_core_budget(1.0, 1); "
            "print(json.dumps([torch.get_num_threads(), sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS']]))")
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if caller_threads:
        env["OMP_NUM_THREADS"] = caller_threads
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    threads, cpus, omp = json.loads(out.stdout.strip().splitlines()[-1])
    assert (threads, omp) == (1, "1")
    assert cpus == [sorted(visible_cores())[1]]


def test_a_lender_marks_its_cores_free_only_while_nobody_holds_them(tmp_path):
    from elr_rl.rl.cores import CoreLender
    from elr_rl.rl.engine_gate import EngineGate

    lender = CoreLender(tmp_path / "lend", [3, 5], holders=1)  # starting up: busy
    assert sorted(os.listdir(tmp_path / "lend")) == []
    lender.__exit__(None, None, None)
    assert sorted(os.listdir(tmp_path / "lend")) == ["3", "5"]
    gate = EngineGate(max_shared=2, lender=lender)  # the rollout worker's: its engine in use = its cores busy
    with gate.request(1, lambda k: None):
        assert os.listdir(tmp_path / "lend") == []
        with gate.request(1, lambda k: None):  # a second request: one holder for the gate
            pass
        with lender:  # a second holder (nested work) keeps them busy after the first lets go
            pass
        assert os.listdir(tmp_path / "lend") == []
    assert sorted(os.listdir(tmp_path / "lend")) == ["3", "5"]
    with gate.exclusive():
        assert os.listdir(tmp_path / "lend") == []
    assert sorted(os.listdir(tmp_path / "lend")) == ["3", "5"]
    lender.close()
    assert not (tmp_path / "lend").exists()  # the last lender removes the run's directory


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(visible_cores()) < 2, reason="needs 2 cores")
def test_a_borrower_widens_onto_free_cores_and_narrows_when_they_are_taken(tmp_path):
    """In a child process (affinity is per process): inside `borrowing()`, threads and affinity follow the
    lent cores, forward and backward through the hooked modules; outside it (between steps) the own core.
    While borrowing, the compute thread stays on its own core and OpenMP's other threads go to the lent
    one (left to the scheduler, a woken worker thread often ran on the waker's core)."""
    own, lent = sorted(visible_cores())[:2]
    code = f"""
import json, os, threading, torch
from pathlib import Path
from elr_rl.rl.cores import CoreBorrower, CoreLender, apply_core_budget
apply_core_budget(1.0, {own})
def place():  # (threads, this thread's cores, the cores of every other thread of the process)
    me = threading.get_native_id()
    others = sorted({{c for t in os.listdir("/proc/self/task") if int(t) != me
                      for c in os.sched_getaffinity(int(t))}})
    return (torch.get_num_threads(), sorted(os.sched_getaffinity(0)), others)
d = Path({str(tmp_path / 'lend')!r})
lender = CoreLender(d, [{lent}], holders=1)
b = CoreBorrower(d, ({own},))
lender.__exit__(None, None, None)
b.adjust()
outside = place()  # not borrowing: stays on its own core
with lender:
    pass
seen = []
class Probe(torch.nn.Linear):
    pass
net = torch.nn.Sequential(Probe(4, 4), torch.nn.Tanh(), Probe(4, 4))
b.install(net, (Probe,))
def record(_m, _args):
    seen.append(place())
for m in net:
    if isinstance(m, Probe):
        m.register_forward_pre_hook(record)
with b.borrowing():
    with lender:
        net(torch.randn(2, 4, requires_grad=True)).sum().backward()  # busy: own core only
    y = net(torch.randn(2, 4, requires_grad=True)).sum()  # free: widened at the first sublayer
    with lender:
        y.backward()  # taken back before the backward pass: the gradient hook narrows again
        after_backward = place()
    net(torch.randn(2, 4))
    before_give_back = place()
print(json.dumps([outside, seen, after_backward, before_give_back, place(), b.take_stats()]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    outside, seen, after_backward, before_give_back, given_back, borrowed_s = json.loads(
        out.stdout.strip().splitlines()[-1])
    assert outside[:2] == [1, [own]]
    assert [x[:2] for x in seen[:2]] == [[1, [own]], [1, [own]]]
    assert seen[2:4] == [[2, [own], [lent]], [2, [own], [lent]]]  # OpenMP's second thread on the lent core
    assert after_backward == [1, [own], [own]]
    assert before_give_back == [2, [own], [lent]]
    assert given_back == [1, [own], [own]]
    assert borrowed_s > 0


@pytest.mark.skipif(not hasattr(os, "sched_setaffinity"), reason="needs sched_setaffinity")
def test_a_borrower_ignores_a_lent_core_it_may_not_run_on(tmp_path):
    """A mark for a core outside this process's cpuset (a stray file, another container's layout) is not an
    error: the learner stays on its own core and never asks for that core again."""
    own = sorted(visible_cores())[0]
    code = f"""
import json, os, torch
from pathlib import Path
from elr_rl.rl.cores import CoreBorrower, apply_core_budget
apply_core_budget(1.0, {own})
d = Path({str(tmp_path / 'lend')!r}); d.mkdir()
(d / "100000").touch()  # no such core
b = CoreBorrower(d, ({own},))
with b.borrowing():
    first = b.adjust()
    second = b.free()
print(json.dumps([first, second, torch.get_num_threads(), sorted(os.sched_getaffinity(0))]))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    first, second, threads, cpus = json.loads(out.stdout.strip().splitlines()[-1])
    assert (first, second, threads, cpus) == ([], [], 1, [own])
