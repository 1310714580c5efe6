"""MetricsWriter and the JSON-lines reader: what a run writes and what the dashboard can read."""

from __future__ import annotations

import importlib.util
import json
import math
import threading

import pytest

from elr_rl.metrics import (
    METRICS_FILE,
    ROUTING_FILE,
    MetricsConfig,
    MetricsWriter,
    curriculum_metrics,
    read_jsonl,
    routing_from_assignments,
)


def test_writes_one_json_line_per_step(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.log(0, {"reward/k1": 0.5, "kl": float("nan"), "curriculum/score_hist": [0.1, 0.2]}, wall_time=12.5)
        w.log(1, {"reward/k1": 0.75})
    lines = (tmp_path / METRICS_FILE).read_text().splitlines()
    assert len(lines) == 2
    first = json.loads(lines[0])
    # NaN is not JSON: it becomes null so browsers can parse the line.
    assert first == {"step": 0, "time": 12.5, "reward/k1": 0.5, "kl": None, "curriculum/score_hist": [0.1, 0.2]}
    assert json.loads(lines[1])["reward/k1"] == 0.75
    assert math.isfinite(json.loads(lines[1])["time"])


def test_reserved_names_and_non_numbers_are_rejected(tmp_path):
    w = MetricsWriter(tmp_path, tensorboard=False)
    with pytest.raises(ValueError, match="reserved"):
        w.log(0, {"step": 3})
    with pytest.raises(ValueError, match="not a number"):
        w.log(0, {"reward/k1": object()})


def test_routing_records(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w:
        w.log_routing(7, {4: {"q": [0.1, 0.2], "score": [0.05, 0.1]}, 1: {"q": [0.9], "score": [0.8]}})
    row = json.loads((tmp_path / ROUTING_FILE).read_text())
    assert row["step"] == 7 and row["k"]["4"]["score"] == [0.05, 0.1] and row["k"]["1"]["q"] == [0.9]


def test_curriculum_batch_to_metrics_and_routing_record():
    from curriculum.routing import Assignment

    batch = [Assignment("a", "expr_eval", 0, 1, k=4, q=0.1, score=0.05, batch=0, epoch=0),
             Assignment("b", "expr_eval", 1, 1, k=4, q=0.3, score=0.2, batch=0, epoch=0),
             Assignment("c", "expr_eval", 2, 1, k=1, q=0.9, score=0.7, batch=0, epoch=0)]
    assert routing_from_assignments(batch) == {1: {"q": [0.9], "score": [0.7]},
                                               4: {"q": [0.1, 0.3], "score": [0.05, 0.2]}}
    metrics = curriculum_metrics(batch)
    assert metrics["curriculum/prompts_k4"] == 2 and metrics["curriculum/prompts_k1"] == 1
    assert metrics["curriculum/mean_q_k4"] == pytest.approx(0.2)


def test_tensorboard_scalars_and_histograms(tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    with MetricsWriter(tmp_path, tensorboard=True) as w:
        for step in range(3):
            w.log(step, {"reward/k2": 0.1 * step, "pass_rate/k2": 0.5})
        w.log_routing(2, {2: {"score": [0.1, 0.4, 0.9]}})
    acc = EventAccumulator(str(tmp_path / "tensorboard"))
    acc.Reload()
    events = acc.Scalars("reward/k2")
    assert [e.step for e in events] == [0, 1, 2]
    assert [round(e.value, 5) for e in events] == [0.0, 0.1, 0.2]
    assert "curriculum/score_k2" in acc.Tags()["histograms"]


@pytest.mark.skipif(importlib.util.find_spec("wandb") is not None, reason="wandb is installed here")
def test_wandb_configured_without_package_says_what_to_do(tmp_path):
    cfg = MetricsConfig(tensorboard=False, wandb_project="elr-rl")
    assert cfg.wandb_kwargs() == {"project": "elr-rl", "mode": "online"}
    with pytest.raises(ValueError, match="pip install wandb"):
        MetricsWriter.from_config(tmp_path, cfg)
    assert MetricsConfig().wandb_kwargs() is None  # W&B is off unless a project is set


def test_reader_skips_a_partial_last_line_and_resumes(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\n{"step": 1}\n{"step": 2, "rew')
    chunk = read_jsonl(path)
    assert [r["step"] for r in chunk.rows] == [0, 1]
    with open(path, "a") as f:
        f.write('ard/k1": 0.5}\n{"step": 3}\n')
    more = read_jsonl(path, chunk.next_offset)
    assert more.rows == [{"step": 2, "reward/k1": 0.5}, {"step": 3}]
    assert read_jsonl(path, more.next_offset).rows == []


def test_reader_counts_corrupt_lines_and_restarts_on_a_rewritten_file(tmp_path):
    path = tmp_path / "m.jsonl"
    path.write_text('{"step": 0}\nnot json\n[1, 2]\n{"step": 1}\n')
    chunk = read_jsonl(path)
    assert [r["step"] for r in chunk.rows] == [0, 1] and chunk.skipped == 2
    path.write_text('{"step": 0}\n')  # a new run overwrote the file
    again = read_jsonl(path, chunk.next_offset)
    assert again.reset and again.rows == [{"step": 0}]
    assert read_jsonl(tmp_path / "missing.jsonl").rows == []


def test_concurrent_reader_never_sees_a_broken_row(tmp_path):
    """A reader polling while the writer appends gets whole rows only, and all of them in the end."""
    writer = MetricsWriter(tmp_path, tensorboard=False)
    payload = {f"reward/env/env{i}": i / 7 for i in range(60)}  # long lines: more chances to split a write
    total = 400

    def produce():
        for step in range(total):
            writer.log(step, payload)

    thread = threading.Thread(target=produce)
    thread.start()
    seen, offset = [], 0
    while thread.is_alive() or offset < (tmp_path / METRICS_FILE).stat().st_size:
        chunk = read_jsonl(tmp_path / METRICS_FILE, offset)
        assert chunk.skipped == 0
        seen.extend(r["step"] for r in chunk.rows)
        offset = chunk.next_offset
    thread.join()
    assert seen == list(range(total))
