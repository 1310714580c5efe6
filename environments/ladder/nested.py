"""ladder_nested: a nested expression of one-digit numbers, evaluated mod 10 from the inside out.

    "(((3+4)*2)-5)%10?"  ->  <answer>9</answer>

D operations nest D levels deep; step s is the innermost s levels' value mod 10, a dense target
at the bracket that closes level s.
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.ladder.base import LadderEnvironment

OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


class LadderNested(LadderEnvironment):
    name = "ladder_nested"
    alphabet = "0123456789"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        value = rng.randrange(10)
        inner, tails, steps = str(value), [], []
        for _ in range(difficulty):
            op, b = rng.choice("+-*"), rng.randrange(1, 10)
            tails.append(f"{op}{b})")
            value = OPS[op](value, b) % 10
            steps.append(str(value))
        expr = "(" * difficulty + inner
        dense = []
        for s, tail in enumerate(tails, 1):
            expr += tail
            dense.append((len(expr), s, steps[s - 1]))  # level s closes here
        return self.make_task(seed, difficulty, f"{expr}%10?", steps, dense)
