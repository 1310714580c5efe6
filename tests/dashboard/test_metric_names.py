"""The metric-name scheme (elr_rl/metrics.py), the RL step metrics, sample logging and the W&B hand-off."""

from __future__ import annotations

import json
import sys
import types
from dataclasses import dataclass, field

import pytest

from elr_rl.metrics import SAMPLE_COLUMNS, SAMPLES_FILE, MetricsConfig, MetricsWriter, canonical_row
from curriculum.routing import Assignment
from elr_rl.rl.messages import FinishReason, Group, Sample, StepResult
from elr_rl.rl.stats import BatchInfo, group_metrics, step_metrics
from elr_rl.rl.validation import validation_metrics


def _group(env: str, k: int, rewards: list[float], finish: str = "stop", version: int = 0) -> Group:
    samples = [Sample([1], [2, 3], [1, 1], [0.0, 0.0], FinishReason(finish), text="x", reward=r, accuracy=r > 0.5)
               for r in rewards]
    return Group(Assignment(f"{env}-{k}", env, 0, 1, k, q=0.5, score=0.5, batch=0, epoch=0), samples, version)


def test_old_rl_rows_are_renamed_and_training_rows_kept():
    old = {"step": 3, "reward/mean": 0.5, "reward/k4": 0.25, "pass_rate/env/expr_eval": 1.0, "loss/policy": -0.1,
           "clip_frac": 0.02, "kl": 0.0, "lr": 1e-4, "perf/weight_sync_s": 0.1, "perf/learner_step_s": 2.0,
           "perf/tokens_per_s": 900.0, "perf/wall_s": 40.0, "curriculum/prompts_k4": 8}
    new = canonical_row(old)
    assert new == {"step": 3, "critic/score/mean": 0.5, "critic/score/k4": 0.25,
                   "critic/pass_rate/env/expr_eval": 1.0, "actor/pg_loss": -0.1, "actor/pg_clipfrac": 0.02,
                   "actor/ppo_kl": 0.0, "actor/lr": 1e-4, "timing_s/weight_sync": 0.1, "timing_s/update_actor": 2.0,
                   "perf/gen_tokens_per_s": 900.0, "timing_s/elapsed": 40.0, "curriculum/prompts_k4": 8}
    train = {"step": 1, "loss/mean": 2.0, "loss/k2": 2.1, "lr": 1e-3, "perf/tokens_per_s": 5e3}
    assert canonical_row(train) == train  # the training stages' names are their own
    assert canonical_row(new) == new


def test_rl_step_metrics_use_the_scheme():
    window = [_group("expr_eval", 1, [1.0, 0.0]), _group("expr_eval", 4, [1.0, 1.0], finish="length"),
              _group("arith_multidigit", 4, [0.0, 0.0])]
    g = group_metrics(window)
    assert g["critic/pass_rate/env/expr_eval/k4"] == 1.0 and g["critic/pass_rate/env/expr_eval/k1"] == 0.5
    assert g["critic/pass_rate/k4"] == 0.5 and g["critic/score/mean"] == 0.5
    assert g["response_length/clip_ratio"] == 2 / 6
    assert "critic/score/env/expr_eval/k4" not in g  # per (env, k): pass rate only
    results = [StepResult([0.5], 1.5, [{"tokens": 10, "clip_frac": 0.1, "entropy": 2.0, "kl": 0.0, "ratio_mean": 1.0,
                                        "is_weight_mean": 1.0, "update": 0}], weights_serialize_s=0.0,
                          compute_s=2.0, cpu_s=3.0)]
    info = BatchInfo(window[:2], staleness=[0, 1], dropped_stale_new=2, lr=1e-4,
                     stats={"batch/uninformative_groups": 1.0, "batch/trained_samples": 2.0,
                            "batch/learner_sublayer_tokens": 50.0})
    row = step_metrics(results, info, version=5, window=window, ledger={"dropped_stale": 7, "requeued": 3}, restarts=1,
                       sync_s=0.5, parity=[1e-5, 3e-4], weight_loads=[0.2], learner_busy=0.9, rollout_busy=0.8,
                       wall=100.0, window_s=4.0)
    assert row["actor/pg_clipfrac"] == 0.1 and row["actor/grad_norm"] == 1.5 and row["actor/lr"] == 1e-4
    assert row["batch/frac_reward_zero_std"] == 0.5 and row["async/dropped_stale_frac"] == 0.5
    assert row["timing_s/weight_sync"] == 0.5 and row["timing_s/step"] == 4.0 and row["perf/weight_sync_frac"] == 0.125
    assert row["timing_s/weight_load"] == 0.2 and row["perf/trained_tokens_per_s"] == 2.5
    assert row["timing_s/learner_compute"] == 2.0 and row["perf/learner_threads_busy"] == 1.5
    # two groups of two samples (1 prompt + 2 response tokens) at k = 1 and k = 4
    assert row["batch/groups_k1"] == 1 and row["batch/groups_k4"] == 1 and "batch/groups_k2" not in row
    assert row["batch/loop_tokens"] == 2 * 3 * 1 + 2 * 3 * 4 and row["perf/learner_loop_tokens_per_s"] == 30 / 2.0
    assert row["perf/gen_tokens_per_s"] == 12 / 4.0 and row["perf/learner_sublayer_tokens_per_s"] == 50 / 2.0
    assert row["async/staleness_mean"] == 0.5 and row["async/staleness_max"] == 1 and row["async/policy_version"] == 5
    assert row["perf/learner_idle_ratio"] == pytest.approx(0.1) and row["perf/rollout_idle_ratio"] == pytest.approx(0.2)
    assert row["sync/parity_max_abs_diff"] == 3e-4 and row["faults/restarted_workers"] == 1
    assert row["faults/requeued_prompts"] == 3 and row["actor/pg_loss"] == 0.5 and row["perf/trained_tokens"] == 10
    assert row["actor/ratio_max_dev/update0"] == 0.0 and "actor/ppo_kl" in row
    assert not any(k.startswith(("reward/", "pass_rate/", "perf/weight_sync_s")) for k in row)


def test_validation_metrics_pass_at_1_per_k_and_env():
    out = validation_metrics([{"env": "a", "k": 1, "accuracy": [True, False], "tokens": [3, 5]},
                              {"env": "b", "k": 1, "accuracy": [True], "tokens": [2]},
                              {"env": "a", "k": 2, "accuracy": [True, True], "tokens": [4, 4]}])
    assert out["val/pass_at_1/a/k1"] == 0.5 and out["val/pass_at_1/b/k1"] == 1.0
    assert out["val/pass_at_1/k1"] == 2 / 3 and out["val/pass_at_1/k2"] == 1.0
    assert out["val/response_length/k1"] == 10 / 3


def _sample(i: int) -> dict:
    return {"env": "expr_eval", "prompt_id": f"p{i}", "k": 2, "policy_version": 4, "reward": 1.0, "accuracy": True,
            "finish_reason": "stop", "prompt": "What is 1+1?", "completion": "2"}


def test_samples_go_to_rollouts_jsonl(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.log_samples(5, [_sample(0), _sample(1)], wall_time=3.0)
    rows = [json.loads(line) for line in (tmp_path / SAMPLES_FILE).read_text().splitlines()]
    assert [r["prompt_id"] for r in rows] == ["p0", "p1"]
    assert rows[0] == {"step": 5, "time": 3.0, **_sample(0)}


class _FakeTable:
    def __init__(self, columns, data):
        self.columns, self.data = columns, data


class _FakeRun:
    def __init__(self):
        self.logged: list[tuple[dict, int]] = []
        self.finished = False

    def log(self, values, step):
        self.logged.append((values, step))

    def finish(self):
        self.finished = True


@dataclass
class _Cfg:
    lr: float = 1e-4
    envs: list[str] = field(default_factory=lambda: ["expr_eval"])


def test_wandb_gets_the_config_metrics_and_sample_tables(tmp_path, monkeypatch):
    """W&B is not installed here: a fake module stands in for it, checking what we hand over."""
    calls = []
    run = _FakeRun()
    fake = types.SimpleNamespace(init=lambda **kw: calls.append(kw) or run, Table=_FakeTable)
    monkeypatch.setitem(sys.modules, "wandb", fake)
    cfg = MetricsConfig(tensorboard=False, wandb_project="elr", wandb_init={"name": "ablation-a"})
    with MetricsWriter.from_config(tmp_path, cfg, run_config=_Cfg()) as w:
        w.log(1, {"critic/score/mean": 0.5, "actor/ppo_kl": float("nan")})
        w.log_samples(1, [_sample(0)])
        w.log_samples(2, [_sample(1)])
    assert calls == [{"dir": str(tmp_path), "project": "elr", "mode": "online", "name": "ablation-a",
                      "config": {"lr": 1e-4, "envs": ["expr_eval"]}}]
    assert run.logged[0] == ({"critic/score/mean": 0.5}, 1)  # a NaN is left out, not sent
    tables = [(v["samples"], step) for v, step in run.logged if "samples" in v]
    assert [step for _, step in tables] == [1, 2]
    last = tables[-1][0]
    assert last.columns == ["step", *SAMPLE_COLUMNS]
    assert [row[0] for row in last.data] == [1, 2]  # the table logged holds every sample so far
    assert last.data[1][SAMPLE_COLUMNS.index("completion") + 1] == "2"
    assert run.finished
