"""ladder_nested: a nested expression of one-digit numbers, evaluated mod 5 from the inside out.

    "(((3+4)*2)-1)%5?"  ->  <answer>3</answer>

D operations (+, -, * by 1..4) nest D levels deep; step s is the innermost s levels' value mod 5,
a dense target at the bracket that closes level s. Mod 5 rather than 10: one operation is a table
of 5 x 12 entries, which the ladder's small models learn in a few hundred steps (the 10 x 27 table
of mod 10 was still at 0.25-0.78 after 1,200), so D = 1 tests the format and D >= 2 the chaining.
Every operation is a map x -> a*x + c mod 5 with a != 0 (multiplying by 1..4 is invertible mod
5), so the last i + 1 operations before the bracket closing level s compose into one of 20 such
maps: loop i < s's partial target there, named "abcdefghijklmnopqrst"[5*(a-1) + c].
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.ladder.base import LadderEnvironment

MODULUS = 5
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
MAP_NAMES = "abcdefghijklmnopqrst"


def compose(ops: list[tuple[str, int]]) -> str:
    """The name of the map x -> a*x + c mod 5 that applies `ops` ((operator, operand), innermost first)."""
    m = MODULUS
    a, c = 1, 0
    for op, b in ops:
        a, c = (a * b, c * b) if op == "*" else (a, c + (b if op == "+" else -b))
    return MAP_NAMES[m * (a % m - 1) + c % m]


class LadderNested(LadderEnvironment):
    name = "ladder_nested"
    modulus = MODULUS
    alphabet = "01234"
    partial_alphabet = MAP_NAMES

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        m = self.modulus
        value = rng.randrange(m)
        inner, tails, steps, ops = str(value), [], [], []
        for _ in range(difficulty):
            op, b = rng.choice("+-*"), rng.randrange(1, m)
            tails.append(f"{op}{b})")
            ops.append((op, b))
            value = OPS[op](value, b) % m
            steps.append(str(value))
        expr = "(" * difficulty + inner
        dense, partial = [], []
        for s, tail in enumerate(tails, 1):
            expr += tail
            dense.append((len(expr), s, steps[s - 1]))  # level s closes here
            partial += [(len(expr), i, compose(ops[s - 1 - i:s])) for i in range(1, s)]
        return self.make_task(seed, difficulty, f"{expr}%{m}?", steps, dense, partial)
