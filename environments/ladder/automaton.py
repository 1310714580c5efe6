"""ladder_automaton: run a token on a 5-position ring through D moves.

    "at 2 do RFLLF?"  ->  <answer>1</answer>

Moves: R (p+1 mod 5), L (p-1 mod 5), F (4-p: a reflection). Rotations and reflections do
not commute (the dihedral group of order 10), so the moves cannot be summed up in any
order: step s is the position after the first s moves, a dense target at the s-th move.
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.ladder.base import LadderEnvironment

SIZE = 5
MOVES = {"R": lambda p: (p + 1) % SIZE, "L": lambda p: (p - 1) % SIZE, "F": lambda p: SIZE - 1 - p}


class LadderAutomaton(LadderEnvironment):
    name = "ladder_automaton"
    alphabet = "".join(str(i) for i in range(SIZE))

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        start = rng.randrange(SIZE)
        moves = "".join(rng.choice("RLF") for _ in range(difficulty))
        steps, p = [], start
        for m in moves:
            p = MOVES[m](p)
            steps.append(str(p))
        head = f"at {start} do "
        dense = [(len(head) + s, s, steps[s - 1]) for s in range(1, difficulty + 1)]
        return self.make_task(seed, difficulty, f"{head}{moves}?", steps, dense)
