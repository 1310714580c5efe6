"""A tiny third-party environment package, written to a temp dir and pip-installed by the tests.

It is a separate distribution (`elr-rl-test-plugin`) that registers its
environments through the `elr_rl.environments` entry point only: nothing in
the project names it. Besides a well-behaved environment it ships verifiers
that raise, hang or sleep, for the scoring-pool tests.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DIST = "elr-rl-test-plugin"
MODULE = "elr_rl_test_plugin"

MODULE_SOURCE = '''
import random, time
from environments.base import Environment, MultiTurnEnvironment, Score, StepResult, Task, extract_answer


class _Base(Environment):
    domain = "test"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        a, b = rng.randint(1, 10 ** difficulty), rng.randint(1, 10 ** difficulty)
        return Task(self.name, seed, difficulty, f"What is {a} + {b}? <answer>N</answer>", str(a + b),
                    stats={"digits": float(difficulty)})

    def score(self, task: Task, completion: str) -> Score:
        return Score.binary(extract_answer(completion) == task.answer)

    def reference_solution(self, task: Task) -> str:
        return f"<answer>{task.answer}</answer>"

    def bad_answers(self, task: Task) -> list[str]:
        return [f"<answer>{int(task.answer) + 1}</answer>"]


class PluginAdd(_Base):
    name = "plugin_add"


class PluginRaise(_Base):
    name = "plugin_raise"

    def score(self, task, completion):
        raise RuntimeError("verifier bug")


class PluginHang(_Base):
    name = "plugin_hang"
    score_timeout_s = 1.5

    def score(self, task, completion):
        while True:  # a busy loop: no thread-based timeout could stop this
            pass


class PluginSleep(_Base):
    """Takes 0.6 s per job; one job at a time; times out after 1.5 s of *running*."""

    name = "plugin_sleep"
    max_concurrency = 1
    score_timeout_s = 1.5

    def score(self, task, completion):
        start = time.time()
        time.sleep(0.6)
        ok = extract_answer(completion) == task.answer
        return Score(1.0 if ok else 0.0, ok, {"start": start, "end": time.time()})


class PluginTurns(MultiTurnEnvironment):
    """Multi-turn: `<add>N</add>` turns must sum to the target, then `<answer>done</answer>`.
    A turn "hang" busy-loops, "raise" raises: for the pool's episode sessions."""

    name = "plugin_turns"
    domain = "test"
    max_turns = 4
    score_timeout_s = 1.5

    def _generate(self, rng, seed, difficulty):
        target = rng.randint(2, 9)
        return Task(self.name, seed, difficulty, f"Reach {target} with <add>N</add> turns.", str(target))

    def reset(self, task):
        return {"total": 0, "done": False}

    def step(self, task, state, turn):
        if turn == "hang":
            while True:
                pass
        if turn == "raise":
            raise RuntimeError("step bug")
        if turn.startswith("<add>") and turn.endswith("</add>"):
            state["total"] += int(turn[5:-6])
            return StepResult(f"total {state['total']}", False)
        state["done"] = True
        return StepResult("ok", True)

    def score_episode(self, task, state):
        return Score.binary(state["done"] and str(state["total"]) == task.answer)

    def reference_turns(self, task):
        n = int(task.answer)
        return [f"<add>{n - 1}</add>", "<add>1</add>", "<answer>done</answer>"]

    def bad_answers(self, task):
        return ["<answer>done</answer>"]
'''

PYPROJECT = f'''
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{DIST}"
version = "0.0.1"

[tool.setuptools]
py-modules = ["{MODULE}"]

[project.entry-points."elr_rl.environments"]
plugin_add = "{MODULE}:PluginAdd"
plugin_raise = "{MODULE}:PluginRaise"
plugin_hang = "{MODULE}:PluginHang"
plugin_sleep = "{MODULE}:PluginSleep"
plugin_turns = "{MODULE}:PluginTurns"
'''


def write_package(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "pyproject.toml").write_text(PYPROJECT)
    (root / f"{MODULE}.py").write_text(MODULE_SOURCE)
    return root


def pip(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "pip", "--disable-pip-version-check", "-q", *args], check=True)


def install(root: Path) -> None:
    # No build isolation and no index: everything needed is in the venv already.
    pip("install", "--no-deps", "--no-build-isolation", "--no-index", str(write_package(root)))


def uninstall() -> None:
    pip("uninstall", "-y", DIST)
