"""Long context graph walks: nodes at exactly depth k from a source (BFS), or parents of a node.

A directed graph is given as a long edge list. D sets the node count, the edge
count and the BFS depth. The answer is a set of nodes; accuracy is set
equality (F1 is logged as a shaped component, never rewarded).
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv, parse_list

KINDS = ("bfs", "parents")


def bfs_layers(adj: dict[str, list[str]], src: str, depth: int) -> list[list[str]]:
    """layers[i] = nodes whose shortest distance from src is exactly i, for i <= depth."""
    seen, layers = {src}, [[src]]
    for _ in range(depth):
        nxt = []
        for u in layers[-1]:
            for v in adj[u]:
                if v not in seen:
                    seen.add(v)
                    nxt.append(v)
        layers.append(sorted(nxt))
    return layers


def f1(got: set[str], want: set[str]) -> float:
    hit = len(got & want)
    return 0.0 if hit == 0 else 2 * hit / (len(got) + len(want))


class GraphwalksBfs(SingleTurnEnv):
    name = "graphwalks_bfs"
    domain = "long_context"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = KINDS[seed % len(KINDS)]
        n, depth = 5 + 5 * difficulty, 1 + difficulty // 3
        n_edges = 2 * n
        while True:
            nodes = [f"{i:04x}" for i in rng.sample(range(4096, 65536, 7), n)]
            edges = set()
            while len(edges) < n_edges:
                u, v = rng.sample(nodes, 2)
                edges.add((u, v))
            adj = {u: [] for u in nodes}
            for u, v in sorted(edges):  # set order differs between processes: sort first
                adj[u].append(v)
            target = rng.choice(nodes)
            if kind == "bfs":
                layers = bfs_layers(adj, target, depth)
                answer = layers[depth]
                question = f"Which nodes are at distance exactly {depth} from node {target} (shortest directed path)?"
                lines = [f"depth {i}: {', '.join(layer) or 'none'}" for i, layer in enumerate(layers)]
            else:
                answer = sorted(u for u, v in edges if v == target)
                question = f"Which nodes have an edge pointing to node {target}?"
                lines = [f"{u} -> {target}" for u in answer]
            if answer:
                break
        edge_list = sorted(sorted(edges), key=lambda _: rng.random())
        prompt = (
            "A directed graph has these edges (u -> v):\n"
            + "\n".join(f"{u} -> {v}" for u, v in edge_list)
            + f"\n{question} Answer with the node names separated by commas, in any order.\n{ANSWER_INSTRUCTION}"
        )
        stats = {"nodes": n, "edges": n_edges, "depth": depth}
        return Task(self.name, seed, difficulty, prompt, answer, {"lines": lines, "nodes": nodes}, stats)

    def check(self, task: Task, span: str) -> tuple[bool, dict[str, float]]:
        got = {x.lower() for x in parse_list(span)}
        want = set(task.answer)
        return got == want, {"f1": f1(got, want)}

    def answer_text(self, task: Task) -> str:
        return ", ".join(task.answer)

    def wrong_texts(self, task: Task) -> list[str]:
        extra = next(x for x in task.hidden["nodes"] if x not in task.answer)
        wrong = [", ".join(task.answer + [extra])]
        if len(task.answer) > 1:
            wrong.append(", ".join(task.answer[:-1]))
        else:
            wrong.append(extra)
        return wrong

    def solution_steps(self, task: Task) -> list[str]:
        return task.hidden["lines"]
