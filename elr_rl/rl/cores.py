"""Thread and core budgets of the RL actors, from their Ray resources (never the caller's environment).

Each actor reserves `num_cpus` in Ray; it runs that many compute threads (at least one), and
on a machine with enough cores the actors are pinned to disjoint cores in a fixed layout:

    learner ranks  [0, W * c_rank)  then rollout workers  [.., + N * c_worker)  then the scoring pool

A user's `OMP_NUM_THREADS=2` on a 2-core machine used to give the learner two threads that
fought the rollout worker for both cores (async 0.59x sync); now each actor gets its own.

Lending (`learner.borrow_idle_cores`): a pinned rollout worker marks its cores free while it has
no engine call (a file per core in a node-local directory, `CoreLender`); a learner rank on the
same node widens its threads onto them between sublayers and gives them back at the next sublayer
after the worker starts work again (`CoreBorrower`). Only cores of this run's own idle actors are
borrowed; the price is that the learner's thread count, and so its float summation order, then
depends on timing.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections.abc import Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

CORE_OFFSET_ENV = "ELR_CORE_OFFSET"  # set by the driver in each actor's runtime env
LEND_DIR_ENV = "ELR_LEND_DIR"  # set by the driver when the learner may borrow idle rollout cores


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


def lend_dir() -> Path | None:
    """This actor's node-local lending directory (None: lending is off)."""
    value = os.environ.get(LEND_DIR_ENV)
    return Path(value) if value else None


def run_lend_dir(output_dir: str) -> Path:
    """The lending directory of the run the calling driver process runs into `output_dir` (in /dev/shm on
    each node that has it): the same for the run's learner and workers, another for any other run."""
    import hashlib
    import tempfile

    base = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    tag = hashlib.sha1(str(Path(output_dir).resolve()).encode()).hexdigest()[:12]
    return base / f"elr-rl-lend-{os.getpid()}-{tag}"


def lend_env(borrow: bool, output_dir: str) -> dict[str, str]:
    """The env var that turns lending on in the run's actors (nothing when it is off)."""
    return {LEND_DIR_ENV: str(run_lend_dir(output_dir))} if borrow else {}


class CoreLender:
    """An actor's pinned cores, marked free to borrow while it is idle: a file per core, present while idle.

    `with lender:` wraps the actor's work (the rollout worker's `EngineGate` does it); nested or
    concurrent holders count, so the cores are marked free only when the last one lets go.
    """

    def __init__(self, directory: Path, cpus: Sequence[int], holders: int = 0) -> None:
        """`holders=1`: start busy (what a killed predecessor on these cores left marked free is taken back);
        the first `__exit__` lends them."""
        self.directory, self.cpus = directory, tuple(cpus)
        self._lock = threading.Lock()
        self._holders = holders
        directory.mkdir(parents=True, exist_ok=True)
        self._mark(idle=holders == 0)

    def _mark(self, idle: bool) -> None:
        for c in self.cpus:
            path = self.directory / str(c)
            if idle:
                path.touch()
            else:
                path.unlink(missing_ok=True)

    def __enter__(self) -> CoreLender:
        with self._lock:
            self._holders += 1
            if self._holders == 1:
                self._mark(idle=False)
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                self._mark(idle=True)

    def close(self) -> None:
        """Take the cores back for good (the actor is shutting down)."""
        with self._lock:
            self._holders += 1
            self._mark(idle=False)
        try:
            self.directory.rmdir()  # the last lender on the node removes the run's directory
        except OSError:
            pass


class CoreBorrower:
    """A pinned learner rank's view of the idle cores lent on its node; `adjust` widens or narrows its
    affinity and threads to its own cores plus the ones free right now. Call it from the compute thread
    (OpenMP's thread count is per thread): between sublayers, forward and backward (`install`). One
    borrower per node: two would stack their threads on the same lent core."""

    def __init__(self, directory: Path, own: Sequence[int]) -> None:
        self.directory, self.own = directory, tuple(own)
        self.borrowed: tuple[int, ...] = ()
        self.borrowed_core_s = 0.0  # core-seconds run on borrowed cores (`take_stats`)
        self._since = time.perf_counter()
        self._lending = False  # only inside `borrowing()`
        self._refused: set[int] = set()  # lent cores outside this process's cpuset (the kernel said no)

    def free(self) -> tuple[int, ...]:
        """The cores this run's actors on this node lend right now (the directory is the run's, on this node)."""
        if not self._lending:
            return ()
        try:
            names = os.listdir(self.directory)
        except FileNotFoundError:  # the run is ending
            return ()
        return tuple(sorted(int(n) for n in names
                            if n.isdigit() and int(n) not in self.own and int(n) not in self._refused))

    def adjust(self) -> tuple[int, ...]:
        free = self.free()
        if free != self.borrowed:
            import torch

            now = time.perf_counter()
            self.borrowed_core_s += len(self.borrowed) * (now - self._since)
            self._since = now
            try:  # asked for all at once: what the kernel grants says which lent cores this process may use
                os.sched_setaffinity(0, self.own + free)
            except OSError:
                os.sched_setaffinity(0, self.own)
            # a core this process may not run on (another cpuset, no such core) is dropped by the kernel
            # or refused: never ask for it again, and never run more threads than cores
            allowed = os.sched_getaffinity(0)
            self._refused.update(c for c in free if c not in allowed)
            free = tuple(c for c in free if c in allowed)
            torch.set_num_threads(len(self.own) + len(free))
            if free:  # start OpenMP's extra threads now, so that they are there to be placed
                torch.empty(2 * 65536 * (len(self.own) + len(free))).fill_(0.0)
            self._place_threads(free)
            self.borrowed = free
        return free

    def _place_threads(self, free: tuple[int, ...]) -> None:
        """Borrowing: this (the compute) thread on the first own core, every other thread of the process
        (OpenMP's workers among them) on the rest of the own cores and the lent ones. Left to the
        scheduler, OpenMP's workers are woken on the waking thread's core, and a sampled run found the
        extra worker on the learner's own core for 40% of the time it borrowed; not borrowing: all on
        the own cores."""
        me = threading.get_native_id()
        mine = {self.own[0]} if free else set(self.own)
        rest = (set(self.own[1:]) | set(free)) if free else set(self.own)
        for name in os.listdir("/proc/self/task"):
            tid = int(name)
            try:
                os.sched_setaffinity(tid, mine if tid == me else rest)
            except OSError:  # the thread ended meanwhile
                pass

    @contextmanager
    def borrowing(self):
        """Borrow within this block (a learner step's compute); back on the own cores after it, so that
        nothing run between steps (scoring, weight gathering) sits on a lent core."""
        self._lending = True
        try:
            yield self
        finally:
            self._lending = False
            self.adjust()

    def take_stats(self) -> float:
        """Core-seconds on borrowed cores since the last call."""
        now = time.perf_counter()
        total = self.borrowed_core_s + len(self.borrowed) * (now - self._since)
        self.borrowed_core_s, self._since = 0.0, now
        return total

    def _before_backward(self, _grad) -> None:  # a tensor hook: returning None keeps the gradient as is
        self.adjust()

    def install(self, model, layer_types: tuple[type, ...]) -> list:
        """Call `adjust` before each `layer_types` module runs forward and before its gradient flows back."""
        import torch

        def pre(_module, _args):
            self.adjust()

        def post(_module, _args, output):
            if isinstance(output, torch.Tensor) and output.requires_grad:
                output.register_hook(self._before_backward)

        handles = []
        for m in model.modules():
            if isinstance(m, layer_types):
                handles += [m.register_forward_pre_hook(pre), m.register_forward_hook(post)]
        return handles


def borrower_for(budget: CoreBudget) -> CoreBorrower | None:
    """A borrower when lending is on and this actor is pinned; else None."""
    directory = lend_dir()
    if directory is None or not budget.cpus or not hasattr(os, "sched_setaffinity"):
        return None
    return CoreBorrower(directory, budget.cpus)


def lender_for(budget: CoreBudget, holders: int = 0) -> CoreLender | None:
    """A lender of this actor's pinned cores when lending is on; else None."""
    directory = lend_dir()
    if directory is None or not budget.cpus:
        return None
    return CoreLender(directory, budget.cpus, holders)
