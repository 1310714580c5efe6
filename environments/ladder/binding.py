"""ladder_binding: resolve a chain of variable bindings to its digit.

    "d=7 a=4 e=d b=a f=e c=b c?"  ->  <answer>4</answer>

The queried variable is bound to another variable D-1 times before a digit; a distractor
chain of the same length ends in another digit. As in a program, every variable is bound
before it is used; the two chains' lines are interleaved at random. Step s resolves one
binding (the variable or digit reached after s look-ups); the line that binds the s-th
variable of a chain holds that chain's digit as a dense target of depth s; below it, loop
l < s there can hold the variable reached after l look-ups (a partial target).
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
    partial_alphabet = VARS

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        names = rng.sample(VARS, 2 * difficulty)
        chain, other = names[:difficulty], names[difficulty:]
        value, decoy = rng.sample(DIGITS, 2)
        queues = []
        for vars_, digit in ((chain, value), (other, decoy)):
            # vars_[0] holds the digit, vars_[i] = vars_[i-1]: (line, depth of the digit, digit, reached after
            # 1..i look-ups)
            queues.append([(f"{vars_[0]}={digit}", 1, digit, [])]
                          + [(f"{vars_[i]}={vars_[i - 1]}", i + 1, digit, [vars_[i - l] for l in range(1, i + 1)])
                             for i in range(1, len(vars_))])
        order = [0] * difficulty + [1] * difficulty
        rng.shuffle(order)  # interleave the chains, each in its own order
        prompt, dense, partial = "", [], []
        for q in order:
            line, depth, digit, reached = queues[q].pop(0)
            prompt += line
            dense.append((len(prompt), depth, digit))
            partial += [(len(prompt), loop, var) for loop, var in enumerate(reached, 1)]
            prompt += " "
        steps = [chain[i] for i in range(difficulty - 2, -1, -1)] + [value]  # c -> b -> a -> 4
        return self.make_task(seed, difficulty, f"{prompt}{chain[-1]}?", steps, dense, partial)
