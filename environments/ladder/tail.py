"""ladder_tail: the tail of a linked list whose links are back-distances.

    "tail a0 k2 c1 f0 b3 e1 h0 d2 g1 j2?"  ->  <answer>f</answer>

A row of cells, each a letter and a link: the cell that many cells back (0: the cell is a
tail). From the last cell, follow the links until a tail: D links, through cells whose
letters are all different, past decoy tails the links jump over. Every cell's chain ends
at some tail (links never reach before the first cell), so every cell whose chain takes
n <= D links holds its tail's letter as a dense target of depth n at its link digit; below
it, loop l < n can hold the letter l links back (a partial target). Each step reads the
cell its own link points at: the read's distance is the cell's own digit, not a fixed
offset, and it is the same at every loop (loop l reads there what loop l - 1 held).
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.ladder.base import LadderEnvironment

LETTERS = "abcdefghijklmnopqrstuvwxyz"
HEAD = "tail "
MAX_LINK = 3
DECOY_TAILS = 2


def follow(links: list[int], i: int) -> list[int]:
    """The cells visited from cell `i` to its tail, `i` excluded (empty when `i` is a tail)."""
    path = []
    while links[i]:
        i -= links[i]
        path.append(i)
    return path


class LadderTail(LadderEnvironment):
    name = "ladder_tail"
    alphabet = LETTERS

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        n = min(2 * difficulty + 6, 22)  # 22 cells: 71 bytes at most
        letters = rng.sample(LETTERS, n)
        links: list[int | None] = [None] * n
        i = n - 1
        for left in range(difficulty, 0, -1):  # the answer's chain: `left` links still to place from cell i
            gap = rng.randint(1, min(MAX_LINK, i - (left - 1)))
            links[i], i = gap, i - gap
        links[i] = 0
        free = [j for j in range(n) if links[j] is None]
        decoys = set(rng.sample(free, min(DECOY_TAILS, len(free))))
        for j in free:
            links[j] = 0 if j == 0 or j in decoys or rng.random() < 0.2 else rng.randint(1, min(MAX_LINK, j))
        cells = [f"{a}{k}" for a, k in zip(letters, links)]
        dense, partial = [], []
        for j in range(n):
            path = follow(links, j)
            if 1 <= len(path) <= difficulty:
                end = len(HEAD) + 3 * j + 2  # through cell j's digit
                dense.append((end, len(path), letters[path[-1]]))
                partial += [(end, loop, letters[path[loop - 1]]) for loop in range(1, len(path))]
        steps = [letters[j] for j in follow(links, n - 1)]
        return self.make_task(seed, difficulty, f"{HEAD}{' '.join(cells)}?", steps, dense, partial)
