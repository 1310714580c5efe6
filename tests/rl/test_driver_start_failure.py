"""A run whose start fails part-way, without Ray: the user sees the error that stopped it, and what had
started is shut down."""

from __future__ import annotations

import pytest

from elr_rl.rl.config import RLConfig
from elr_rl.rl.driver import Driver


class _Scheduler:
    queue = [object(), object()]

    def in_flight(self) -> int:
        return 1


def _raise(exc: Exception):
    def call() -> None:
        raise exc
    return call


def test_a_start_that_fails_before_the_scorer_raises_its_own_error_and_shuts_down(tmp_path, monkeypatch):
    cfg = RLConfig(model_path="unused")
    cfg.run.output_dir = str(tmp_path / "run")
    d = Driver(cfg)
    shut = []

    def start_then_fail() -> None:  # as _start does: the scheduler exists, then the scoring pool fails to start
        d.scheduler = _Scheduler()
        raise RuntimeError("scoring pool failed to start")

    monkeypatch.setattr(d, "_start", start_then_fail)
    monkeypatch.setattr(d, "_shutdown", lambda: shut.append(True))
    with pytest.raises(RuntimeError, match="scoring pool failed to start"):
        d.run()
    assert shut == [True]
    assert d._summary()["pending_groups"] == 3  # the scheduler's queue and in-flight work, no scorer yet


def test_the_summary_still_shuts_down_when_it_fails(tmp_path, monkeypatch):
    d = Driver(RLConfig(model_path="unused"))
    shut = []
    monkeypatch.setattr(d, "_start", _raise(RuntimeError("start failed")))
    monkeypatch.setattr(d, "_summary", _raise(OSError("disk full")))
    monkeypatch.setattr(d, "_shutdown", lambda: shut.append(True))
    with pytest.raises(OSError, match="disk full"):
        d.run()
    assert shut == [True]


def test_a_run_folder_some_actor_cannot_see_is_refused_by_name(tmp_path):
    """Checkpoints are written by learner ranks and read by restarted workers: an actor on a node without
    the run folder (not shared storage) stops the start with the field to change, and leaves no marker."""
    import os

    from elr_rl.train.rank import check_shared_folder

    run = tmp_path / "run"
    here = lambda path: [os.path.exists(path)]  # noqa: E731 - an actor on the launcher's node
    with pytest.raises(ValueError, match=r"run\.output_dir.*not visible from rollout worker 1"):
        check_shared_folder(run, {"learner rank": here, "rollout worker": lambda path: here(path) + [False]})
    assert list(run.iterdir()) == []
    check_shared_folder(run, {"learner rank": here, "rollout worker": here})  # every actor sees it: go on
    assert list(run.iterdir()) == []
