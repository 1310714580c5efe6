"""Multi-digit integer arithmetic: add/subtract chains, long multiplication, division with remainder.

D sets the digit count (and, for chains, the number of terms); the answer is
an exact integer (or quotient and remainder). Worked solutions spell out the
running totals, partial products or long-division steps, one line each.
"""

from __future__ import annotations

import random
import re

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv, parse_int
from environments.verifiers import math_equal, normalise_math

KINDS = ("addsub", "mul", "divmod")
_DIVMOD_RE = re.compile(r"(\S+)\s*r\s*(\S+)", re.IGNORECASE)


def _rand_digits(rng: random.Random, digits: int) -> int:
    lo = 10 ** (digits - 1) if digits > 1 else 1
    return rng.randint(lo, 10**digits - 1)


class ArithMultidigit(SingleTurnEnv):
    name = "arith_multidigit"
    domain = "math"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = KINDS[seed % len(KINDS)]
        d = difficulty
        if kind == "addsub":
            terms = 2 + (d - 1) // 3
            nums = [_rand_digits(rng, d) for _ in range(terms)]
            ops = [rng.choice("+-") for _ in range(terms - 1)]
            text = str(nums[0]) + "".join(f" {o} {n}" for o, n in zip(ops, nums[1:]))
            answer: object = sum(n if o == "+" else -n for o, n in zip("+" + "".join(ops), nums))
            stats = {"digits": d, "terms": terms}
            how = "Answer with the integer only."
            hidden = {"nums": nums, "ops": ops}
        elif kind == "mul":
            a, b = _rand_digits(rng, d), _rand_digits(rng, (d + 1) // 2)
            text, answer = f"{a} * {b}", a * b
            stats = {"digits": d, "terms": 2}
            how = "Answer with the integer only."
            hidden = {"nums": [a, b]}
        else:
            a, b = _rand_digits(rng, d + 1), _rand_digits(rng, max(1, (d + 1) // 2))
            b = max(b, 2)
            text, answer = f"{a} divided by {b}", [a // b, a % b]
            stats = {"digits": d + 1, "terms": 2}
            how = "Answer with the quotient, the letter r, then the remainder, e.g. 12 r 3."
            hidden = {"nums": [a, b]}
        prompt = f"Compute {text}. {how}\n{ANSWER_INSTRUCTION}"
        return Task(self.name, seed, difficulty, prompt, answer, {"kind": kind, **hidden}, stats)

    def check(self, task: Task, span: str) -> bool:
        if task.hidden["kind"] == "divmod":
            m = _DIVMOD_RE.fullmatch(normalise_math(span))
            if not m:
                return False
            return [parse_int(m.group(1)), parse_int(m.group(2))] == task.answer
        return math_equal(span, str(task.answer))  # the dataset environments' math checker: 55 = 55.0 = \boxed{55}

    def answer_text(self, task: Task) -> str:
        if task.hidden["kind"] == "divmod":
            return f"{task.answer[0]} r {task.answer[1]}"
        return str(task.answer)

    def wrong_texts(self, task: Task) -> list[str]:
        if task.hidden["kind"] == "divmod":
            q, r = task.answer
            return [f"{q + 1} r {r}", f"{q} r {r + 1}", f"{r} r {q}" if r != q else f"{q} r {r + 2}"]
        a = task.answer
        return [str(a + 1), str(a - 10), str(-a) if a else "7"]

    def solution_steps(self, task: Task) -> list[str]:
        kind, nums = task.hidden["kind"], task.hidden["nums"]
        if kind == "addsub":
            total, lines = nums[0], []
            for op, n in zip(task.hidden["ops"], nums[1:]):
                new = total + n if op == "+" else total - n
                lines.append(f"{total} {op} {n} = {new}")
                total = new
            return lines
        if kind == "mul":
            return _long_mul_steps(*nums)
        return _long_div_steps(*nums)


def _long_mul_steps(a: int, b: int) -> list[str]:
    """One partial product per digit of b, then their sum."""
    digits = str(b)[::-1]
    if len(digits) == 1:
        return [f"{a} * {b} = {a * b}"]
    parts = []
    lines = []
    for k, ch in enumerate(digits):
        part = a * int(ch) * 10**k
        parts.append(part)
        lines.append(f"{a} * {int(ch) * 10**k} = {part}")
    lines.append(" + ".join(map(str, parts)) + f" = {a * b}")
    return lines


def _long_div_steps(a: int, b: int) -> list[str]:
    """Long division: bring down one digit at a time, divide, keep the remainder."""
    lines, rem, quotient = [], 0, ""
    for ch in str(a):
        cur = rem * 10 + int(ch)
        q, rem = divmod(cur, b)
        quotient += str(q)
        if cur >= b or quotient.lstrip("0"):
            lines.append(f"{cur} / {b} = {q} r {rem}")
    return lines + [f"quotient {int(quotient)}, remainder {rem}"]
