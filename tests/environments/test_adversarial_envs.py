"""Hostile completions in the code and shell environments score 0 and leave the host untouched."""

from __future__ import annotations

import json
import os
import uuid
from pathlib import Path

import pytest

from environments import sandbox as sandbox_mod
from environments.agentic import repo_repair, shell_fs_tasks
from environments.base import join_turns
from environments.code import harness
from environments.code.harness import fence
from environments.registry import get_env
from environments.sandbox import SandboxLimits, detect_tier
from tests.environments.adversarial import NEEDS_NAMESPACES, PYTHON, SHELL, Listener

FAST = SandboxLimits(cpu_s=1, wall_s=2.0, memory_mb=256, nproc=16, fsize_mb=1, nofile=32, output_bytes=2000)
TIER = detect_tier()


@pytest.fixture(autouse=True)
def fast_limits(monkeypatch):
    """Same limits with a shorter clock, so hostile jobs hit them quickly."""
    for mod, attr in ((harness, "CODE_LIMITS"), (shell_fs_tasks, "SHELL_LIMITS"), (repo_repair, "REPO_LIMITS")):
        monkeypatch.setattr(mod, attr, FAST)


@pytest.fixture
def host():
    """Markers that must never appear and a listener that must never be reached."""
    here = Path(__file__).resolve().parent
    markers = [here / f".escape-{uuid.uuid4().hex}", Path("/tmp") / f"elr-escape-{uuid.uuid4().hex}"]
    listener, ppid = Listener(), os.getppid()
    yield markers, listener
    listener.close()
    escaped = [m for m in markers if m.exists()]
    for m in markers:
        m.unlink(missing_ok=True)
    if TIER != "rlimit":  # the plain tier shares /tmp with the host
        assert not escaped
    else:
        assert not escaped[:1]
    if TIER != "rlimit":
        assert listener.connections == 0
    assert os.getppid() == ppid


def _skip_if_tier_cannot(name: str) -> None:
    if name in NEEDS_NAMESPACES and TIER == "rlimit":
        pytest.skip("needs a namespace tier")
    if name in ("kill_parent", "write_outside") and TIER == "rlimit" and os.geteuid() != 0:
        pytest.skip("plain rlimits without a uid drop run with our own rights")


def _program(name: str, markers: list[Path], port: int) -> str:
    snippets = [PYTHON[name].format(marker=str(m), port=port) for m in (markers if name == "write_outside" else markers[:1])]
    return "\n".join("try:\n" + "\n".join("    " + ln for ln in s.splitlines()) + "\nexcept OSError:\n    pass" for s in snippets)


@pytest.mark.parametrize("name", sorted(PYTHON))
def test_hostile_function_synthesis_scores_zero(name, host):
    _skip_if_tier_cannot(name)
    markers, listener = host
    env = get_env("code_function_synthesis")
    task = env.generate(0, 2)
    # The hostile code runs when the module is imported, then defines nothing useful.
    score = env.score(task, fence(_program(name, markers, listener.port)))
    assert score.reward == 0.0 and not score.accuracy


@pytest.mark.parametrize("name", ["banner_exit_0", "infinite_loop", "read_hidden"])
def test_hostile_stdio_program_scores_zero(name, host):
    markers, listener = host
    env = get_env("code_stdio_algorithms")
    task = env.generate(0, 2)
    assert env.score(task, fence(_program(name, markers, listener.port))).reward == 0.0


@pytest.mark.parametrize("name", sorted(SHELL))
def test_hostile_shell_commands_score_zero(name, host):
    _skip_if_tier_cannot(name)
    markers, listener = host
    env = get_env("shell_fs_tasks")
    task = env.generate(1, 2)
    cmds = [SHELL[name].format(marker=m, port=listener.port) for m in (markers if name == "write_outside" else markers[:1])]
    turns = [f"<bash>{c}</bash>" for c in cmds] + ["<answer>done</answer>"]
    assert env.score(task, join_turns(turns)).reward == 0.0
    # The environment still works after the attack.
    assert env.score(task, env.reference_solution(task)).reward == 1.0


@pytest.mark.parametrize("name", ["fork_bomb", "write_outside", "banner_exit_0"])
def test_hostile_repo_repair_scores_zero(name, host):
    _skip_if_tier_cannot(name)
    markers, listener = host
    env = get_env("repo_repair")
    task = env.generate(0, 1)
    cmd = SHELL[name].format(marker=markers[0], port=listener.port)
    assert env.score(task, join_turns([f"<bash>{cmd}</bash>", "<answer>done</answer>"])).reward == 0.0


@pytest.mark.parametrize("env_name", ["code_function_synthesis", "code_stdio_algorithms"])
def test_expected_outputs_never_enter_the_sandbox(env_name, monkeypatch):
    written: list[dict] = []
    real = sandbox_mod.Sandbox.write_files

    def spy(self, files):
        written.append(dict(files))
        return real(self, files)

    monkeypatch.setattr(sandbox_mod.Sandbox, "write_files", spy)
    env = get_env(env_name)
    task = env.generate(5, 3)
    assert env.score(task, env.reference_solution(task)).reward == 1.0
    (files,) = written
    assert set(files) == {"solution.py", "_inputs.json", "_harness.py"}
    spec = json.loads(files["_inputs.json"])
    assert set(spec) == {"mode", "func", "inputs"} and spec["inputs"] == task.hidden["inputs"]
    secret = json.dumps(task.hidden["expected"])
    assert not any(secret in content for content in files.values())
