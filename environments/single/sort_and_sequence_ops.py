"""Sequence manipulation: multi-key sorts, chains of permutations, stack/queue traces.

D sets the number of items and of operations. The answer is an exact list
(comma-separated); the worked solution writes the sequence after every
operation.
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv, parse_list

KINDS = ("multikey_sort", "permute", "stack_queue")
NAMES = ["Ana", "Bo", "Cy", "Di", "Ed", "Flo", "Gia", "Hal", "Ivy", "Jon", "Kai", "Lu", "Max", "Nel"]
ITEMS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def _sort_task(rng: random.Random, d: int) -> tuple[str, list[str], list[str], dict]:
    n = 2 + d
    people = rng.sample(NAMES, n)
    rows = [{"name": p, "age": rng.randint(20, 20 + d), "score": rng.randint(1, 3 + d // 2)} for p in people]
    keys = [("score", rng.random() < 0.5), ("age", rng.random() < 0.5)][: 1 + (d >= 3)]
    table = "\n".join(f"{r['name']}: age {r['age']}, score {r['score']}" for r in rows)
    order = " then ".join(f"{k} {'descending' if desc else 'ascending'}" for k, desc in keys)
    rows_sorted = sorted(rows, key=lambda r: r["name"])
    for k, desc in reversed(keys):  # stable sorts, last key first
        rows_sorted.sort(key=lambda r: r[k], reverse=desc)
    answer = [r["name"] for r in rows_sorted]
    prompt = (
        f"Sort these people by {order}, breaking remaining ties by name (A to Z).\n{table}\n"
        "Answer with the names in order, separated by commas."
    )
    lines = [f"{r['name']} ({', '.join(f'{k} {r[k]}' for k, _ in keys)})" for r in rows_sorted]
    return prompt, answer, lines, {"size": n, "steps": len(keys)}


def _apply(seq: list[str], op: list) -> list[str]:
    kind = op[0]
    if kind == "swap":
        i, j = op[1], op[2]
        seq = seq[:]
        seq[i], seq[j] = seq[j], seq[i]
        return seq
    if kind == "rotate":
        k = op[1] % len(seq)
        return seq[k:] + seq[:k]
    if kind == "reverse":
        i, j = op[1], op[2]
        return seq[:i] + seq[i : j + 1][::-1] + seq[j + 1 :]
    return [seq[p] for p in op[1]]  # "perm": new position i holds the old item at p[i]


def _say(op: list) -> str:
    kind = op[0]
    if kind == "swap":
        return f"swap positions {op[1] + 1} and {op[2] + 1}"
    if kind == "rotate":
        return f"rotate left by {op[1]}"
    if kind == "reverse":
        return f"reverse positions {op[1] + 1} to {op[2] + 1}"
    return (
        f"rearrange by [{' '.join(str(p + 1) for p in op[1])}] (new position i takes the old item at the i-th number)"
    )


def _permute_task(rng: random.Random, d: int) -> tuple[str, list[str], list[str], dict]:
    n, steps = 4 + d // 2, d
    seq = list(ITEMS[:n])
    ops, lines = [], []
    kinds = ["swap", "rotate", "reverse"] + (["perm"] if d >= 4 else [])
    for _ in range(steps):
        kind = rng.choice(kinds)
        i, j = sorted(rng.sample(range(n), 2))
        op = {
            "swap": ["swap", i, j],
            "rotate": ["rotate", rng.randint(1, n - 1)],
            "reverse": ["reverse", i, j],
            "perm": ["perm", rng.sample(range(n), n)],
        }[kind]
        seq = _apply(seq, op)
        ops.append(op)
        lines.append(f"{_say(op)}: {' '.join(seq)}")
    steps_text = "\n".join(f"{k + 1}. {_say(op)}" for k, op in enumerate(ops))
    prompt = (
        f"Start with the sequence {' '.join(ITEMS[:n])} (positions count from 1). Apply in order:\n{steps_text}\n"
        "Answer with the final sequence, items separated by commas."
    )
    return prompt, seq, lines, {"size": n, "steps": steps}


def _stack_task(rng: random.Random, d: int) -> tuple[str, list[str], list[str], dict]:
    n_ops = 2 + 2 * d
    is_stack = rng.random() < 0.5
    store: list[str] = []
    ops, popped, lines, fresh = [], [], [], iter(rng.sample(range(10, 99), 60))
    for k in range(n_ops):
        must_push = not store or (k < n_ops - 1 and len(store) < 2 and rng.random() < 0.5)
        if must_push or (k < n_ops - 1 and rng.random() < 0.5):
            x = str(next(fresh))
            store.append(x)
            ops.append(f"push {x}")
        else:
            x = store.pop() if is_stack else store.pop(0)
            popped.append(x)
            ops.append("pop")
        lines.append(f"{ops[-1]}: [{' '.join(store)}]" + (f" popped {x}" if ops[-1] == "pop" else ""))
    if not popped:  # the answer must not be empty
        x = store.pop() if is_stack else store.pop(0)
        popped.append(x)
        ops.append("pop")
        lines.append(f"pop: [{' '.join(store)}] popped {x}")
    what = (
        "stack (pop takes the most recently pushed item)" if is_stack else "queue (pop takes the earliest pushed item)"
    )
    prompt = (
        f"Run these operations on an empty {what}:\n{', '.join(ops)}\n"
        "Answer with the popped items in order, separated by commas."
    )
    return prompt, popped, lines, {"size": n_ops, "steps": n_ops}


class SortAndSequenceOps(SingleTurnEnv):
    name = "sort_and_sequence_ops"
    domain = "algorithmic"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        kind = KINDS[seed % len(KINDS)]
        gen = {"multikey_sort": _sort_task, "permute": _permute_task, "stack_queue": _stack_task}[kind]
        prompt, answer, lines, stats = gen(rng, difficulty)
        return Task(
            self.name,
            seed,
            difficulty,
            f"{prompt}\n{ANSWER_INSTRUCTION}",
            answer,
            {"kind": kind, "lines": lines},
            stats,
        )

    def check(self, task: Task, span: str) -> bool:
        return [x.lower() for x in parse_list(span)] == [x.lower() for x in task.answer]

    def answer_text(self, task: Task) -> str:
        return ", ".join(task.answer)

    def wrong_texts(self, task: Task) -> list[str]:
        a = task.answer
        wrong = [", ".join(a[::-1]), ", ".join(a[1:] + a[:1]), ", ".join(a + a[:1])]
        return wrong

    def solution_steps(self, task: Task) -> list[str]:
        return task.hidden["lines"]
