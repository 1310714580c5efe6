"""The depth demo's report: pass@1 ranges over seeds and the goal line, from made-up eval rows."""

from __future__ import annotations

from elr_rl.depth_demo import ENVS, KS, report


def _rows(curve):
    return [{"env": e, "k": k, "tasks": 256, "pass_at_1": curve(e, k), "reward": 0.0, "response_tokens": 9.0}
            for e in ENVS for k in KS]


def test_goal_needs_the_gap_on_three_environments_on_every_seed(capsys):
    deep = lambda e, k: 0.2 + 0.2 * (k - 1) if e != "ladder_nested" else 0.5  # noqa: E731
    flat = lambda e, k: 0.5  # noqa: E731
    weak_seed = lambda e, k: 0.2 + 0.2 * (k - 1) if e == "ladder_pointer" else 0.5  # noqa: E731
    results = {
        0: {"loopwise": {1: _rows(flat), 4: _rows(deep)}, "final_only": {1: _rows(flat), 4: _rows(flat)}},
        1: {"loopwise": {1: _rows(flat), 4: _rows(deep)}, "final_only": {1: _rows(flat), 4: _rows(weak_seed)}},
    }
    met = report(results, 60.0, [1, 4])
    assert met["loopwise"][4] == ["ladder_pointer", "ladder_binding", "ladder_automaton"]
    assert met["final_only"][4] == []  # one seed alone does not count
    out = capsys.readouterr().out
    assert "GOAL loopwise D=4" in out and ": MET (3" in out and "GOAL final_only D=4" in out and "NOT MET (0" in out
    assert "0.20-0.20" in out and "0.80-0.80" in out


def test_one_seed_never_meets_the_goal(capsys):
    deep = lambda e, k: 0.2 * k  # noqa: E731
    met = report({0: {"loopwise": {2: _rows(deep)}}}, 1.0, [2])
    assert len(met["loopwise"][2]) == 4
    assert "NOT MET" in capsys.readouterr().out


def test_a_failing_stage_stops_the_demo_with_its_log_tail(tmp_path):
    import pytest

    from elr_rl.depth_demo import cli

    log = tmp_path / "stage.log"
    with pytest.raises(RuntimeError, match="is not a checkpoint folder"):
        cli("eval of a missing checkpoint", ["eval", str(tmp_path / "missing")], log, threads=1)
    assert "is not a checkpoint folder" in log.read_text()
