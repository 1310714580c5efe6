"""repo_repair: fix injected bugs in a small generated package with shell and edit tools.

The repository holds `pkg/` (modules of small functions, some with an injected
bug), visible tests under `tests/` and a runner `run_tests.py`. Turns are
`<bash>CMD</bash>`, `<edit path="pkg/x.py">FULL CONTENT</edit>` or
`<answer>done</answer>`. Grading in the parent: the test files must be
unchanged, then the final `pkg/` is copied into a fresh sandbox and every
function is called on hidden inputs; outputs are compared with the correct
implementations' outputs, computed in the parent. D sets the number of
functions, modules and bugs, and the turn budget.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from environments.base import MultiTurnEnvironment, Score, StepResult, Task, join_turns
from environments.code.harness import normalise, run_harness
from environments.sandbox import Sandbox, SandboxLimits
from environments.turns import format_help, parse_action

ACTIONS = ("bash", "edit", "answer")
REPO_LIMITS = SandboxLimits(cpu_s=3, wall_s=8.0, memory_mb=256, nproc=16, fsize_mb=2, nofile=64, output_bytes=4000)


@dataclass(frozen=True)
class Func:
    """A library function: correct source, one bug as (old, new) text, a hidden-input generator."""

    name: str
    source: str
    bug: tuple[str, str]
    inputs: Callable[[random.Random], list[Any]]


def _ints(rng, n=8, lo=-20, hi=20):
    return [rng.randint(lo, hi) for _ in range(rng.randint(0, n))]


LIBRARY = [
    Func("clamp", "def clamp(x, lo, hi):\n    return max(lo, min(x, hi))\n", ("min(x, hi)", "min(x, lo)"),
         lambda r: [r.randint(-30, 30), -10, 10]),
    Func("mean", "def mean(xs):\n    return sum(xs) / len(xs) if xs else 0.0\n", ("/ len(xs)", "/ (len(xs) + 1)"),
         lambda r: [_ints(r)]),
    Func("running_max", "def running_max(xs):\n    out, best = [], None\n    for x in xs:\n"
         "        if best is None or x > best:\n            best = x\n        out.append(best)\n    return out\n",
         ("x > best", "x < best"), lambda r: [_ints(r)]),
    Func("count_words", "def count_words(text):\n    return len(text.split())\n", ("text.split()", "text.split(' ')"),
         lambda r: ["  ".join(r.choice(["a", "bb", "c d", " e"]) for _ in range(r.randint(1, 5)))]),
    Func("is_palindrome", "def is_palindrome(s):\n    t = [c.lower() for c in s if c.isalnum()]\n    return t == t[::-1]\n",
         ("c.lower() for", "c for"), lambda r: [r.choice(["Abba", "Noon", "abc", "Race car", "xYx", "Ab"])]),
    Func("digit_sum", "def digit_sum(n):\n    return sum(int(d) for d in str(abs(n)))\n", ("str(abs(n))", "str(n)"),
         lambda r: [r.randint(-999, 999)]),
    Func("second_largest", "def second_largest(xs):\n    vals = sorted(set(xs))\n    return vals[-2] if len(vals) > 1 else None\n",
         ("sorted(set(xs))", "sorted(xs)"), lambda r: [[r.randint(0, 5) for _ in range(r.randint(2, 7))]]),
    Func("rle", "def rle(s):\n    out, i = [], 0\n    while i < len(s):\n        j = i\n        while j < len(s) and s[j] == s[i]:\n"
         "            j += 1\n        out.append(f'{s[i]}{j - i}')\n        i = j\n    return ''.join(out)\n",
         ("f'{s[i]}{j - i}'", "f'{s[i]}{j - i - 1}'"), lambda r: ["".join(r.choice("aab") for _ in range(r.randint(0, 9)))]),
    Func("merge_sorted", "def merge_sorted(a, b):\n    out, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n"
         "        if a[i] <= b[j]:\n            out.append(a[i])\n            i += 1\n        else:\n            out.append(b[j])\n"
         "            j += 1\n    return out + a[i:] + b[j:]\n", (" + b[j:]", ""),
         lambda r: [sorted(_ints(r)), sorted(_ints(r))]),
    Func("gcd", "def gcd(a, b):\n    while b:\n        a, b = b, a % b\n    return abs(a)\n", ("return abs(a)", "return abs(b)"),
         lambda r: [r.randint(1, 200), r.randint(1, 200)]),
    Func("median", "def median(xs):\n    s = sorted(xs)\n    n = len(s)\n    if n == 0:\n        return None\n"
         "    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2\n", ("s = sorted(xs)", "s = list(xs)"),
         lambda r: [_ints(r)]),
    Func("fizzbuzz", "def fizzbuzz(n):\n    if n % 15 == 0:\n        return 'FizzBuzz'\n    if n % 3 == 0:\n        return 'Fizz'\n"
         "    if n % 5 == 0:\n        return 'Buzz'\n    return str(n)\n", ("n % 15 == 0", "n % 25 == 0"),
         lambda r: [r.choice([15, 30, 45, 3, 5, 7, 60, 9])]),
]  # fmt: skip

RUNNER = """import importlib, pathlib, sys, traceback
sys.path.insert(0, str(pathlib.Path(__file__).parent))
failed = total = 0
for path in sorted(pathlib.Path('tests').glob('test_*.py')):
    mod = importlib.import_module('tests.' + path.stem)
    for name in sorted(n for n in dir(mod) if n.startswith('test_')):
        total += 1
        try:
            getattr(mod, name)()
        except Exception:
            failed += 1
            print(f'FAIL {path.stem}.{name}')
            traceback.print_exc(limit=-1)
print(f'{total - failed}/{total} tests passed')
"""


def _call(source: str, name: str, args: list[Any]) -> Any:
    g: dict[str, Any] = {}
    exec(source, g)  # trusted: our own library source, never model output
    return normalise(g[name](*args))


def _cases(rng: random.Random, f: Func, n: int, buggy: str) -> list[list[Any]]:
    """n inputs, at least one of which exposes the bug (the bug must be findable and gradeable)."""
    def exposes(case: list[Any]) -> bool:
        try:
            return _call(f.source, f.name, case) != _call(buggy, f.name, case)
        except Exception:  # the buggy version crashing also exposes it
            return True

    for _ in range(200):
        cases = [f.inputs(rng) for _ in range(n)]
        if any(exposes(c) for c in cases):
            return cases
    raise RuntimeError(f"bug in {f.name} is never exposed by its input generator")


@dataclass
class _Episode:
    sandbox: Sandbox | None
    turns: int = 0
    finished: bool = False
    done: bool = False


class RepoRepair(MultiTurnEnvironment):
    name: ClassVar[str] = "repo_repair"
    sandboxed = True  # runs model-written code
    domain: ClassVar[str] = "terminal"
    max_turns: ClassVar[int] = 16
    max_concurrency: ClassVar[int] = 4
    score_timeout_s: ClassVar[float] = 120.0

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        n_funcs, n_mods = 2 + difficulty // 2, 1 + difficulty // 4
        n_bugs, budget = 1 + difficulty // 3, 4 + difficulty
        funcs = rng.sample(LIBRARY, n_funcs)
        buggy = set(rng.sample([f.name for f in funcs], n_bugs))
        mods = {f.name: f"mod{i % n_mods}" for i, f in enumerate(funcs)}
        files, fixed, hidden_calls, expected = {"pkg/__init__.py": "", "tests/__init__.py": "", "run_tests.py": RUNNER}, {}, [], []
        for m in sorted(set(mods.values())):
            members = [f for f in funcs if mods[f.name] == m]
            good = "\n\n".join(f.source for f in members)
            bad = "\n\n".join(f.source.replace(*f.bug) if f.name in buggy else f.source for f in members)
            files[f"pkg/{m}.py"], fixed[f"pkg/{m}.py"] = bad, good
            test_lines = [f"from pkg.{m} import *\n"]
            for f in members:
                cases = _cases(rng, f, 3, f.source.replace(*f.bug))
                body = "".join(f"    assert {f.name}(*{c!r}) == {_call(f.source, f.name, c)!r}\n" for c in cases)
                test_lines.append(f"\ndef test_{f.name}():\n{body}")
                for c in _cases(rng, f, 6, f.source.replace(*f.bug)):
                    hidden_calls.append([f.name, c])
                    expected.append(_call(f.source, f.name, c))
            files[f"tests/test_{m}.py"] = "".join(test_lines)
        prompt = (
            "A small Python repository has bugs: some functions in pkg/ do not do what their names say. The tests "
            "in tests/ are correct; run them with `python3 run_tests.py`. Fix the package without changing tests/ or "
            "run_tests.py; hidden tests will also check every function.\n"
            "Each turn, write exactly one action: <bash>COMMAND</bash> runs a shell command in the repository; "
            '<edit path="pkg/FILE.py">NEW FULL CONTENT</edit> replaces a file; <answer>done</answer> ends the episode. '
            f"You have {budget} turns."
        )
        return Task(
            self.name, seed, difficulty, prompt, answer=fixed,
            hidden={"files": files, "calls": hidden_calls, "expected": expected, "turn_budget": budget,
                    "names": sorted(mods)},
            stats={"functions": float(n_funcs), "modules": float(n_mods), "bugs": float(n_bugs),
                   "turn_budget": float(budget)},
        )  # fmt: skip

    def reset(self, task: Task) -> _Episode:
        return _Episode(Sandbox(task.hidden["files"], limits=REPO_LIMITS))

    def step(self, task: Task, state: _Episode, model_turn: str) -> StepResult:
        if state.done:
            return StepResult("The episode is over.", True)
        state.turns += 1
        last = state.turns >= task.hidden["turn_budget"]
        action = parse_action(model_turn, ACTIONS)
        if action is None:
            obs = format_help(ACTIONS)
        elif action.tag == "answer":
            state.finished = state.done = action.body.strip() == "done"
            obs = "Submitted." if state.finished else "Reply <answer>done</answer> to submit."
        elif action.tag == "edit":
            obs = self._edit(state, action.attrs.get("path", ""), action.body)
        else:
            res = state.sandbox.run_shell(action.body)
            status = "killed: time limit" if res.timed_out else f"exit code {res.returncode}"
            obs = f"[{status}]\n{res.stdout}" + (f"\n[stderr]\n{res.stderr}" if res.stderr else "")
        state.done = state.done or last
        return StepResult(obs, state.done)

    @staticmethod
    def _edit(state: _Episode, path: str, body: str) -> str:
        if not path or len(body) > 100_000:
            return 'Edit error: give path="..." and at most 100000 characters.'
        try:
            state.sandbox.write_files({path: body.lstrip("\n")})
        except (ValueError, OSError) as exc:  # untrusted path: outside the repo, a directory, a symlink
            return f"Edit error: {exc}"
        return f"Wrote {path}."

    def score_episode(self, task: Task, state: _Episode) -> Score:
        try:
            if not state.finished or state.sandbox is None:
                return Score.binary(False, turns=float(state.turns))
            tree = state.sandbox.read_tree()
            originals = task.hidden["files"]
            tests_kept = all(tree.get(p) == c.encode() for p, c in originals.items() if not p.startswith("pkg/"))
            if not tests_kept:
                return Score.binary(False, tests_unchanged=0.0, turns=float(state.turns))
            pkg = {p: c.decode("utf-8", "replace") for p, c in tree.items() if p.startswith("pkg/") and c is not None}
            shim = "".join(f"from pkg.{p[4:-3]} import *\n" for p in sorted(pkg) if p.endswith(".py") and "/" not in p[4:])
            run = run_harness(shim, "function", task.hidden["calls"], extra_files=pkg, limits=REPO_LIMITS)
            results = run.results or []
            passed = sum("error" not in r and r.get("value") == e for r, e in zip(results, task.hidden["expected"]))
            ok = run.results is not None and passed == len(task.hidden["expected"])
            return Score.binary(ok, tests_unchanged=1.0, pass_rate=passed / len(task.hidden["expected"]),
                                turns=float(state.turns))  # fmt: skip
        finally:
            if state.sandbox is not None:
                state.sandbox.close()
                state.sandbox = None

    def reference_turns(self, task: Task) -> list[str]:
        edits = [f'<edit path="{p}">\n{c}</edit>' for p, c in task.answer.items() if c != task.hidden["files"][p]]
        return ["<bash>python3 run_tests.py</bash>", *edits, "<answer>done</answer>"]

    def bad_answers(self, task: Task) -> list[str]:
        gut = "\n".join(f"def test_{n}():\n    pass\n" for n in task.hidden["names"])
        test_file = next(p for p in task.hidden["files"] if p.startswith("tests/test_"))
        return [
            "<answer>done</answer>",  # no fix
            join_turns(["<bash>rm -rf tests</bash>", "<answer>done</answer>"]),
            join_turns([f'<edit path="{test_file}">{gut}</edit>', "<answer>done</answer>"]),
            join_turns(["<bash>echo '10/10 tests passed'; echo PASSED</bash>", "<answer>done</answer>"]),
            join_turns(self.reference_turns(task)[:-1]),  # fixed but never submitted
        ]

    def worked_response(self, task: Task) -> str:
        turns, parts = self.reference_turns(task), []
        state = self.reset(task)
        try:
            obs = self.step(task, state, turns[0]).observation
        finally:
            state.sandbox.close()
        parts.append(f"{turns[0]}\n<output>\n{obs.strip()}\n</output>")
        parts.append("The failing tests point at the buggy functions; rewrite each affected module with the fix.")
        parts.extend(turns[1:])
        return "\n".join(parts)
