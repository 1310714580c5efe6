"""The depth demo's report: pass@1 ranges over seeds and the goal line, from made-up eval rows."""

from __future__ import annotations

from elr_rl.depth_demo import ENVS, KS, report


def _rows(curve):
    return [{"env": e, "k": k, "tasks": 256, "pass_at_1": curve(e, k), "reward": 0.0, "response_tokens": 9.0}
            for e in ENVS for k in KS]


def test_goal_needs_the_gap_on_three_environments_on_every_seed(capsys):
    deep = lambda e, k: 0.2 + 0.2 * (k - 1) if e not in ("ladder_nested", "ladder_tail") else 0.5  # noqa: E731
    flat = lambda e, k: 0.5  # noqa: E731
    weak_seed = lambda e, k: 0.2 + 0.2 * (k - 1) if e == "ladder_pointer" else 0.5  # noqa: E731
    results = {
        0: {"loopwise": {1: _rows(flat), 4: _rows(deep)}, "final_only": {1: _rows(flat), 4: _rows(flat)}},
        1: {"loopwise": {1: _rows(flat), 4: _rows(deep)}, "final_only": {1: _rows(flat), 4: _rows(weak_seed)}},
    }
    met = report(results, 60.0, [1, 4], ENVS)
    assert met["loopwise"][4] == ["ladder_pointer", "ladder_binding", "ladder_automaton"]
    assert met["final_only"][4] == []  # one seed alone does not count
    out = capsys.readouterr().out
    assert "GOAL loopwise D=4" in out and ": MET (3" in out and "GOAL final_only D=4" in out and "NOT MET (0" in out
    assert "0.20-0.20" in out and "0.80-0.80" in out
    # loopwise k = 4 (0.8) is 0.3 above the baseline's best k (0.5) on binding and automaton; on pointer seed 1's
    # baseline reaches 0.8 at k = 4 too, so pointer's gap is not above the baseline on every seed
    assert met["loopwise_above_final_only"][4] == ["ladder_binding", "ladder_automaton"]
    assert "ABOVE BASELINE D=4" in out and "2 environments (ladder_binding, ladder_automaton)" in out


def test_one_seed_never_meets_the_goal(capsys):
    deep = lambda e, k: 0.2 * k  # noqa: E731
    met = report({0: {"loopwise": {2: _rows(deep)}}}, 1.0, [2], ENVS)
    assert met["loopwise"][2] == ENVS  # every environment has the gap, on the one seed there is
    assert "NOT MET" in capsys.readouterr().out


def test_a_failing_stage_stops_the_demo_with_its_log_tail(tmp_path):
    import pytest

    from elr_rl.depth_demo import cli

    log = tmp_path / "stage.log"
    with pytest.raises(RuntimeError, match="is not a checkpoint folder"):
        cli("eval of a missing checkpoint", ["eval", str(tmp_path / "missing")], log, threads=1)
    assert "is not a checkpoint folder" in log.read_text()


def test_report_and_goal_cover_only_the_chosen_environments(capsys):
    chosen = ("ladder_binding", "ladder_automaton")
    deep = lambda e, k: 0.2 * k  # noqa: E731
    rows = [r for r in _rows(deep) if r["env"] in chosen]
    met = report({0: {"loopwise": {2: rows}}, 1: {"loopwise": {2: rows}}}, 1.0, [2], chosen)
    assert met["loopwise"][2] == list(chosen)
    out = capsys.readouterr().out
    assert "ladder_pointer" not in out and "NOT MET (2" in out  # two environments are fewer than the goal's three
    assert "ABOVE BASELINE" not in out  # no baseline model in these results


def test_seed_run_trains_on_the_chosen_environments_and_difficulties(tmp_path, monkeypatch):
    import elr_rl.depth_demo as demo

    calls = []
    monkeypatch.setattr(demo, "cli", lambda title, args, log, threads=None: calls.append(args))
    run = demo.SeedRun(tmp_path, 1, 8, [2], envs=("ladder_automaton", "ladder_nested"), max_difficulty=2)
    run.sft("loopwise", 30, [], "SFT")
    args = calls[0]
    assert "data.generators=[env:ladder_automaton,env:ladder_nested]" in args
    assert "data.max_difficulty=2" in args and "run.seed=1" in args and "run.total_steps=30" in args


def test_unknown_environment_is_refused_with_the_choices(monkeypatch):
    import pytest

    import elr_rl.depth_demo as demo

    def started(*args, **kwargs):
        raise AssertionError("the demo started a stage instead of refusing --envs")

    monkeypatch.setattr(demo, "cli", started)
    with pytest.raises(SystemExit, match="choose from the ladder environments ladder_pointer"):
        demo.main(["--envs", "ladder_automaton,even_odd"])


def test_loopwise_model_gets_the_chosen_targets_and_the_baseline_none(tmp_path, monkeypatch):
    import elr_rl.depth_demo as demo

    calls = []
    monkeypatch.setattr(demo, "cli", lambda title, args, log, threads=None: calls.append(args))
    monkeypatch.setattr(demo.SeedRun, "evaluate", lambda self, stages: {})
    monkeypatch.setattr(demo.SeedRun, "loop_probe", lambda self, ckpt, out: calls.append(["probe", ckpt]) or [])
    for targets in ("dense", "chain", "steps"):
        calls.clear()
        demo.SeedRun(tmp_path, 0, 8, [2], targets=targets).pipeline(10, rl=False, rl_steps=0)
        loopwise, final_only, probe = calls
        assert probe == ["probe", tmp_path / "loopwise" / "final"]  # the loop-wise model is probed
        assert f"loop_aux.targets={targets}" in loopwise and "loop_aux.weight=0" not in loopwise
        assert "loop_aux.weight=0" in final_only and not any(a.startswith("loop_aux.targets") for a in final_only)
        assert "data.generators=[env:ladder_binding,env:ladder_automaton,env:ladder_nested,env:ladder_tail]" in loopwise


def test_dense_demo_names_the_environments_without_dense_targets(monkeypatch, capsys):
    import elr_rl.depth_demo as demo

    class Stop(Exception):
        pass

    def pipeline(self, *args):
        raise Stop  # stop before any stage runs

    monkeypatch.setattr(demo.SeedRun, "pipeline", pipeline)
    import pytest

    with pytest.raises(Stop):
        demo.main(["--envs", "ladder_pointer,ladder_automaton", "--seeds", "0", "--jobs", "1"])
    out = capsys.readouterr().out
    assert "ladder_pointer lay out no chain" in out and "ladder_automaton lay out" not in out
    with pytest.raises(Stop):
        demo.main(["--envs", "ladder_pointer", "--seeds", "0", "--jobs", "1", "--targets", "steps"])
    assert "no dense targets" not in capsys.readouterr().out


def test_probe_report_prints_each_step_at_the_loop_that_first_has_to_know_it(capsys):
    from elr_rl.depth_demo import probe_report

    rows = [{"env": "ladder_automaton", "difficulty": 3, "target": "answer", "accuracy": [0.39, 0.7, 0.97, 0.96]},
            {"env": "ladder_automaton", "difficulty": 3, "target": "step 1", "accuracy": [1.0, 1.0, 1.0, 1.0]},
            {"env": "ladder_automaton", "difficulty": 3, "target": "step 2", "accuracy": [None, 0.99, 1.0, 1.0]},
            {"env": "ladder_automaton", "difficulty": 3, "target": "step 3", "accuracy": [None, None, 0.45, 0.5]}]
    probe_report({0: rows})
    out = capsys.readouterr().out
    assert "D=3" in out and "answer after loop 1..4: 0.39/0.70/0.97/0.96" in out
    assert "step s after loop s: 1.00 0.99 0.45" in out


def test_rl_stages_share_steps_learning_rate_and_difficulty_with_continued_sft(tmp_path, monkeypatch):
    """GRPO (alpha 0.3 and 0) and the continued-SFT baseline: the same steps, learning rate and top difficulty."""
    import json
    from pathlib import Path

    import elr_rl.depth_demo as demo

    calls = {}

    def cli(title, args, log, threads=None):
        calls[title.split(": ", 1)[1]] = args
        if args[0] == "rl":  # what `elr-rl rl` leaves behind
            out = Path(next(a.split("=", 1)[1] for a in args if a.startswith("run.output_dir=")))
            out.mkdir(parents=True)
            (out / "summary.json").write_text(json.dumps({"final_checkpoint": str(out / "ckpt")}))

    monkeypatch.setattr(demo, "cli", cli)
    run = demo.SeedRun(tmp_path, 0, 8, [3], envs=("ladder_automaton",), max_difficulty=3, loop_credit=0.5,
                       rl_prompts=512, rl_loops=(3, 4))
    out = run.rl_stages(tmp_path / "loopwise" / "final", 40)
    assert out == {"rl_curriculum": (tmp_path / "rl_curriculum" / "ckpt", tmp_path / "rl_curriculum"),
                   "rl_uniform_k": (tmp_path / "rl_uniform_k" / "ckpt", tmp_path / "rl_uniform_k"),
                   "sft_continued": (tmp_path / "sft_continued" / "final", tmp_path / "sft_continued")}
    cur, uni, sft = calls["rl_curriculum"], calls["rl_uniform_k"], calls["continued SFT"]
    assert "curriculum.alpha=0.3" in cur and "curriculum.alpha=0.0" in uni
    for rl in (cur, uni):
        assert {"run.total_steps=40", f"learner.optim.lr={demo.RL_LR}", "envs.difficulties=[3]",
                "algo.loop_credit=0.5", "envs.num_seeds=512", "curriculum.loop_counts=[3,4]"} <= set(rl)
        assert f"model_path={tmp_path / 'loopwise' / 'final'}" in rl
    assert {"run.total_steps=40", f"optim.lr={demo.RL_LR}", "schedule.warmup_steps=0", "data.min_difficulty=3",
            "data.max_difficulty=3", f"model.init_from={tmp_path / 'loopwise' / 'final'}"} <= set(sft)
    assert "difficulties=[1,2,3]" in calls["profile"]  # the profile covers every trained level


def test_rl_from_starts_at_an_earlier_runs_loopwise_model_without_sft(tmp_path, monkeypatch):
    import pytest

    import elr_rl.depth_demo as demo

    calls = []
    monkeypatch.setattr(demo, "cli", lambda title, args, log, threads=None: calls.append(args))
    monkeypatch.setattr(demo.SeedRun, "evaluate", lambda self, stages: calls.append(
        ["eval", {name: ckpt for name, (ckpt, _) in stages.items()}]) or {name: {} for name in stages})
    monkeypatch.setattr(demo.SeedRun, "rl_stages", lambda self, base, steps: calls.append(["rl", base, steps]) or {
        "rl_curriculum": (tmp_path / "cur", tmp_path)})
    earlier = tmp_path / "earlier"
    run = demo.SeedRun(tmp_path / "rl" / "seed1", 1, 8, [3], envs=("ladder_tail",))
    with pytest.raises(RuntimeError, match="no loop-wise model of seed 1"):
        run.pipeline(10, rl=True, rl_steps=5, rl_from=earlier)
    base = earlier / "seed1" / "loopwise" / "final"
    base.mkdir(parents=True)
    (base / "config.json").write_text("{}")
    assert set(run.pipeline(10, rl=True, rl_steps=5, rl_from=earlier)) == {"loopwise", "rl_curriculum"}
    # no SFT stage ran; the start model and the RL stages' models in one eval
    assert calls == [["rl", base, 5], ["eval", {"loopwise": base, "rl_curriculum": tmp_path / "cur"}]]


def test_rl_demo_evaluates_all_five_models_in_one_eval_after_the_rl_stages(tmp_path, monkeypatch):
    import elr_rl.depth_demo as demo

    calls = []
    monkeypatch.setattr(demo, "cli", lambda title, args, log, threads=None: calls.append(args[0]))
    monkeypatch.setattr(demo.SeedRun, "evaluate", lambda self, stages: calls.append(
        ["eval", {name: ckpt for name, (ckpt, _) in stages.items()}]) or {name: {} for name in stages})
    monkeypatch.setattr(demo.SeedRun, "loop_probe", lambda self, ckpt, out: calls.append("probe") or [])
    rl = {name: (tmp_path / name / "ckpt", tmp_path / name)
          for name in ("rl_curriculum", "rl_uniform_k", "sft_continued")}
    monkeypatch.setattr(demo.SeedRun, "rl_stages", lambda self, base, steps: calls.append("rl") or rl)
    results = demo.SeedRun(tmp_path, 0, 8, [3]).pipeline(10, rl=True, rl_steps=5)
    lw, fo = tmp_path / "loopwise" / "final", tmp_path / "final_only" / "final"
    assert calls == ["sft", "sft", "probe", "rl", ["eval", {"loopwise": lw, "final_only": fo,
                                                             **{name: ckpt for name, (ckpt, _) in rl.items()}}]]
    assert list(results) == ["loopwise", "final_only", "rl_curriculum", "rl_uniform_k", "sft_continued"]
    calls.clear()  # --no-baseline: no final-only SFT, four models in the one eval
    results = demo.SeedRun(tmp_path, 0, 8, [3]).pipeline(10, rl=True, rl_steps=5, baseline=False)
    assert calls == ["sft", "probe", "rl", ["eval", {"loopwise": lw, **{name: ckpt for name, (ckpt, _) in rl.items()}}]]
    assert "final_only" not in results


def test_no_baseline_flag_reaches_every_seed(tmp_path, monkeypatch):
    import pytest

    import elr_rl.depth_demo as demo

    seen = []

    def pipeline(self, steps, rl, rl_steps, rl_from=None, baseline=True):
        seen.append((self.seed, rl, baseline))
        raise KeyboardInterrupt  # stop before the report

    monkeypatch.setattr(demo.SeedRun, "pipeline", pipeline)
    for argv, want in ((["--rl", "--no-baseline"], False), (["--rl"], True)):
        seen.clear()
        with pytest.raises(KeyboardInterrupt):
            demo.main([str(tmp_path), "--seeds", "0", "--jobs", "1", *argv])
        assert seen == [(0, True, want)]


def test_one_eval_command_serves_several_stages_and_splits_their_rows(tmp_path, monkeypatch):
    """Several stages' checkpoints go to one `elr-rl eval` (one process and task set); each stage gets its
    own rows, by checkpoint, per difficulty, and its own eval.json."""
    import json

    import elr_rl.depth_demo as demo

    seen = []

    def cli(title, args, log, threads=None):
        seen.append(args)
        ckpts = args[1:args.index("--envs")]
        rows = [{"checkpoint": c, "env": "ladder_tail", "difficulty": d, "k": k, "pass_at_1": i / 10}
                for i, c in enumerate(ckpts) for d in (1, 3) for k in demo.KS]
        (tmp_path / "out.json").write_text(json.dumps(rows))
        json_at = args[args.index("--json") + 1]
        (tmp_path / "out.json").rename(json_at)

    monkeypatch.setattr(demo, "cli", cli)
    run = demo.SeedRun(tmp_path, 0, 256, [1, 3], envs=("ladder_tail",))
    stages = {name: (tmp_path / name / "final", tmp_path / name) for name in ("loopwise", "final_only")}
    for _, folder in stages.values():
        folder.mkdir()
    got = run.evaluate(stages)
    assert len(seen) == 1 and seen[0][1:3] == [str(stages["loopwise"][0]), str(stages["final_only"][0])]
    assert "256" in seen[0] and "--max-num-seqs" in seen[0]
    for i, name in enumerate(stages):
        assert set(got[name]) == {1, 3}
        assert all(r["pass_at_1"] == i / 10 and r["checkpoint"] == str(stages[name][0])
                   for d in (1, 3) for r in got[name][d])
        assert len(got[name][3]) == len(demo.KS)
        assert json.loads((stages[name][1] / "eval.json").read_text()) == got[name][1] + got[name][3]
