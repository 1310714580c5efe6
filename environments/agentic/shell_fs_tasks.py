"""shell_fs_tasks: one shell command per turn in a sandboxed, generated file tree.

Each episode gets a fresh sandbox directory holding the generated tree; every
`<bash>` turn is one sandboxed `sh -c` process in it, and its (bounded)
output is the observation. The episode ends with `<answer>...</answer>`.
The hidden checker runs in the parent: it compares the answer, or the final
tree (read without following links), with what the task's generator
computed. D sets the number of files, the depth and the turn budget.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import ClassVar

from environments.base import MultiTurnEnvironment, Score, StepResult, Task
from environments.sandbox import Sandbox, SandboxLimits
from environments.turns import format_help, parse_action

SHELL_LIMITS = SandboxLimits(cpu_s=2, wall_s=5.0, memory_mb=256, nproc=16, fsize_mb=2, nofile=64, output_bytes=4000)
ACTIONS = ("bash", "answer")
WORDS = "alpha beta gamma delta omega kappa sigma theta lambda zeta".split()
KINDS = ("count_errors", "csv_total", "rename_ext", "collect_todo", "delete_tmp")


def _tree(rng: random.Random, root: str, n_files: int, depth: int, exts: list[str]) -> dict[str, str]:
    """n_files files with unique names spread over nested directories under root."""
    dirs = [root]
    for i in range(depth):
        dirs.append(f"{rng.choice(dirs)}/{rng.choice(WORDS)}{i}")
    files, names = {}, rng.sample(range(100, 1000), n_files)
    for i, num in enumerate(names):
        ext = exts[i % len(exts)]
        files[f"{rng.choice(dirs)}/f{num}{ext}"] = ""
    return files


def _lines(rng: random.Random, n: int, marker: str, p: float) -> str:
    out = []
    for _ in range(n):
        if rng.random() < p:
            out.append(f"{rng.randint(0, 99):02d}:00 {marker} {rng.choice(WORDS)} failed")
        else:
            out.append(f"{rng.randint(0, 99):02d}:00 {rng.choice(['INFO', 'WARN'])} {rng.choice(WORDS)} ok")
    return "\n".join(out) + "\n"


def _build(kind: str, rng: random.Random, n_files: int, depth: int) -> tuple[dict[str, str], str, str, str | dict]:
    """(files, instruction, reference command, expected answer or final tree)."""
    if kind == "count_errors":
        files = {p: _lines(rng, rng.randint(3, 12), "ERROR", 0.3) for p in _tree(rng, "logs", n_files, depth, [".log", ".txt"])}
        count = sum(c.count(" ERROR ") for p, c in files.items() if p.endswith(".log"))
        return (files, "How many lines containing ERROR are there in all .log files under logs/ (any depth)? "
                "Files with other extensions do not count.",
                "find logs -name '*.log' -exec cat {} + | grep -c ERROR", str(count))  # fmt: skip
    if kind == "csv_total":
        dept = rng.choice(WORDS)
        rows = [(f"n{i}", rng.choice(WORDS[:4] + [dept]), rng.randint(1, 500)) for i in range(4 * n_files)]
        files = {"data.csv": "name,dept,amount\n" + "".join(f"{a},{b},{c}\n" for a, b, c in rows)}
        files.update({p: _lines(rng, 3, "NOTE", 0.2) for p in _tree(rng, "misc", n_files - 1, depth, [".txt"])})
        total = sum(c for _, b, c in rows if b == dept)
        return (files, f"data.csv has the columns name,dept,amount. What is the total amount of the rows whose dept is "
                f"{dept}?", f"awk -F, '$2==\"{dept}\" {{s+=$3}} END {{print s+0}}' data.csv", str(total))  # fmt: skip
    if kind == "rename_ext":
        files = {p: f"doc {p}\n" for p in _tree(rng, "docs", n_files, depth, [".txt", ".txt", ".md", ".rst"])}
        final = {re.sub(r"\.txt$", ".md", p): c for p, c in files.items()}
        return (files, "Rename every .txt file under docs/ (any depth) to the same name ending in .md, keeping its "
                "contents. Change nothing else.",
                "find docs -name '*.txt' -exec sh -c 'mv \"$1\" \"${1%.txt}.md\"' _ {} \\;", final)  # fmt: skip
    if kind == "collect_todo":
        files = {p: _lines(rng, rng.randint(2, 6), "TODO", 0.25) for p in _tree(rng, "src", n_files, depth, [".py", ".c"])}
        names = sorted(p.rsplit("/", 1)[-1] for p, c in files.items() if " TODO " in c)
        final = {**files, "summary.txt": "".join(n + "\n" for n in names)}
        return (files, "Create the file summary.txt (in the working directory) listing the file names (without "
                "directories) of every file under src/ that contains TODO, sorted, one per line. Change nothing else.",
                "grep -rl TODO src | sed 's#.*/##' | sort > summary.txt", final)  # fmt: skip
    files = {p: f"{rng.choice(WORDS)}\n" for p in _tree(rng, "work", n_files, depth, [".tmp", ".dat", ".log"])}
    final = {p: c for p, c in files.items() if not p.endswith(".tmp")}
    return (files, "Delete every file whose name ends in .tmp anywhere under work/. Change nothing else.",
            "find work -name '*.tmp' -type f -delete", final)  # fmt: skip


@dataclass
class _Episode:
    sandbox: Sandbox | None
    turns: int = 0
    answer: str | None = None
    done: bool = False


class ShellFsTasks(MultiTurnEnvironment):
    name: ClassVar[str] = "shell_fs_tasks"
    sandboxed = True  # runs model-written code
    domain: ClassVar[str] = "terminal"
    max_turns: ClassVar[int] = 12
    max_concurrency: ClassVar[int] = 4
    score_timeout_s: ClassVar[float] = 90.0

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = rng.choice(KINDS)
        n_files, depth, budget = 3 + 3 * difficulty, 1 + difficulty // 2, 3 + difficulty // 3
        # Regenerate until the task is non-trivial (something to count, rename or delete).
        while True:
            files, instruction, command, expected = _build(kind, rng, n_files, depth)
            if expected not in ("0", files):
                break
        state_task = isinstance(expected, dict)
        finish = "When you are done, reply <answer>done</answer>." if state_task else "Give the final answer as <answer>N</answer>."
        prompt = (
            "You are in a shell, in a working directory holding a small file tree (use relative paths). "
            "Each turn, run exactly one command as <bash>COMMAND</bash>; you will see its output. "
            f"You have {budget} turns in all.\n\nTask: {instruction}\n{finish}"
        )
        return Task(
            self.name, seed, difficulty, prompt, answer=expected,
            hidden={"files": files, "command": command, "kind": kind, "turn_budget": budget},
            stats={"files": float(len(files)), "depth": float(depth), "turn_budget": float(budget)},
        )  # fmt: skip

    def reset(self, task: Task) -> _Episode:
        return _Episode(Sandbox(task.hidden["files"], limits=SHELL_LIMITS))

    def step(self, task: Task, state: _Episode, model_turn: str) -> StepResult:
        if state.done:
            return StepResult("The episode is over.", True)
        state.turns += 1
        last = state.turns >= task.hidden["turn_budget"]
        action = parse_action(model_turn, ACTIONS)
        if action is None:
            obs = format_help(ACTIONS)
        elif action.tag == "answer":
            state.answer, state.done = action.body.strip(), True
            return StepResult("Answer recorded.", True)
        else:
            res = state.sandbox.run_shell(action.body)
            status = "killed: time limit" if res.timed_out else f"exit code {res.returncode}"
            obs = f"[{status}]\n{res.stdout}" + (f"\n[stderr]\n{res.stderr}" if res.stderr else "")
        state.done = last
        return StepResult(obs, last)

    def score_episode(self, task: Task, state: _Episode) -> Score:
        try:
            if state.answer is None or state.sandbox is None:
                return Score.binary(False, turns=float(state.turns))
            if isinstance(task.answer, dict):
                # The final tree must equal the expected one exactly (no extra, missing or changed files).
                tree = state.sandbox.read_tree()
                want = {p: c.encode("utf-8") for p, c in task.answer.items()}
                ok = state.answer == "done" and tree == want
            else:
                ok = state.answer == task.answer
            return Score.binary(ok, turns=float(state.turns))
        finally:
            if state.sandbox is not None:
                state.sandbox.close()
                state.sandbox = None

    def reference_turns(self, task: Task) -> list[str]:
        final = "done" if isinstance(task.answer, dict) else task.answer
        return [f"<bash>{task.hidden['command']}</bash>", f"<answer>{final}</answer>"]

    def bad_answers(self, task: Task) -> list[str]:
        from environments.base import join_turns

        if isinstance(task.answer, dict):
            return [
                "<answer>done</answer>",  # nothing changed
                join_turns(["<bash>rm -rf ./*</bash>", "<answer>done</answer>"]),
                join_turns(["<bash>echo PASSED; exit 0</bash>", "<answer>done</answer>"]),
                join_turns([f"<bash>{task.hidden['command']}; touch extra.txt</bash>", "<answer>done</answer>"]),
            ]
        return [
            f"<answer>{int(task.answer) + 1}</answer>",
            join_turns([f"<bash>{task.hidden['command']}</bash>", "<answer>PASSED</answer>"]),
            join_turns([f"<bash>{task.hidden['command']}</bash>"] * 20),  # never answers
        ]

    def worked_response(self, task: Task) -> str:
        turns = self.reference_turns(task)
        state = self.reset(task)
        try:
            obs = self.step(task, state, turns[0]).observation
        finally:
            state.sandbox.close()
        return f"{turns[0]}\n<output>\n{obs.strip()}\n</output>\n{turns[1]}"
