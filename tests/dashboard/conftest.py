"""Shared fixtures for the dashboard tests: a recorded demo run and one headless chromium."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest

from elr_rl.dashboard.demo import make_demo_collection, make_demo_run

DEMO_STEPS = 30

# Flags for a headless, offline chromium: no GPU, no QUIC, no first-run or background traffic.
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]


def find_chromium() -> str | None:
    """Debian's chromium (scripts/install_system_deps.sh installs it), or $ELR_CHROMIUM."""
    for candidate in (os.environ.get("ELR_CHROMIUM"), "/usr/bin/chromium", shutil.which("chromium"),
                      shutil.which("chromium-browser")):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished recorded run, shared read-only by the tests."""
    return make_demo_run(tmp_path_factory.mktemp("runs") / "demo", steps=DEMO_STEPS)


@pytest.fixture(scope="session")
def demo_collection(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder of recorded runs (sft, rl, rl_uniform), as the quickstart leaves one."""
    return make_demo_collection(tmp_path_factory.mktemp("runs") / "collection", steps=DEMO_STEPS)


@pytest.fixture(scope="module")
def browser():
    """One headless chromium per test module (a fresh temporary profile: Playwright's default).

    Module scope: Playwright's sync API holds an event loop while open, so it is closed before
    other packages' tests (which may call asyncio.run) start.
    """
    executable = find_chromium()
    if executable is None:
        pytest.skip("chromium not found: run scripts/install_system_deps.sh (apt-get install chromium) or set ELR_CHROMIUM")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as pw:
        b = pw.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


@pytest.fixture
def page(browser):
    """A fresh page; fails the test on any JavaScript error."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    pg = context.new_page()
    errors: list[str] = []
    pg.on("pageerror", lambda exc: errors.append(str(exc)))
    yield pg
    context.close()
    assert not errors, f"JavaScript errors on the page: {errors}"


def panel_states(page) -> dict[str, str]:
    """data-state ("ok" or "empty") of every panel on the page."""
    return page.eval_on_selector_all("section.panel[data-panel]",
                                     "els => Object.fromEntries(els.map(e => [e.dataset.panel, e.dataset.state]))")


def chart_attr(page, name: str, attr: str) -> int:
    return int(page.get_attribute(f'[data-chart="{name}"]', f"data-{attr}") or 0)


@pytest.fixture
def serve():
    """Start dashboard servers for the test; all are closed after it."""
    from elr_rl.dashboard.server import DashboardServer

    servers = []

    def start(run_dir):
        srv = DashboardServer(run_dir).start()
        servers.append(srv)
        return srv

    yield start
    for srv in servers:
        srv.close()
