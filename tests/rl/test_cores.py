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
