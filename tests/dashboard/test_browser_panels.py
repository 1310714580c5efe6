"""The steering panels in a real headless chromium: heat map, validation, samples, loss per k, chart tools,
a folder of runs and the overlay of two runs. Screenshots go to $ELR_DASHBOARD_SCREENSHOT_DIR when set."""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from elr_rl.dashboard.demo import DEMO_ENVS, VALIDATION_INTERVAL, DemoSpec, make_demo_run, write_steps

from .conftest import DEMO_STEPS, chart_attr, panel_states

POLL = "poll=250"
LOOPS = len(DemoSpec().loops)


def _shot(page, tmp_path: Path, name: str) -> None:
    """Full-page screenshot kept with the test's files (and copied out for a person to look at)."""
    path = tmp_path / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    assert path.stat().st_size > 20_000
    out = os.environ.get("ELR_DASHBOARD_SCREENSHOT_DIR")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        shutil.copy(path, Path(out) / path.name)


def _open(page, url: str, last_step: int = DEMO_STEPS - 1) -> None:
    page.goto(url)
    page.wait_for_selector(f'#last-step[data-step="{last_step}"]')


def test_steering_panels_of_a_recorded_rl_run(page, demo_run, serve, tmp_path):
    _open(page, serve(demo_run).url + "?" + POLL)
    # Slots: one stacked bar per step, split into every loop count.
    assert chart_attr(page, "slots", "steps") == DEMO_STEPS and chart_attr(page, "slots", "series") == LOOPS
    assert chart_attr(page, "slots", "points") == DEMO_STEPS * LOOPS
    # Heat map: a row per (environment, k) with a cell per step (few steps: no binning).
    assert chart_attr(page, "pass_heat", "series") == len(DEMO_ENVS) * LOOPS
    rows = [json.loads(line) for line in (demo_run / "metrics.jsonl").read_text().splitlines()]
    cells = sum(1 for r in rows for key in r if re.fullmatch(r"critic/pass_rate/env/[^/]+/k\d+", key))
    assert chart_attr(page, "pass_heat", "points") == cells > len(DEMO_ENVS) * LOOPS * DEMO_STEPS // 2
    # Validation: a point per k at every validation step.
    validations = len(range(0, DEMO_STEPS, VALIDATION_INTERVAL))
    assert chart_attr(page, "val_k", "points") == LOOPS * validations
    # The routing slider moves through steps, and ends at the header's step.
    assert page.get_attribute("#routing-step-label", "data-step") == str(DEMO_STEPS - 1)
    # The live pass-rate distribution comes from the curriculum's state, on top of the profile.
    assert page.get_attribute("#passrate-source", "data-source") == "live"
    assert "curriculum/state.json" in page.inner_text("#passrate-source")
    # Collapse signals and the weight-sync share.
    for name in ("zero_std", "dropped", "trained_samples", "grad_norm", "lr", "entropy", "weight_sync"):
        assert chart_attr(page, name, "points") == DEMO_STEPS, name
    assert "generated tokens/s" in page.inner_text('[data-chart="throughput"] .legend')
    assert panel_states(page)["loss_k"] == "empty"  # an RL run has no pretraining loss per k
    _shot(page, tmp_path, "rl_run")


def test_sample_browser_filters(page, demo_run, serve, tmp_path):
    _open(page, serve(demo_run).url + "?" + POLL)
    total = int(page.get_attribute("#sample-count", "data-rows"))
    assert total == DEMO_STEPS * 2 * LOOPS  # two samples per k per step
    first = page.locator("#sample-table tbody tr").first
    assert first.locator("td").first.inner_text() == str(DEMO_STEPS - 1)  # newest first
    page.select_option("#sample-env", "expr_eval")
    envs = page.eval_on_selector_all("#sample-table tbody tr", "trs => [...new Set(trs.map(t => t.dataset.env))]")
    assert envs == ["expr_eval"]
    by_env = int(page.get_attribute("#sample-count", "data-rows"))
    assert 0 < by_env < total
    page.select_option("#sample-k", "4")
    assert page.eval_on_selector_all("#sample-table tbody tr", "trs => [...new Set(trs.map(t => t.dataset.k))]") == ["4"]
    page.select_option("#sample-env", "")
    page.select_option("#sample-reward", "pos")
    rewards = page.eval_on_selector_all("#sample-table tbody tr", "trs => trs.map(t => Number(t.dataset.reward))")
    assert rewards and all(r > 0 for r in rewards)
    page.select_option("#sample-reward", "zero")
    rewards = page.eval_on_selector_all("#sample-table tbody tr", "trs => trs.map(t => Number(t.dataset.reward))")
    assert rewards and all(r <= 0 for r in rewards)
    # A row opens to the whole prompt and completion.
    row = page.locator("#sample-table tbody tr").first
    row.locator("td.wrap summary").nth(1).click()
    assert "boxed" in row.locator("td.wrap pre").nth(1).inner_text()
    _shot(page, tmp_path, "samples")


def test_validation_points_appear_as_they_are_written(page, tmp_path, serve):
    run = make_demo_run(tmp_path / "live", steps=3)  # validated at step 0
    _open(page, serve(run).url + "?" + POLL, last_step=2)
    assert chart_attr(page, "val_k", "points") == LOOPS
    write_steps(run, 3, VALIDATION_INTERVAL)  # reaches the next validation step
    page.wait_for_selector(f'#last-step[data-step="{2 + VALIDATION_INTERVAL}"]', timeout=10_000)
    assert chart_attr(page, "val_k", "points") == 2 * LOOPS


def test_chart_tools_smoothing_log_zoom_and_hover(page, demo_run, serve):
    _open(page, serve(demo_run).url + "?" + POLL)
    chart = page.locator('[data-chart="throughput"]')
    assert chart.locator("path.series.raw").count() == 0
    page.locator("#smoothing").fill("0.8")
    page.locator("#smoothing").dispatch_event("input")
    assert chart.locator("path.series.raw").count() == 2  # raw values stay, faint, under the smoothed lines
    # Log scale, per chart.
    chart.locator(".log-toggle").check()
    assert page.get_attribute('[data-chart="throughput"]', "data-log") == "1"
    assert page.get_attribute('[data-chart="reward_k"]', "data-log") == "0"
    # Hover: the tooltip names the exact step under the cursor.
    box = chart.locator("svg").bounding_box()
    page.mouse.move(box["x"] + box["width"] - 13, box["y"] + box["height"] / 2)
    assert chart.locator(".tooltip").get_attribute("data-step") == str(DEMO_STEPS - 1)
    assert f"step {DEMO_STEPS - 1}" in chart.locator(".tooltip").inner_text()
    # Drag to zoom: every step chart shows the chosen steps; "reset zoom" restores them.
    page.mouse.move(box["x"] + 52 + 0.25 * (box["width"] - 64), box["y"] + 80)
    page.mouse.down()
    page.mouse.move(box["x"] + 52 + 0.6 * (box["width"] - 64), box["y"] + 80, steps=4)
    page.mouse.up()
    assert page.is_visible("#zoom-state")
    lo, hi = (float(page.get_attribute('[data-chart="reward_k"]', f"data-{a}")) for a in ("xlo", "xhi"))
    assert 0 < lo < hi < DEMO_STEPS - 1
    assert chart_attr(page, "slots", "steps") == int(hi) - int(lo) + 1
    page.click("#zoom-reset")
    assert float(page.get_attribute('[data-chart="reward_k"]', "data-xhi")) == DEMO_STEPS - 1
    assert chart_attr(page, "slots", "steps") == DEMO_STEPS


def test_a_folder_of_runs_is_listed_and_two_runs_overlay(page, demo_collection, serve, tmp_path):
    srv = serve(demo_collection)
    page.goto(srv.url + "?" + POLL)
    page.wait_for_selector('[data-panel="runs"][data-state="ok"]')
    links = page.eval_on_selector_all("#run-list a", "as => as.map(a => a.dataset.run)")
    assert links == ["rl", "rl_uniform", "sft"]
    assert "folder of 3 runs" in page.inner_text("#banner")
    assert page.is_hidden('[data-panel="reward_k"]')  # the list, not a page of empty panels
    _shot(page, tmp_path, "folder")
    # The SFT run: loss per k (training, and held-out dashed).
    page.click('#run-list a[data-run="sft"]')
    page.wait_for_selector(f'#last-step[data-step="{DEMO_STEPS - 1}"]')
    assert panel_states(page)["loss_k"] == "ok"
    assert chart_attr(page, "loss_k", "series") == 2 * LOOPS
    assert "held-out k=1" in page.inner_text('[data-chart="loss_k"] .legend')
    assert page.is_hidden('[data-panel="reward_k"]')  # RL's empty panels are out of the way
    _shot(page, tmp_path, "sft_run")
    # Overlay: the curriculum run with the uniform-routing ablation drawn dashed on top.
    _open(page, srv.url + f"?run=rl&{POLL}")
    assert chart_attr(page, "reward_k", "overlay") == 0
    page.select_option("#compare-select", "rl_uniform")
    page.wait_for_function("() => document.querySelector('[data-chart=reward_k]').dataset.overlay === '4'")
    assert chart_attr(page, "reward_k", "series") == 2 * LOOPS
    assert "k=1 · rl_uniform" in page.inner_text('[data-chart="reward_k"] .legend')
    assert page.locator('[data-chart="reward_k"] path[stroke-dasharray]').count() == LOOPS
    _shot(page, tmp_path, "overlay")


def test_disabled_kl_and_all_zero_series_read_right(page, tmp_path, serve):
    from elr_rl.metrics import MetricsWriter

    run = tmp_path / "no_kl"
    with MetricsWriter(run, tensorboard=False) as w:
        for step in range(1, 4):
            w.log(step, {"critic/score/mean": 0.5, "async/dropped_stale_frac": 0.0, "timing_s/weight_sync": 0.2,
                         "timing_s/step": 4.0})
    (run / "config.yaml").write_text("algo:\n  kl_coef: 0.0\n  clip_low: 0.2\n")
    _open(page, serve(run).url + "?" + POLL, last_step=3)
    assert "KL penalty is off" in page.inner_text('[data-chart="kl"]')
    # A series of zeros sits on a 0..1 axis (no negative ticks), and the sync share is computed from seconds.
    ticks = page.eval_on_selector_all('[data-chart="dropped"] text.tick', "ts => ts.map(t => t.textContent)")
    assert "0" in ticks and not any(t.startswith("-") for t in ticks)
    assert chart_attr(page, "weight_sync", "points") == 3
