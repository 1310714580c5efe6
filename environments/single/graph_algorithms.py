"""Classic graph algorithms: shortest path, topological order, connected components, MST weight.

D sets the node and edge counts. Optimality is checked, not string equality:
any shortest path is accepted (a valid but longer path scores 0), any valid
topological order is accepted. Worked solutions trace Dijkstra, Kahn,
union-find and Kruskal one step per line.
"""

from __future__ import annotations

import heapq
import random
import re

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv, parse_int

KINDS = ("shortest_path", "topo_order", "components", "mst")
LABELS = "ABCDEFGHIJKLMNOP"


def _nodes_list(text: str) -> list[str]:
    """Node names from "A -> B -> C", "A, B, C" or "A B C"."""
    toks = [t for t in re.split(r"\s*(?:->|,|\s)\s*", text.strip()) if t]
    if not toks or len(toks) > 100:
        raise ValueError("bad node list")
    return [t.upper() for t in toks]


def dijkstra(n: int, edges: list[list], src: int, stop: int = -1) -> tuple[list[float], list[int], list[str]]:
    """Distances and predecessors from src; the trace ends when `stop` is settled."""
    adj: dict[int, list[tuple[int, int]]] = {i: [] for i in range(n)}
    for u, v, w in edges:
        adj[u].append((v, w))
        adj[v].append((u, w))
    dist, prev, done, lines = [float("inf")] * n, [-1] * n, [False] * n, []
    dist[src] = 0
    heap = [(0, src)]
    while heap:
        d, u = heapq.heappop(heap)
        if done[u]:
            continue
        done[u] = True
        lines.append(f"settle {LABELS[u]} at {d}" + (f" via {LABELS[prev[u]]}" if prev[u] >= 0 else ""))
        if u == stop:
            break
        for v, w in adj[u]:
            if d + w < dist[v]:
                dist[v], prev[v] = d + w, u
                heapq.heappush(heap, (d + w, v))
    return dist, prev, lines


def _find(parent: list[int], x: int) -> int:
    while parent[x] != x:
        x = parent[x]
    return x


def kruskal(n: int, edges: list[list]) -> tuple[int, list[str]]:
    parent, total, lines = list(range(n)), 0, []
    for u, v, w in sorted(edges, key=lambda e: (e[2], e[0], e[1])):
        ru, rv = _find(parent, u), _find(parent, v)
        if ru == rv:
            lines.append(f"{LABELS[u]}-{LABELS[v]} {w}: skip, would close a cycle")
        else:
            parent[ru] = rv
            total += w
            lines.append(f"{LABELS[u]}-{LABELS[v]} {w}: add, total {total}")
    return total, lines


def _connected_edges(rng: random.Random, n: int, extra: int, wmax: int) -> list[list]:
    """A random spanning tree plus `extra` further distinct edges, weights in 1..wmax."""
    order = rng.sample(range(n), n)
    pairs = {tuple(sorted((order[i], order[rng.randrange(i)]))) for i in range(1, n)}
    all_pairs = [(u, v) for u in range(n) for v in range(u + 1, n) if (u, v) not in pairs]
    pairs |= set(rng.sample(all_pairs, min(extra, len(all_pairs))))
    return [[u, v, rng.randint(1, wmax)] for u, v in sorted(pairs)]


class GraphAlgorithms(SingleTurnEnv):
    name = "graph_algorithms"
    domain = "algorithmic"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = KINDS[seed % len(KINDS)]
        n = 3 + difficulty
        h: dict = {"kind": kind, "n": n}
        if kind in ("shortest_path", "mst"):
            edges = _connected_edges(rng, n, difficulty, 3 + difficulty)
            h["edges"] = edges
            text = "Undirected weighted edges:\n" + "\n".join(f"{LABELS[u]}-{LABELS[v]} {w}" for u, v, w in edges)
            if kind == "shortest_path":
                s, t = rng.sample(range(n), 2)
                dist, prev, lines = dijkstra(n, edges, s, stop=t)
                path = [t]
                while path[-1] != s:
                    path.append(prev[path[-1]])
                answer: object = " -> ".join(LABELS[x] for x in reversed(path))
                h.update(s=s, t=t, best=dist[t], lines=lines + [f"path {answer}, length {dist[t]}"])
                q = f"Find a shortest path from {LABELS[s]} to {LABELS[t]}. "
                q += "Answer with the nodes in order, like A -> C -> B."
            else:
                answer, lines = kruskal(n, edges)
                h["lines"] = lines
                q = "What is the total weight of a minimum spanning tree? Answer with an integer."
        elif kind == "topo_order":
            perm = rng.sample(range(n), n)
            pairs = {(perm[i], perm[j]) for i in range(n) for j in range(i + 1, n)}
            edges = sorted(rng.sample(sorted(pairs), min(len(pairs), n + difficulty)))
            h["edges"] = [[u, v] for u, v in edges]
            answer, h["lines"] = self._kahn(n, edges)
            text = "Directed edges (u -> v means u must come before v):\n" + "\n".join(
                f"{LABELS[u]} -> {LABELS[v]}" for u, v in edges
            )
            q = f"Give an order of all {n} nodes in which every edge points forward. Answer like A, C, B."
        else:
            edges = sorted({tuple(sorted(rng.sample(range(n), 2))) for _ in range(n - 2)})
            h["edges"] = [list(e) for e in edges]
            answer, h["lines"] = self._components(n, edges)
            text = f"Nodes: {', '.join(LABELS[:n])}\nUndirected edges:\n" + "\n".join(
                f"{LABELS[u]}-{LABELS[v]}" for u, v in edges
            )
            q = "How many connected components does the graph have? Answer with an integer."
        prompt = f"{text}\n{q}\n{ANSWER_INSTRUCTION}"
        stats = {"nodes": n, "edge_budget": n + difficulty}
        return Task(self.name, seed, difficulty, prompt, answer, h, stats)

    @staticmethod
    def _kahn(n: int, edges: list) -> tuple[str, list[str]]:
        indeg = [0] * n
        for _, v in edges:
            indeg[v] += 1
        order, lines = [], []
        ready = sorted((i for i in range(n) if indeg[i] == 0), key=lambda i: LABELS[i])
        while ready:
            u = ready.pop(0)
            order.append(u)
            for a, b in edges:
                if a == u:
                    indeg[b] -= 1
                    if indeg[b] == 0:
                        ready.append(b)
            ready.sort(key=lambda i: LABELS[i])
            lines.append(f"take {LABELS[u]}; ready: {', '.join(LABELS[i] for i in ready) or 'none'}")
        return ", ".join(LABELS[i] for i in order), lines

    @staticmethod
    def _components(n: int, edges: list) -> tuple[int, list[str]]:
        parent, lines = list(range(n)), []
        for u, v in edges:
            ru, rv = _find(parent, u), _find(parent, v)
            if ru != rv:
                parent[ru] = rv
            lines.append(f"{LABELS[u]}-{LABELS[v]}: " + ("merge" if ru != rv else "already joined"))
        groups: dict[int, list[str]] = {}
        for i in range(n):
            groups.setdefault(_find(parent, i), []).append(LABELS[i])
        lines.append("components: " + " ".join("{" + ",".join(g) + "}" for g in groups.values()))
        return len(groups), lines

    def check(self, task: Task, span: str) -> bool:
        h = task.hidden
        kind, n = h["kind"], h["n"]
        if kind in ("components", "mst"):
            return parse_int(span) == task.answer
        names = _nodes_list(span)
        if any(x not in LABELS[:n] for x in names):
            return False
        idx = [LABELS.index(x) for x in names]
        if kind == "topo_order":
            pos = {v: i for i, v in enumerate(idx)}
            return len(idx) == n == len(pos) and all(pos[u] < pos[v] for u, v in h["edges"])
        weight = {frozenset((u, v)): w for u, v, w in h["edges"]}
        if idx[0] != h["s"] or idx[-1] != h["t"]:
            return False
        steps = [frozenset(p) for p in zip(idx, idx[1:])]
        return all(s in weight for s in steps) and sum(weight[s] for s in steps) == h["best"]

    def answer_text(self, task: Task) -> str:
        return str(task.answer)

    def wrong_texts(self, task: Task) -> list[str]:
        h = task.hidden
        if h["kind"] in ("components", "mst"):
            return [str(task.answer + 1), str(max(0, task.answer - 2))]
        if h["kind"] == "topo_order":
            names = task.answer.split(", ")
            return [", ".join(reversed(names)), ", ".join(names[:-1])]
        names = task.answer.split(" -> ")
        detours = [" -> ".join([names[0], x, names[-1]]) for x in LABELS[: h["n"]] if x not in (names[0], names[-1])]
        longer = [p for p in self._simple_paths(task) if not self.check(task, p)][:1]
        return [t for t in [" -> ".join(reversed(names))] + longer + detours[:2] if not self.check(task, t)]

    @staticmethod
    def _simple_paths(task: Task, limit: int = 200) -> list[str]:
        """Valid s-t paths (depth-first, at most `limit`), used to find a valid path that is not shortest."""
        h = task.hidden
        adj: dict[int, list[int]] = {i: [] for i in range(h["n"])}
        for u, v, _ in h["edges"]:
            adj[u].append(v)
            adj[v].append(u)
        out, stack = [], [[h["s"]]]
        while stack and len(out) < limit:
            path = stack.pop()
            if path[-1] == h["t"]:
                out.append(" -> ".join(LABELS[x] for x in path))
                continue
            stack += [path + [v] for v in adj[path[-1]] if v not in path]
        return out

    def solution_steps(self, task: Task) -> list[str]:
        return task.hidden["lines"]
