"""ladder_nested: a nested expression of one-digit numbers, evaluated mod 5 from the inside out.

    "(((3+4)*2)-1)%5?"  ->  <answer>3</answer>

D operations (+, -, * by 1..4) nest D levels deep; step s is the innermost s levels' value mod 5,
a dense target at the bracket that closes level s. Mod 5 rather than 10: one operation is a table
of 5 x 12 entries, which the ladder's small models learn in a few hundred steps (the 10 x 27 table
of mod 10 was still at 0.25-0.78 after 1,200), so D = 1 tests the format and D >= 2 the chaining.
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.ladder.base import LadderEnvironment

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class LadderNested(LadderEnvironment):
    name = "ladder_nested"
    modulus = 5
    alphabet = "01234"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        m = self.modulus
        value = rng.randrange(m)
        inner, tails, steps = str(value), [], []
        for _ in range(difficulty):
            op, b = rng.choice("+-*"), rng.randrange(1, m)
            tails.append(f"{op}{b})")
            value = OPS[op](value, b) % m
            steps.append(str(value))
        expr = "(" * difficulty + inner
        dense = []
        for s, tail in enumerate(tails, 1):
            expr += tail
            dense.append((len(expr), s, steps[s - 1]))  # level s closes here
        return self.make_task(seed, difficulty, f"{expr}%{m}?", steps, dense)
