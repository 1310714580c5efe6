"""code_function_synthesis: implement a function from a spec built of list/string primitives.

The spec is a pipeline of k primitive steps (D sets k, the input length and the
number of hidden tests). Hidden tests are random inputs; their expected outputs
come from the trusted reference pipeline in the parent and never enter the
sandbox. Reward 1 only when every hidden test matches.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Callable, ClassVar

from environments.base import Environment, Score, Task
from environments.code.harness import extract_code, fence, normalise, run_harness


@dataclass(frozen=True)
class Op:
    """One primitive: English description, its trusted implementation, the line of reference code."""

    text: str
    fn: Callable[[Any], Any]
    code: str


def _rotate(xs, k):
    return xs[k % len(xs) :] + xs[: k % len(xs)] if xs else xs


def _list_ops(rng: random.Random) -> list[Op]:
    t, c, m = rng.randint(-5, 10), rng.randint(2, 5), rng.randint(3, 9)
    n, k, lo = rng.randint(2, 6), rng.randint(1, 4), rng.randint(-5, 0)
    hi = lo + rng.randint(5, 15)
    return [
        Op(f"keep only the elements greater than {t}", lambda xs: [x for x in xs if x > t], f"xs = [x for x in xs if x > {t}]"),
        Op("keep only the even elements", lambda xs: [x for x in xs if x % 2 == 0], "xs = [x for x in xs if x % 2 == 0]"),
        Op(f"multiply every element by {c}", lambda xs: [x * c for x in xs], f"xs = [x * {c} for x in xs]"),
        Op(f"add {c} to every element", lambda xs: [x + c for x in xs], f"xs = [x + {c} for x in xs]"),
        Op(f"replace every element x by x mod {m} (a value in 0..{m - 1})", lambda xs: [x % m for x in xs], f"xs = [x % {m} for x in xs]"),
        Op("reverse the list", lambda xs: xs[::-1], "xs = xs[::-1]"),
        Op("sort the list in ascending order", sorted, "xs = sorted(xs)"),
        Op("sort the list in descending order", lambda xs: sorted(xs, reverse=True), "xs = sorted(xs, reverse=True)"),
        Op("remove repeated values, keeping the first occurrence of each", lambda xs: list(dict.fromkeys(xs)), "xs = list(dict.fromkeys(xs))"),
        Op(f"keep only the first {n} elements", lambda xs: xs[:n], f"xs = xs[:{n}]"),
        Op(f"remove the first {k} elements", lambda xs: xs[k:], f"xs = xs[{k}:]"),
        Op("replace the list by its running sums (element i becomes the sum of elements 0..i)",
           lambda xs: [sum(xs[: i + 1]) for i in range(len(xs))], "xs = [sum(xs[:i + 1]) for i in range(len(xs))]"),
        Op("replace the list by the differences of neighbours (b[i] = a[i+1] - a[i]; fewer than 2 elements give [])",
           lambda xs: [b - a for a, b in zip(xs, xs[1:])], "xs = [b - a for a, b in zip(xs, xs[1:])]"),
        Op("keep the elements at even positions (0, 2, 4, ...)", lambda xs: xs[::2], "xs = xs[::2]"),
        Op("square every element", lambda xs: [x * x for x in xs], "xs = [x * x for x in xs]"),
        Op(f"clamp every element to the range [{lo}, {hi}]", lambda xs: [min(max(x, lo), hi) for x in xs], f"xs = [min(max(x, {lo}), {hi}) for x in xs]"),
        Op(f"rotate the list left by {k} positions (k modulo the length; [] stays [])", lambda xs: _rotate(xs, k),
           f"xs = xs[{k} % len(xs):] + xs[:{k} % len(xs)] if xs else xs"),
    ]  # fmt: skip


def _str_ops(rng: random.Random) -> list[Op]:
    a, b = rng.sample("abcdefghij", 2)
    n, k = rng.randint(3, 8), rng.randint(1, 4)
    return [
        Op("convert to upper case", str.upper, "xs = xs.upper()"),
        Op("reverse the string", lambda s: s[::-1], "xs = xs[::-1]"),
        Op("remove every vowel (a, e, i, o, u, either case)", lambda s: "".join(ch for ch in s if ch.lower() not in "aeiou"),
           "xs = ''.join(ch for ch in xs if ch.lower() not in 'aeiou')"),
        Op(f"replace every '{a}' by '{b}' (lower case only)", lambda s: s.replace(a, b), f"xs = xs.replace({a!r}, {b!r})"),
        Op("keep only the letters", lambda s: "".join(ch for ch in s if ch.isalpha()), "xs = ''.join(ch for ch in xs if ch.isalpha())"),
        Op("collapse runs of the same character into one", lambda s: "".join(ch for i, ch in enumerate(s) if i == 0 or s[i - 1] != ch),
           "xs = ''.join(ch for i, ch in enumerate(xs) if i == 0 or xs[i - 1] != ch)"),
        Op(f"rotate left by {k} characters (k modulo the length; '' stays '')", lambda s: _rotate(s, k),
           f"xs = xs[{k} % len(xs):] + xs[:{k} % len(xs)] if xs else xs"),
        Op(f"keep only the first {n} characters", lambda s: s[:n], f"xs = xs[:{n}]"),
        Op("swap the case of every letter", str.swapcase, "xs = xs.swapcase()"),
    ]  # fmt: skip


FUNC_NAMES = ["transform", "process", "pipeline", "apply_steps", "solve"]


class CodeFunctionSynthesis(Environment):
    name: ClassVar[str] = "code_function_synthesis"
    sandboxed = True  # runs model-written code
    domain: ClassVar[str] = "code"
    max_concurrency: ClassVar[int] = 4
    score_timeout_s: ClassVar[float] = 30.0

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = rng.choice(["list", "str"])
        n_ops, max_len, n_tests = min(1 + difficulty, 9), 4 + 2 * difficulty, 5 + difficulty
        pool = _list_ops(rng) if kind == "list" else _str_ops(rng)
        ops = [rng.choice(pool) for _ in range(n_ops)]
        func = rng.choice(FUNC_NAMES)
        inputs = [[_random_input(rng, kind, 0)]] + [[_random_input(rng, kind, max_len)] for _ in range(n_tests - 1)]
        expected = [normalise(_apply(ops, args[0])) for args in inputs]
        typ = "list[int]" if kind == "list" else "str"
        steps = "\n".join(f"{i + 1}. {op.text}" for i, op in enumerate(ops))
        example = inputs[1][0]
        prompt = (
            f"Write a Python function `{func}(xs: {typ}) -> {typ}` that applies these steps, in order, "
            f"to its argument and returns the result:\n{steps}\n\n"
            f"Example: {func}({example!r}) returns {_apply(ops, example)!r}.\n"
            "Do not read input or print anything; hidden tests call the function. Use only the standard library.\n"
            "Put your code between <answer> and </answer> (a ```python fence inside is fine)."
        )
        return Task(
            self.name, seed, difficulty, prompt, answer=_reference_code(ops, func, typ),
            hidden={"func": func, "inputs": inputs, "expected": expected, "kind": kind, "ops": [o.code for o in ops]},
            stats={"ops": float(n_ops), "tests": float(n_tests), "max_len": float(max_len)},
        )  # fmt: skip

    def score(self, task: Task, completion: str) -> Score:
        code = extract_code(completion)
        if code is None:
            return Score.binary(False, pass_rate=0.0)
        run = run_harness(code, "function", task.hidden["inputs"], func=task.hidden["func"])
        if run.results is None:
            return Score.binary(False, pass_rate=0.0)
        passed = sum("error" not in r and r.get("value") == e for r, e in zip(run.results, task.hidden["expected"]))
        # Binary accuracy drives the reward; the pass rate is logged only (partial credit gets gamed).
        return Score.binary(passed == len(run.results), pass_rate=passed / len(run.results))

    def reference_solution(self, task: Task) -> str:
        return fence(task.answer)

    def bad_answers(self, task: Task) -> list[str]:
        h = task.hidden
        typ = "list[int]" if h["kind"] == "list" else "str"
        sentinel = "[0]" if h["kind"] == "list" else "'#'"
        body = "\n".join(f"    {line}" for line in h["ops"])
        bad = [f"def {h['func']}(xs: {typ}) -> {typ}:\n{body}\n    return xs + {sentinel}"]
        shorter = "\n".join(f"    {line}" for line in h["ops"][:-1]) or "    pass"
        if any(normalise(args[0]) != e for args, e in zip(h["inputs"], h["expected"])):
            bad.append(f"def {h['func']}(xs):\n    return xs")
        bad.append(f"def {h['func']}(xs):\n{shorter}\n    return xs")
        # A banner and exit code 0 mean nothing: only compared outputs count.
        banner = "print('PASSED')\nimport sys\nsys.exit(0)"
        return [fence(b) for b in bad if _differs(b, h)] + [fence(banner)]

    def worked_response(self, task: Task) -> str:
        steps = "\n".join(f"Step {i + 1} becomes `{line}`." for i, line in enumerate(task.hidden["ops"]))
        return f"Translate each step into one line acting on `xs`:\n{steps}\nThen return `xs`.\n" + fence(task.answer)


def _random_input(rng: random.Random, kind: str, max_len: int) -> Any:
    n = rng.randint(0 if max_len == 0 else 1, max_len)
    if kind == "list":
        return [rng.randint(-20, 40) for _ in range(n)]
    return "".join(rng.choice("abcdefghijABCDE aeiou.,xyz") for _ in range(n))


def _apply(ops: list[Op], value: Any) -> Any:
    for op in ops:
        value = op.fn(value)
    return value


def _reference_code(ops: list[Op], func: str, typ: str) -> str:
    body = "\n".join(f"    {op.code}" for op in ops)
    return f"def {func}(xs: {typ}) -> {typ}:\n{body}\n    return xs"


def _differs(code: str, hidden: dict) -> bool:
    """A bad answer must really be wrong on some hidden test (checked in-process: the code is ours)."""
    g: dict = {}
    try:
        exec(compile(code, "<bad>", "exec"), g)  # trusted: generated by this module, not by a model
        fn = g.get(hidden["func"])
        if fn is None:
            return True
        return any(normalise(fn(*args)) != e for args, e in zip(hidden["inputs"], hidden["expected"]))
    except SystemExit:
        return True
