"""A dataset environment from a tiny parquet made here, through every stage with real engines:
profile (vLLM), a few async GRPO steps mixed with a built-in environment (Ray, vLLM, DeepSpeed), eval."""

from __future__ import annotations

import json

import pytest

from environments import registry
from tests.rl.helpers import make_config

pytestmark = pytest.mark.slow


@pytest.fixture()
def tiny_math(tmp_path, monkeypatch):
    from datasets import Dataset

    # setenv (delenv of an unset variable records nothing): teardown removes what the test registers
    monkeypatch.setenv(registry.SPECS_ENV, "")
    registry.refresh()
    rows = [{"question": f"Is {a} * {b} even or odd? Give the product.", "answer": str(a * b), "level": 1 + a % 2}
            for a in range(2, 6) for b in range(3, 7)]
    path = tmp_path / "tiny_math.parquet"
    Dataset.from_list(rows).to_parquet(str(path))
    yield {"name": "tiny_math", "data": str(path), "prompt_key": "question", "answer_key": "answer",
           "difficulty_key": "level", "verifier": "math"}
    registry.refresh()


def test_profile_rl_mix_and_eval_from_a_dataset(toy_checkpoint, ray_cluster, tiny_math, tmp_path):
    from elr_rl.profile.cli import profile_with_engines
    from elr_rl.profile.profiler import EngineSettings, ProfileConfig
    from elr_rl.eval.evaluate import EvalConfig, evaluate
    from elr_rl.rl.driver import Driver

    # profile: one row per dataset row and k, keyed by the row hash
    pcfg = ProfileConfig(checkpoint=str(toy_checkpoint), run_dir=str(tmp_path / "prof"), envs=[tiny_math],
                         loop_counts=[1, 2], samples_per_prompt=2, max_tokens=16, chunk_prompts=16, scoring_workers=1,
                         engine=EngineSettings(max_model_len=256, max_num_seqs=32))
    table = profile_with_engines(pcfg, [1, 2], progress=False)
    env = registry.get_env("tiny_math")
    ids = {f"tiny_math/d{d}/s{s}" for d, s in env.prompt_keys()}
    assert len(ids) == 16 and {r["prompt_id"] for r in table} == ids and len(table) == 32
    assert all(r["samples"] == 2 and 0.0 <= r["pass_rate"] <= 1.0 for r in table)

    # RL: the dataset mixed with a built-in environment, weights 1:1, curriculum fed by the profile table
    cfg = make_config(toy_checkpoint, tmp_path / "run", run={"total_steps": 3}, rollout={"max_model_len": 320},
                      envs={"names": [{"name": "even_odd", "weight": 1.0}, {**tiny_math, "weight": 1.0}]},
                      curriculum={"profile_table": str(tmp_path / "prof" / "profile" / "profile.parquet")})
    summary = Driver(cfg).run()
    assert summary["step"] == 3
    metrics = [json.loads(line) for line in open(tmp_path / "run" / "metrics.jsonl")]
    keys = set().union(*metrics)
    env_keys = sorted(k for k in keys if "env" in k)
    assert any("env/tiny_math" in k for k in keys) and any("env/even_odd" in k for k in keys), env_keys

    # eval: the dataset's rows as the held-out set (a real run points the entry at a held-out file)
    rows = evaluate(str(toy_checkpoint), EvalConfig(envs=[tiny_math], ks=[1], num_tasks=8, max_new_tokens=16),
                    progress=False)
    assert [(r["env"], r["k"], r["tasks"]) for r in rows] == [("tiny_math", 1, 8)]
