"""ladder_pointer: follow a successor map for D hops ("list tail" with a fixed hop count).

    "g>c a>h c>e h>g e>a ... from a 3 hops?"  ->  <answer>e</answer>

The nodes form one cycle in a shuffled order, so each hop needs the previous one's result.
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.ladder.base import LadderEnvironment

NODES = "abcdefghijklmnopqrstuvwxyz"


class LadderPointer(LadderEnvironment):
    name = "ladder_pointer"
    alphabet = NODES
    n_nodes = 8

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        nodes = rng.sample(NODES, self.n_nodes)
        succ = {a: nodes[(i + 1) % len(nodes)] for i, a in enumerate(nodes)}  # one cycle: hops never repeat early
        edges = [f"{a}>{b}" for a, b in succ.items()]
        rng.shuffle(edges)
        start = rng.choice(nodes)
        steps, node = [], start
        for _ in range(difficulty):
            node = succ[node]
            steps.append(node)
        return self.make_task(seed, difficulty, f"{' '.join(edges)} from {start} {difficulty} hops?", steps)
