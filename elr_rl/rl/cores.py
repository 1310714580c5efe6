"""Thread and core budgets of the RL actors, from their Ray resources (never the caller's environment).

Each actor reserves `num_cpus` in Ray; it runs that many compute threads (at least one), and
on a machine with enough cores the actors are pinned to disjoint cores in a fixed layout:

    learner ranks  [0, W * c_rank)  then rollout workers  [.., + N * c_worker)  then the scoring pool

A user's `OMP_NUM_THREADS=2` on a 2-core machine used to give the learner two threads that
fought the rollout worker for both cores (async 0.59x sync); now each actor gets its own.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from dataclasses import dataclass

CORE_OFFSET_ENV = "ELR_CORE_OFFSET"  # set by the driver in each actor's runtime env


@dataclass(frozen=True)
class CoreBudget:
    """What one process may use."""

    threads: int
    """Compute threads (torch / OpenMP)."""
    cpus: tuple[int, ...]
    """Cores it is pinned to; empty when pinning would overlap other actors (cores are then shared)."""


def core_budget(num_cpus: float, visible: Sequence[int], offset: int = 0) -> CoreBudget:
    """Budget of an actor holding `num_cpus` Ray CPUs whose slot in the layout starts at `offset`.

    threads = clamp(floor(num_cpus), 1, len(visible)); cpus = visible[offset : offset + threads]
    when that slice lies inside the visible cores, else no pinning (more CPUs were reserved than
    the node has: pinning would stack actors on the same cores).
    """
    if num_cpus < 0:
        raise ValueError(f"num_cpus={num_cpus}: an actor reserves zero or more CPUs")
    if not visible:
        raise ValueError("no visible cores")
    threads = max(1, min(int(math.floor(num_cpus)), len(visible)))
    cores = sorted(visible)
    pinned = tuple(cores[offset : offset + threads]) if 0 <= offset and offset + threads <= len(cores) else ()
    return CoreBudget(threads=threads, cpus=pinned)


def layout_offsets(learner_ranks: int, cpus_per_rank: float, workers: int, cpus_per_worker: float) -> dict[str, list[int]]:
    """First core of each actor in the layout above: {"learner": [...], "rollout": [...], "scoring": [n]}."""
    rank_w = max(1, math.floor(cpus_per_rank))
    worker_w = max(1, math.floor(cpus_per_worker))
    learner = [r * rank_w for r in range(learner_ranks)]
    base = learner_ranks * rank_w
    rollout = [base + i * worker_w for i in range(workers)]
    return {"learner": learner, "rollout": rollout, "scoring": [base + workers * worker_w]}


def visible_cores() -> list[int]:
    return sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))


def apply_core_budget(num_cpus: float, offset: int) -> CoreBudget:
    """Pin this process (and the children it starts later) and size its thread pools."""
    import torch

    budget = core_budget(num_cpus, visible_cores(), offset)
    if budget.cpus and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, budget.cpus)
    os.environ["OMP_NUM_THREADS"] = str(budget.threads)  # for child processes (vLLM's engine core)
    torch.set_num_threads(budget.threads)
    return budget


def actor_core_budget() -> CoreBudget:
    """Inside a Ray actor: the budget from the CPUs Ray assigned to it and the driver's slot offset."""
    import ray

    num_cpus = float(ray.get_runtime_context().get_assigned_resources().get("CPU", 1.0))
    return apply_core_budget(num_cpus, int(os.environ.get(CORE_OFFSET_ENV, "0")))
