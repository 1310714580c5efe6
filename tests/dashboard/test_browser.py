"""The dashboard page in a real headless chromium: panels, filter, live updates, bad input, static export."""

from __future__ import annotations

import os
import shutil
from urllib.parse import urlparse

from elr_rl.dashboard.demo import DEMO_ENVS, RESTART_STEPS, make_demo_run, write_profile, write_steps
from elr_rl.dashboard.export import export_html

from .conftest import DEMO_STEPS, chart_attr, panel_states

POLL = "?poll=250"  # fast polling so live tests wait fractions of a second
CHART_PANELS = ["slots", "mean_q", "passrate_dist", "score_dist", "pass_heat", "val_k", "reward_k", "pass_k",
                "length_k", "reward_env", "pass_env", "length_env", "zero_std", "dropped", "trained_samples",
                "grad_norm", "lr", "entropy", "staleness", "throughput", "weight_sync", "idle", "restarts",
                "loss", "kl", "clip_frac"]
ALL_PANELS = CHART_PANELS + ["health_summary", "samples", "profile_table"]  # an RL run: all but loss_k and runs


def test_every_panel_renders_a_recorded_run(page, demo_run, serve, tmp_path):
    srv = serve(demo_run)
    origin = urlparse(srv.url).netloc
    foreign = []
    page.on("request", lambda req: urlparse(req.url).netloc not in (origin, "") and foreign.append(req.url))
    page.goto(srv.url + POLL)
    page.wait_for_selector(f'#last-step[data-step="{DEMO_STEPS - 1}"]')
    states = panel_states(page)
    assert {p: states.get(p) for p in ALL_PANELS} == {p: "ok" for p in ALL_PANELS}
    for name in CHART_PANELS:
        assert chart_attr(page, name, "points") > 0, name
    assert chart_attr(page, "slots", "series") == 4  # one line per loop count
    assert chart_attr(page, "reward_env", "series") == len(DEMO_ENVS)
    restarts = sum(s < DEMO_STEPS for s in RESTART_STEPS)
    assert page.inner_text('.tile[data-key="faults/restarted_workers"] .value') == str(restarts)
    assert page.is_hidden("#banner"), page.inner_text("#banner")
    assert page.locator("#profile-table tbody tr").count() > 0
    assert "curriculum" in page.text_content("#config-text")  # inside a closed <details>
    assert foreign == [], f"the page fetched from outside its server: {foreign}"
    shot = tmp_path / "dashboard.png"
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 50_000
    if os.environ.get("ELR_DASHBOARD_SCREENSHOT"):  # e.g. for a person to look at
        shutil.copy(shot, os.environ["ELR_DASHBOARD_SCREENSHOT"])


def test_environment_filter_changes_what_is_shown(page, demo_run, serve):
    page.goto(serve(demo_run).url + POLL)
    page.wait_for_selector(f'#last-step[data-step="{DEMO_STEPS - 1}"]')
    all_rows = int(page.get_attribute("#profile-count", "data-rows"))
    all_bars = chart_attr(page, "passrate_dist", "points")
    env = "logic_deduction"
    page.select_option("#env-filter", env)
    page.wait_for_function("() => document.querySelector('[data-chart=reward_env]').dataset.series === '1'")
    rows = int(page.get_attribute("#profile-count", "data-rows"))
    assert 0 < rows < all_rows
    envs = page.eval_on_selector_all("#profile-table tbody tr", "trs => [...new Set(trs.map(t => t.dataset.env))]")
    assert envs == [env]
    assert page.inner_text('[data-chart="pass_env"] .legend') == env
    assert chart_attr(page, "passrate_dist", "points") != all_bars
    # The loop-count filter narrows the table further; "all" restores it.
    page.select_option("#k-filter", "4")
    assert int(page.get_attribute("#profile-count", "data-rows")) == rows // 4
    page.select_option("#k-filter", "")
    page.select_option("#env-filter", "")
    assert int(page.get_attribute("#profile-count", "data-rows")) == all_rows
    assert chart_attr(page, "reward_env", "series") == len(DEMO_ENVS)


def test_page_picks_up_rows_appended_while_open(page, tmp_path, serve):
    run = make_demo_run(tmp_path / "live", steps=5)
    page.goto(serve(run).url + POLL)
    page.wait_for_selector('#last-step[data-step="4"]')
    points_before = chart_attr(page, "reward_k", "points")
    write_steps(run, 5, 3)  # the run goes on
    page.wait_for_selector('#last-step[data-step="7"]', timeout=10_000)
    assert chart_attr(page, "reward_k", "points") > points_before
    assert page.inner_text("#routing-step-label") == "7"
    # A half-written line is not shown (and is not an error) until the writer finishes it.
    metrics = run / "metrics.jsonl"
    with open(metrics, "a") as f:
        f.write('{"step": 8, "reward/k1": 0.9')
    page.wait_for_timeout(800)
    assert page.get_attribute("#last-step", "data-step") == "7"
    assert page.is_hidden("#banner"), page.inner_text("#banner")
    with open(metrics, "a") as f:
        f.write("}\n")
    page.wait_for_selector('#last-step[data-step="8"]', timeout=10_000)
    # A refreshed profile table replaces the old one in the table.
    write_profile(run, 8)
    page.wait_for_function("() => document.querySelector('#profile-count').textContent.startsWith('step_000008')")


def test_missing_run_dir_shows_a_message_then_the_run(page, tmp_path, serve):
    run = tmp_path / "not-started"
    page.goto(serve(run).url + POLL)
    page.wait_for_selector("#banner .msg.error")
    assert "does not exist" in page.inner_text("#banner")
    assert "Traceback" not in page.inner_text("body")
    assert set(panel_states(page)[p] for p in CHART_PANELS) == {"empty"}
    make_demo_run(run, steps=3)  # the run starts: the page follows without a reload
    page.wait_for_selector('#last-step[data-step="2"]', timeout=10_000)
    assert panel_states(page)["reward_k"] == "ok"


def test_half_written_run_dir_shows_clear_messages(page, tmp_path, demo_run, serve):
    run = tmp_path / "half"
    (run / "profile").mkdir(parents=True)
    (run / "metrics.jsonl").write_text('{"step": 0, "reward/k1": 0.')  # first line not finished
    table = sorted((demo_run / "profile").glob("*.parquet"))[0].read_bytes()
    (run / "profile" / "step_000000.parquet").write_bytes(table[:200])
    page.goto(serve(run).url + POLL)
    page.wait_for_selector("#banner .msg")
    banner = page.inner_text("#banner")
    assert "no complete row yet" in banner
    assert "step_000000.parquet could not be read" in banner
    text = page.inner_text("body")
    assert "Traceback" not in text
    assert "No routing records yet" in page.inner_text('[data-chart="score_dist"]')
    assert "No profile table yet" in page.inner_text("#profile-table")


def test_static_export_opens_offline(browser, demo_run, tmp_path):
    out = export_html(demo_run, tmp_path / "export" / "run.html")
    context = browser.new_context(viewport={"width": 1400, "height": 900}, offline=True)
    page = context.new_page()
    errors, requests = [], []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.on("request", lambda req: requests.append(req.url))
    page.goto(out.as_uri())
    page.wait_for_selector(f'#last-step[data-step="{DEMO_STEPS - 1}"]')
    states = panel_states(page)
    assert all(states[p] == "ok" for p in ALL_PANELS), states
    assert page.inner_text("#live-state") == "static snapshot"
    assert [u for u in requests if not u.startswith(("file:", "data:"))] == []
    page.select_option("#env-filter", "expr_eval")
    assert chart_attr(page, "reward_env", "series") == 1
    context.close()
    assert not errors, errors
