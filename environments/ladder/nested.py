"""ladder_nested: a nested expression of one-digit numbers in postfix notation, evaluated mod 3.

    "12+1*2-3%?"  ((((1+2)*1)-2)%3)  ->  <answer>1</answer>

D operations (+, -, * by 1..2) nest D levels deep, written in postfix (reverse Polish)
notation: each operation's operand and operator follow the expression they apply to, so the
innermost operation comes first and every step reads the value of the one before two
characters back. Step s is the innermost s levels' value mod 3, a dense target at the s-th
operator. Every operation is a map x -> a*x + c mod 3 with a != 0, so the last i operations up
to the s-th operator compose into one of the six such maps: loop i < s's partial target there
(loop 1 reads its own operation, each further loop composes it with what the operator before
held a loop earlier), named "abcdef"[3*(a-1) + c].

Why this form (README, elastic depth): with the ladder's 176k-parameter models and 1,200 SFT
steps, the bracketed infix form `(((3+4)*2)-1)%5` never chained a second operation (0.11-0.38
after loop 2, chance 0.2), postfix mod 5 chained the second on some seeds and the third on none
(its composition table is 20 maps x 12 operations), and postfix mod 3 (6 maps x 6 operations,
the size of the automaton's) chained all three on four of four runs.
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.ladder.base import LadderEnvironment

MODULUS = 3
OPS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}
MAP_NAMES = "abcdef"


def compose(ops: list[tuple[str, int]]) -> str:
    """The name of the map x -> a*x + c mod 3 that applies `ops` ((operator, operand), innermost first)."""
    m = MODULUS
    a, c = 1, 0
    for op, b in ops:
        a, c = (a * b, c * b) if op == "*" else (a, c + (b if op == "+" else -b))
    return MAP_NAMES[m * (a % m - 1) + c % m]


class LadderNested(LadderEnvironment):
    name = "ladder_nested"
    modulus = MODULUS
    alphabet = "012"
    partial_alphabet = MAP_NAMES

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        m = self.modulus
        value = rng.randrange(m)
        expr, dense, partial, steps, ops = str(value), [], [], [], []
        for s in range(1, difficulty + 1):
            op, b = rng.choice("+-*"), rng.randrange(1, m)
            ops.append((op, b))
            value = OPS[op](value, b) % m
            steps.append(str(value))
            expr += f"{b}{op}"
            dense.append((len(expr), s, steps[-1]))  # the s-th operator: level s is complete here
            partial += [(len(expr), i, compose(ops[s - i:s])) for i in range(1, s)]
        return self.make_task(seed, difficulty, f"{expr}{m}%?", steps, dense, partial)
