"""The dashboard's data layer, HTTP API, static export and demo run, without a browser."""

from __future__ import annotations

import json
import re
import urllib.error
import urllib.request

import pytest

from curriculum.passrates import PROFILE_COLUMNS
from elr_rl.dashboard import data
from elr_rl.dashboard.cli import main as dashboard_main
from elr_rl.dashboard.demo import DemoSpec, make_demo_run
from elr_rl.dashboard.export import render_static_html
from elr_rl.dashboard.server import DashboardServer
from elr_rl.metrics import MetricsWriter

from .conftest import DEMO_STEPS


def test_demo_run_is_deterministic_and_routes_hard_prompts_deep(tmp_path, demo_run):
    other = make_demo_run(tmp_path / "again", steps=DEMO_STEPS)
    assert (other / "metrics.jsonl").read_bytes() == (demo_run / "metrics.jsonl").read_bytes()
    assert (other / "curriculum/routing.jsonl").read_bytes() == (demo_run / "curriculum/routing.jsonl").read_bytes()
    rows = data.load_metrics(demo_run)["rows"]
    assert len(rows) == DEMO_STEPS
    ks = DemoSpec().loops
    # Lowest scores go to the deepest loops, so deep k gets prompts of lower q; responses shorten with k.
    mean_q = [sum(r[f"curriculum/mean_q_k{k}"] for r in rows) / len(rows) for k in ks]
    assert mean_q[-1] < mean_q[0]
    lengths = [sum(r[f"response_length/k{k}"] for r in rows) / len(rows) for k in ks]
    assert lengths == sorted(lengths, reverse=True)
    with pytest.raises(ValueError, match="already holds a run"):
        make_demo_run(demo_run)


def test_routing_histograms_accept_raw_and_binned_records():
    raw = data.routing_histograms({"step": 3, "k": {"2": {"score": [0.0, 0.04, 0.5, 1.0], "q": [0.2]}}})
    assert raw["edges"][0] == 0.0 and raw["edges"][-1] == 1.0 and len(raw["edges"]) == data.HIST_BINS + 1
    assert raw["score"]["2"][0] == 2 and raw["score"]["2"][10] == 1 and raw["score"]["2"][-1] == 1
    assert raw["n"]["2"] == 4
    binned = data.routing_histograms({"step": 4, "hist": {"edges": [0, 0.5, 1], "score": {"1": [3, 1]}}})
    assert binned["score"] == {"1": [3, 1]} and binned["n"] == {"1": 4}
    assert data.routing_histograms({"step": 5}) is None and data.routing_histograms({"k": {}}) is None


def test_profile_reader_reports_a_half_written_table(tmp_path, demo_run):
    (tmp_path / "profile").mkdir()
    good = sorted((demo_run / "profile").glob("*.parquet"))[-1].read_bytes()
    (tmp_path / "profile" / "step_000000.parquet").write_bytes(good)
    (tmp_path / "profile" / "step_000100.parquet").write_bytes(good[: len(good) // 2])  # writer still busy
    prof = data.load_profile(tmp_path)
    # The newest table is unreadable: say so and fall back to the older one.
    assert prof["file"] == "step_000000.parquet"
    assert any("step_000100.parquet could not be read" in m["text"] for m in prof["messages"])
    assert set(prof["columns"]) >= set(PROFILE_COLUMNS)  # the demo writes what the profiler writes


def test_status_of_missing_and_empty_run_dirs(tmp_path):
    missing = data.run_status(tmp_path / "nope")
    assert not missing["exists"] and "does not exist" in missing["messages"][0]["text"]
    empty = data.run_status(tmp_path)
    assert empty["exists"] and not empty["has_metrics"] and "metrics.jsonl" in empty["messages"][0]["text"]


def _get(url: str):
    try:
        with urllib.request.urlopen(url, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def test_http_api_serves_incremental_rows(tmp_path):
    with MetricsWriter(tmp_path, tensorboard=False) as w, DashboardServer(tmp_path) as srv:
        w.log(0, {"reward/k1": 0.1})
        status, body = _get(srv.url + "api/metrics?offset=0")
        first = json.loads(body)
        assert status == 200 and [r["step"] for r in first["rows"]] == [0]
        w.log(1, {"reward/k1": float("inf")})
        second = json.loads(_get(srv.url + f"api/metrics?offset={first['offset']}")[1])
        assert second["rows"] == [{"step": 1, "time": second["rows"][0]["time"], "reward/k1": None}]
        status, page = _get(srv.url)
        assert status == 200 and b"elr-rl" in page
        assert _get(srv.url + "static/app.js")[0] == 200
        assert _get(srv.url + "static/..%2F..%2Fmetrics.py")[0] == 404
        assert _get(srv.url + "api/nothing")[0] == 404


def test_static_export_is_self_contained(tmp_path, demo_run):
    # A hostile environment name must not end the inlined <script> early.
    run = make_demo_run(tmp_path / "run", steps=3)
    with MetricsWriter(run, tensorboard=False) as w:
        w.log(3, {"reward/env/</script><script>alert(1)</script>": 0.5})
    html = render_static_html(run)
    assert html.count("</script>") == html.count("<script>") == 3  # data, charts.js, app.js
    assert not re.search(r"""(src|href)=["'](https?:)?//""", html), "the export must not load anything remotely"
    assert 'src="static/' not in html and 'href="static/' not in html
    assert "window.ELR_STATIC" in html and "ElrCharts" in html


def test_cli_export_and_bad_input(tmp_path, demo_run, capsys):
    out = tmp_path / "share" / "run.html"
    assert dashboard_main([str(demo_run), "--export", str(out)]) == 0
    assert out.stat().st_size > 10_000
    assert dashboard_main([str(tmp_path / "missing"), "--export", str(out)]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert dashboard_main([str(demo_run), "--port", "70000"]) == 2


def test_elr_rl_cli_dispatches_dashboard(tmp_path, demo_run):
    from elr_rl.cli import main

    assert main(["dashboard", str(demo_run), "--export", str(tmp_path / "x.html")]) == 0
    assert (tmp_path / "x.html").is_file()


def test_folder_of_runs_is_listed_and_names_stay_inside_it(demo_collection):
    assert data.list_runs(demo_collection) == ["rl", "rl_uniform", "sft"]
    status = data.run_status(demo_collection)
    assert status["runs"] == ["rl", "rl_uniform", "sft"] and "folder of 3 runs" in status["messages"][0]["text"]
    assert data.run_status(demo_collection / "rl")["runs"] == []
    assert data.resolve_run(demo_collection, "sft") == (demo_collection / "sft").resolve()
    with pytest.raises(ValueError, match="not inside"):
        data.resolve_run(demo_collection, "../../etc")


def test_live_pass_rates_add_rollouts_to_the_profile_and_drop_untrained_envs(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    (tmp_path / "profile").mkdir()
    pq.write_table(pa.table({"prompt_id": ["a/d1/s0", "b/d1/s0"], "env": ["a", "b"], "k": [1, 1],
                             "samples": [4, 4], "successes": [1, 4], "pass_rate": [0.25, 1.0]}),
                   tmp_path / "profile" / "p.parquet")
    before = data.load_passrates(tmp_path)
    assert before["source"] == "profile" and sorted(before["data"]["env"]) == ["a", "b"]
    (tmp_path / "curriculum").mkdir()
    (tmp_path / "curriculum" / "state.json").write_text(json.dumps(
        {"tracker": {"per_k": {"a/d1/s0|1": [4, 3], "a/d1/s0|2": [8, 8]}}}))
    live = data.load_passrates(tmp_path)
    assert live["source"] == "live"
    rows = sorted(zip(live["data"]["env"], live["data"]["k"], live["data"]["pass_rate"], live["data"]["samples"]))
    assert rows == [("a", 1, 0.5, 8.0), ("a", 2, 1.0, 8.0)]  # b was profiled but never trained on


def test_old_run_directories_read_in_the_current_names(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "reward/k1": 0.5, "loss/policy": 0.1, "perf/wall_s": 3}\n')
    (tmp_path / "rollouts.jsonl").write_text('{"step": 0, "prompt_id": "p", "k": 1, "reward": 1.0, "text": "42"}\n')
    row = data.load_metrics(tmp_path)["rows"][0]
    assert row == {"step": 0, "critic/score/k1": 0.5, "actor/pg_loss": 0.1, "timing_s/elapsed": 3}
    assert data.load_samples(tmp_path)["rows"][0]["completion"] == "42"
