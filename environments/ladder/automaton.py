"""ladder_automaton: run a token on a 5-position ring through D moves.

    "at 2 do RFLLF?"  ->  <answer>1</answer>

Moves: R (p+1 mod 5), L (p-1 mod 5), F (4-p: a reflection). Rotations and reflections do
not commute (the dihedral group of order 10), so the moves cannot be summed up in any
order: step s is the position after the first s moves, a dense target at the s-th move.
Loop i < s can compose the i + 1 moves that end at the s-th one (each loop takes the map held
at the move before and applies its own move): a partial target naming that map, one of the
group's ten elements p -> a*p + b mod 5 (a = +-1), "abcde"[b] for a = 1 and "fghij"[b] for a = -1.
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.ladder.base import LadderEnvironment

SIZE = 5
MOVES = {"R": lambda p: (p + 1) % SIZE, "L": lambda p: (p - 1) % SIZE, "F": lambda p: SIZE - 1 - p}
MAPS = {"R": (1, 1), "L": (1, SIZE - 1), "F": (SIZE - 1, SIZE - 1)}  # each move as p -> a*p + b mod 5
MAP_NAMES = "abcdefghij"


def compose(moves: str) -> str:
    """The name of the map that applies `moves` in order."""
    a, b = 1, 0
    for m in moves:
        ma, mb = MAPS[m]
        a, b = (ma * a) % SIZE, (ma * b + mb) % SIZE
    return MAP_NAMES[b if a == 1 else SIZE + b]


class LadderAutomaton(LadderEnvironment):
    name = "ladder_automaton"
    alphabet = "".join(str(i) for i in range(SIZE))
    partial_alphabet = MAP_NAMES

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        start = rng.randrange(SIZE)
        moves = "".join(rng.choice("RLF") for _ in range(difficulty))
        steps, p = [], start
        for m in moves:
            p = MOVES[m](p)
            steps.append(str(p))
        head = f"at {start} do "
        dense = [(len(head) + s, s, steps[s - 1]) for s in range(1, difficulty + 1)]
        partial = [(len(head) + s, i, compose(moves[s - 1 - i:s])) for s in range(2, difficulty + 1) for i in range(1, s)]
        return self.make_task(seed, difficulty, f"{head}{moves}?", steps, dense, partial)
