"""Symbolic algebra: linear systems, polynomial expansion, derivatives.

Rational answers are compared exactly. Expressions are compared by their
normal form (monomial -> rational coefficient) from our own parser, never by
`sympify`; the answer must also be written expanded (no parentheses, like
terms combined) so echoing the factored prompt does not count.
"""

from __future__ import annotations

import math
import random
import re
from fractions import Fraction

from environments.base import Task
from environments.single._common import (
    ANSWER_INSTRUCTION,
    SingleTurnEnv,
    fmt_num,
    parse_expanded_poly,
    parse_poly,
    poly_add,
    poly_mul,
    poly_str,
)
from environments.verifiers import math_equal, strip_wrappers

KINDS = ("linear", "expand", "derivative")
VARS = "xyzw"
_ASSIGN_RE = re.compile(r"\s*([a-z])\s*=\s*(.+?)\s*")


def _linear_text(coefs: list[int], names: str) -> str:
    """ "3x - y + 2z" in the given variable order (poly_str would sort the names)."""
    out = ""
    for v, c in zip(names, coefs):
        if c == 0:
            continue
        mag = "" if abs(c) == 1 else str(abs(c))
        sign = ("-" if c < 0 else "") if not out else (" - " if c < 0 else " + ")
        out += f"{sign}{mag}{v}"
    return out or "0"


def _solve_steps(mat: list[list[int]], rhs: list[int], names: str) -> tuple[list[Fraction], list[str]]:
    """Fraction-free Gauss-Jordan elimination: row_r <- p*row_r - q*row_pivot, divided by its gcd.

    Returns the solution and one line (the whole system) per eliminated variable.
    """
    n = len(names)
    a = [list(r) + [b] for r, b in zip(mat, rhs)]
    lines = []
    for col in range(n):
        piv = next(r for r in range(col, n) if a[r][col] != 0)  # StopIteration: singular
        a[col], a[piv] = a[piv], a[col]
        for r in range(n):
            if r != col and a[r][col] != 0:
                p, q = a[col][col], a[r][col]
                row = [p * x - q * y for x, y in zip(a[r], a[col])]
                g = math.gcd(*row) or 1
                sgn = -1 if next(x for x in row if x) < 0 else 1
                a[r] = [sgn * x // g for x in row]
        if n > 1:
            lines.append(f"eliminate {names[col]}: " + "; ".join(f"{_linear_text(r[:n], names)} = {r[n]}" for r in a))
    sol = [Fraction(a[i][n], a[i][i]) for i in range(n)]
    return sol, lines


class AlgebraSymbolic(SingleTurnEnv):
    name = "algebra_symbolic"
    domain = "math"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = KINDS[seed % len(KINDS)]
        c = 2 + difficulty
        gen = {"linear": self._linear, "expand": self._expand, "derivative": self._derivative}[kind]
        prompt, answer, hidden, size = gen(rng, difficulty, c)
        stats = {"size": size, "coef_max": c}
        return Task(
            self.name, seed, difficulty, f"{prompt}\n{ANSWER_INSTRUCTION}", answer, {"kind": kind, **hidden}, stats
        )

    def _linear(self, rng: random.Random, d: int, c: int) -> tuple[str, object, dict, int]:
        n = 1 + (d - 1) // 3
        names = VARS[:n]
        while True:
            mat = [[rng.randint(-c, c) for _ in range(n)] for _ in range(n)]
            sol = [rng.randint(-c, c) for _ in range(n)]
            rhs = [sum(a * s for a, s in zip(r, sol)) for r in mat]
            try:
                got, lines = _solve_steps(mat, rhs, names)
            except StopIteration:  # singular matrix: draw again
                continue
            break
        eqs = [f"{_linear_text(r, names)} = {b}" for r, b in zip(mat, rhs)]
        how = ", ".join(f"{v}=..." for v in names)
        prompt = f"Solve for {', '.join(names)}: " + "; ".join(eqs) + f". Answer as {how} with exact numbers."
        answer = {v: fmt_num(x) for v, x in zip(names, got)}
        lines.append(", ".join(f"{v} = {x}" for v, x in answer.items()))
        return prompt, answer, {"lines": lines}, n

    def _expand(self, rng: random.Random, d: int, c: int) -> tuple[str, object, dict, int]:
        n_factors = 2 + (d - 1) // 4
        two_vars = d >= 6
        factors, poly = [], {(): Fraction(1)}
        for _ in range(n_factors):
            a, b = rng.choice([k for k in range(-c, c + 1) if k]), rng.choice([k for k in range(-c, c + 1) if k])
            a = abs(a) if d <= 2 else a
            second = "y" if two_vars and rng.random() < 0.5 else ""
            f = {(("x", 1),): Fraction(a), ((("y", 1),) if second else ()): Fraction(b)}
            factors.append(f"({poly_str(f)})")
            poly = poly_mul(poly, f)
        text = "".join(factors)
        prompt = f"Expand {text}. Write the result as a sum of terms with like terms combined and no parentheses."
        lines = _expand_lines(factors)
        return prompt, poly_str(poly), {"factored": text, "lines": lines}, n_factors

    def _derivative(self, rng: random.Random, d: int, c: int) -> tuple[str, object, dict, int]:
        degree = d + 1
        poly = {(("x", k),) if k else (): Fraction(rng.randint(-c, c)) for k in range(degree + 1)}
        poly[(("x", degree),)] = Fraction(rng.choice([k for k in range(-c, c + 1) if k]))
        poly = {m: v for m, v in poly.items() if v}
        deriv = {((("x", m[0][1] - 1),) if m[0][1] > 1 else ()): v * m[0][1] for m, v in poly.items() if m}
        text = poly_str(poly)
        prompt = f"Differentiate f(x) = {text} with respect to x. Write f'(x) expanded, with no parentheses."
        lines = [f"d/dx {poly_str({m: v})} = {poly_str(_d1(m, v))}" for m, v in sorted(poly.items(), reverse=True) if m]
        return prompt, poly_str(deriv), {"poly": text, "lines": lines}, degree

    def check(self, task: Task, span: str) -> bool:
        if task.hidden["kind"] == "linear":
            got = {}
            for part in span.split(","):
                m = _ASSIGN_RE.fullmatch(part)
                if not m or m.group(1) in got:
                    return False
                got[m.group(1)] = m.group(2)
            want = {v: fmt_num(Fraction(x)) for v, x in task.answer.items()}
            return got.keys() == want.keys() and all(math_equal(got[v], want[v]) for v in want)
        # the expanded form is part of the task, so polynomials keep their own parser (wrappers removed)
        return parse_expanded_poly(strip_wrappers(span)) == parse_poly(task.answer)

    def answer_text(self, task: Task) -> str:
        if task.hidden["kind"] == "linear":
            return ", ".join(f"{v}={x}" for v, x in task.answer.items())
        return task.answer

    def wrong_texts(self, task: Task) -> list[str]:
        kind = task.hidden["kind"]
        if kind == "linear":
            items = list(task.answer.items())
            items = [(v, Fraction(x)) for v, x in items]
            off = [(v, x + (1 if i == 0 else 0)) for i, (v, x) in enumerate(items)]
            return [
                ", ".join(f"{v}={fmt_num(x)}" for v, x in off),
                ", ".join(f"{v}={fmt_num(-x - 1)}" for v, x in items),
            ]
        poly = parse_poly(task.answer)
        bumped = dict(poly)
        bumped[()] = bumped.get((), Fraction(0)) + 1
        wrong = [poly_str({m: v for m, v in bumped.items() if v})]
        wrong.append(task.hidden["factored"] if kind == "expand" else task.hidden["poly"])
        return wrong

    def solution_steps(self, task: Task) -> list[str]:
        return task.hidden["lines"]


def _d1(m: tuple, v: Fraction) -> dict:
    k = m[0][1]
    return {((("x", k - 1),) if k > 1 else ()): v * k}


def _expand_lines(factors: list[str]) -> list[str]:
    """Multiply the factors in one at a time: one partial product per term of the new factor, then the sum."""
    lines, acc = [], parse_poly(factors[0])
    for f in factors[1:]:
        parts = []
        for m, c in parse_poly(f).items():
            part = poly_mul(acc, {m: c})
            parts.append(part)
            lines.append(f"({poly_str(acc)}) * {poly_str({m: c})} = {poly_str(part)}")
        new = {}
        for part in parts:
            new = poly_add(new, part)
        lines.append(f"sum: {poly_str(new)}")
        acc = new
    return lines
