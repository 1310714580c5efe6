"""Bad input to commands: one clear line, a non-zero exit, nothing started and nothing of an earlier
run overwritten. Driven through each command's `main()`; no engine, Ray or learner ever starts."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    """A random tiny checkpoint (max_loops 4) and a copy whose model.safetensors is cut short."""
    from elr_rl.model.cli import main as model_main

    base = tmp_path_factory.mktemp("ckpt")
    good, trunc = base / "good", base / "trunc"
    assert model_main(["init", str(good)]) == 0
    shutil.copytree(good, trunc)
    data = (good / "model.safetensors").read_bytes()
    (trunc / "model.safetensors").write_bytes(data[: len(data) // 2])
    return good, trunc


@pytest.fixture
def no_driver(monkeypatch):
    """Fails the test if a bad `elr-rl rl` call gets as far as building the driver (Ray, engines)."""
    import elr_rl.rl.driver as driver

    class Refused:
        def __init__(self, *a, **k):
            raise AssertionError("the driver started despite a bad config")

    monkeypatch.setattr(driver, "Driver", Refused)


RL_CASES = {
    "unknown env": (["envs.names=[no_such_env]"], "unknown environment 'no_such_env'"),
    "total_steps": (["run.total_steps=0"], "run.total_steps"),
    "save_interval": (["run.save_interval=-1"], "run.save_interval"),
    "loop beyond max_loops": (["curriculum.loop_counts=[1,2,3,9]"], "max_loops=4"),
    "difficulty": (["envs.difficulties=[99]"], "even_odd has no difficulty [99]"),
    "sandbox tier": (["sandbox.tier=chroot"], "sandbox.tier"),
}


@pytest.mark.parametrize("case", sorted(RL_CASES))
def test_rl_refuses_bad_config_before_starting_and_keeps_the_run_folder(case, ckpts, tmp_path, capsys, no_driver):
    from elr_rl.rl.cli import main

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("earlier: run\n")
    overrides, expected = RL_CASES[case]
    rc = main([str(ROOT / "configs/rl_tiny.yaml"), f"model_path={ckpts[0]}", f"run.output_dir={run}", *overrides])
    out = capsys.readouterr().out.strip().splitlines()
    assert rc == 2 and len(out) == 1 and expected in out[0], out
    assert (run / "config.yaml").read_text() == "earlier: run\n"


@pytest.mark.parametrize("text,expected", [("- a\n- b\n", "must hold a mapping"), ("a: [1, 2\n", "not valid YAML")])
def test_rl_refuses_yaml_that_is_not_a_mapping_or_does_not_parse(text, expected, ckpts, tmp_path, capsys, no_driver):
    from elr_rl.rl.cli import main

    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    assert main([str(cfg), f"model_path={ckpts[0]}"]) == 2
    assert expected in capsys.readouterr().out


def test_truncated_safetensors_is_one_line_in_model_info_eval_and_rl(ckpts, tmp_path, capsys, no_driver, monkeypatch):
    import elr_rl.eval.evaluate as evaluate
    from elr_rl.eval.cli import main as eval_main
    from elr_rl.model.cli import main as model_main
    from elr_rl.rl.cli import main as rl_main

    monkeypatch.setattr(evaluate, "evaluate", lambda *a, **k: pytest.fail("eval started an engine"))
    trunc = ckpts[1]
    assert model_main(["info", str(trunc)]) == 2
    assert eval_main([str(trunc)]) == 2
    assert rl_main([str(ROOT / "configs/rl_tiny.yaml"), f"model_path={trunc}", f"run.output_dir={tmp_path}"]) == 2
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 3 and all("is truncated" in line for line in lines), lines
    assert model_main(["info", str(ckpts[0])]) == 0  # the whole checkpoint still loads


def test_malformed_pretraining_rows_name_file_and_line(tmp_path):
    from elr_rl.train.corpus import FileSource

    rows = [{"text": "fine"}, {"text": "also fine"}]
    for bad, expected in [("{not json", "line 3 is not valid JSON"), ("[1, 2]", "line 3 is a list"),
                          ('{"body": "x"}', "line 3 has no text in ['text']")]:
        path = tmp_path / "corpus.jsonl"
        path.write_text("".join(json.dumps(r) + "\n" for r in rows) + bad + "\n")
        with pytest.raises(ValueError, match="corpus.jsonl") as err:
            FileSource([str(path)], "pretrain", "text", "prompt", "response", seed=0)
        assert expected in str(err.value)


def test_profile_loop_counts_checked_before_engines(ckpts):
    from elr_rl.profile.profiler import ProfileConfig

    with pytest.raises(ValueError, match="max_loops=4"):
        ProfileConfig(checkpoint=str(ckpts[0]), loop_counts=[1, 8]).validate()
    ProfileConfig(checkpoint=str(ckpts[0]), loop_counts=[1, 4]).validate()


def test_envs_sample_refuses_a_negative_count(capsys):
    from environments.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["sample", "even_odd", "-n", "-3"])
    assert exit_.value.code == 2 and "must be 1 or more, got -3" in capsys.readouterr().err


def test_a_good_rl_config_gets_to_the_driver(ckpts, tmp_path, capsys, no_driver, monkeypatch):
    """The checks above refuse only what is wrong."""
    from elr_rl.rl.cli import main

    for var in ("ELR_SANDBOX_TIER", "ELR_SANDBOX_ALLOW_WEAKER_TIER"):
        monkeypatch.delenv(var, raising=False)  # restored (unset) afterwards
    with pytest.raises(AssertionError, match="driver started"):
        main([str(ROOT / "configs/rl_tiny.yaml"), f"model_path={ckpts[0]}", f"run.output_dir={tmp_path}"])
    assert "sandbox tier: " in capsys.readouterr().out


@pytest.fixture
def no_bwrap(monkeypatch, tmp_path):
    """bwrap (and unshare) missing from PATH, bwrap configured; no engine may start. Restored afterwards."""
    import elr_rl.rollout.engine as engine
    from environments.sandbox_tier import detect_tier

    class Refused:
        def __init__(self, *a, **k):
            raise AssertionError("an engine started")

    monkeypatch.setattr(engine, "RolloutEngine", Refused)
    monkeypatch.setenv("ELR_SANDBOX_TIER", "bwrap")
    monkeypatch.setenv("ELR_SANDBOX_ALLOW_WEAKER_TIER", "0")
    monkeypatch.setenv("PATH", str(tmp_path))
    detect_tier.cache_clear()
    yield
    monkeypatch.undo()
    detect_tier.cache_clear()


def test_eval_and_profile_stop_before_any_engine_when_the_sandbox_cannot_run(ckpts, tmp_path, capsys, no_bwrap):
    from elr_rl.profile.cli import main as profile_main
    from elr_rl.eval.cli import main as eval_main

    assert eval_main([str(ckpts[0]), "--envs", "code_function_synthesis", "--k", "1", "-n", "2"]) == 2
    out = capsys.readouterr()
    assert "sandbox tier 'bwrap' cannot run here" in out.out + out.err and "allow_weaker_tier" in out.out + out.err
    code = profile_main([str(ROOT / "configs/profile_tiny.yaml"), f"checkpoint={ckpts[0]}", f"run_dir={tmp_path}",
                         "envs=[shell_fs_tasks]", "loop_counts=[1]", "--no-progress"])
    assert code == 2 and "sandbox tier 'bwrap' cannot run here" in capsys.readouterr().err
    # environments that run no model code need no sandbox: these get as far as the engine
    with pytest.raises(AssertionError, match="an engine started"):
        eval_main([str(ckpts[0]), "--envs", "even_odd", "--k", "1", "-n", "2"])
    # a weaker tier, when accepted, is stated and used
    with pytest.raises(AssertionError, match="an engine started"):
        eval_main([str(ckpts[0]), "--envs", "code_function_synthesis", "--k", "1", "-n", "2", "--allow-weaker-tier"])


def test_actors_get_the_runs_sandbox_settings(monkeypatch):
    """A rollout worker on another node sandboxes as the driver's processes do (tier, folder, cgroups)."""
    import ray

    from elr_rl.rl.ray_env import actor_runtime_env

    class Context:
        runtime_env = {"working_dir": "/job", "env_vars": {"A": "1"}}

    monkeypatch.setattr(ray, "get_runtime_context", lambda: Context())
    monkeypatch.setenv("ELR_SANDBOX_TIER", "unshare")
    monkeypatch.setenv("ELR_SANDBOX_DIR", "/srv/jobs")
    env = actor_runtime_env({"OMP_NUM_THREADS": "1"})
    assert env["working_dir"] == "/job"
    assert env["env_vars"]["ELR_SANDBOX_TIER"] == "unshare" and env["env_vars"]["ELR_SANDBOX_DIR"] == "/srv/jobs"
    assert env["env_vars"]["A"] == "1" and env["env_vars"]["OMP_NUM_THREADS"] == "1"


@pytest.mark.parametrize("suffix", [".parquet", ".json"])
def test_sft_rows_without_text_are_refused_whatever_the_file_type(tmp_path, suffix):
    """A null prompt or response in a .parquet / .json file would be trained as the text "None", an empty
    prompt as plain text: refused before training, naming the column, the count and the first row."""
    from datasets import Dataset

    from elr_rl.train.corpus import FileSource

    path = tmp_path / f"sft{suffix}"

    def load(rows):
        path.unlink(missing_ok=True)
        Dataset.from_list(rows).to_parquet(str(path)) if suffix == ".parquet" else path.write_text(json.dumps(rows))
        return FileSource([str(path)], "sft", "text", "prompt", "response", seed=0)

    rows = [{"prompt": "q1", "response": "a1"}, {"prompt": "q2", "response": None}, {"prompt": "", "response": "a3"}]
    with pytest.raises(ValueError, match=r"1 row\(s\) of .* have a null or empty 'prompt' \(the first: row 2\)"):
        load(rows)
    rows[2]["prompt"] = "q3"
    with pytest.raises(ValueError, match=r"null or empty 'response' \(the first: row 1\)"):
        load(rows)
    rows[1]["response"] = "a2"
    assert len(load(rows).rows) == 3
