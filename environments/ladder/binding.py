"""ladder_binding: resolve a chain of variable bindings to its digit.

    "b=a d=7 c=b a=4 e=d f=e c?"  ->  <answer>4</answer>

The queried variable is bound to another variable D-1 times before a digit; a distractor
chain of the same length ends in another digit. Step s resolves one binding (the variable
or digit reached after s look-ups).
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.ladder.base import LadderEnvironment

VARS = "abcdefghijklmnopqrstuvwxyz"
DIGITS = "0123456789"


class LadderBinding(LadderEnvironment):
    name = "ladder_binding"
    alphabet = DIGITS

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        names = rng.sample(VARS, 2 * difficulty)
        chain, other = names[:difficulty], names[difficulty:]
        value, decoy = rng.sample(DIGITS, 2)
        lines = []
        for vars_, digit in ((chain, value), (other, decoy)):
            lines.append(f"{vars_[0]}={digit}")  # vars_[0] holds the digit, vars_[i] = vars_[i-1]
            lines += [f"{vars_[i]}={vars_[i - 1]}" for i in range(1, len(vars_))]
        rng.shuffle(lines)
        query = chain[-1]
        steps = [chain[i] for i in range(difficulty - 2, -1, -1)] + [value]  # c -> b -> a -> 4
        return self.make_task(seed, difficulty, f"{' '.join(lines)} {query}?", steps)
