"""Long context: multi-hop variable chains hidden in generated filler text.

A chain `v0 = c; v1 = v0 + k1; ...; vH = v(H-1) - kH` is scattered, in random
order, through filler sentences alongside distractor assignments (some of
which read chain variables but are not on the path). D sets the hop count H,
the number of distractors and the filler length (2 D^2 lines). The answer is
the exact integer value of the last variable.
"""

from __future__ import annotations

import random
import string

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv, parse_int

SUBJECTS = [
    "The committee",
    "A traveller",
    "The old clock",
    "Our neighbour",
    "The river",
    "A small bakery",
    "The museum",
]
VERBS = ["mentioned", "ignored", "described", "celebrated", "postponed", "recorded", "painted"]
OBJECTS = [
    "the harvest festival",
    "a quiet afternoon",
    "the new bridge",
    "an unusual storm",
    "the morning market",
    "a forgotten letter",
    "the winter schedule",
]


def _filler(rng: random.Random) -> str:
    return f"{rng.choice(SUBJECTS)} {rng.choice(VERBS)} {rng.choice(OBJECTS)}."


def _names(rng: random.Random, n: int) -> list[str]:
    out: set[str] = set()
    while len(out) < n:
        out.add("".join(rng.choice(string.ascii_lowercase) for _ in range(3)))
    return sorted(sorted(out), key=lambda _: rng.random())  # sort the set first: its order is per-process


def _op(rng: random.Random, d: int, value: int) -> tuple[str, int]:
    """A random update `op k` and the new value; multiplication only at D >= 5 and for small values."""
    if d >= 5 and abs(value) < 50 and rng.random() < 0.25:
        k = rng.choice([2, 3])
        return f"* {k}", value * k
    k = rng.randint(1, 9 + d)
    return (f"+ {k}", value + k) if rng.random() < 0.6 else (f"- {k}", value - k)


class NeedleVariableTracking(SingleTurnEnv):
    name = "needle_variable_tracking"
    domain = "long_context"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        d = difficulty
        hops, n_distract, n_filler = d, d, 2 * d * d
        names = _names(rng, hops + 1 + n_distract)
        chain, others = names[: hops + 1], names[hops + 1 :]
        value = rng.randint(1, 20)
        lines = [f"let {chain[0]} = {value}."]
        trace = [f"{chain[0]} = {value}"]
        for prev, cur in zip(chain, chain[1:]):
            op, new = _op(rng, d, value)
            lines.append(f"let {cur} = {prev} {op}.")
            trace.append(f"{cur} = {prev} {op} = {value} {op} = {new}")
            value = new
        known = list(chain)
        for name in others:  # distractors may read any earlier variable, so they look relevant
            src = rng.choice(known)
            lines.append(
                f"let {name} = {src} {_op(rng, d, 0)[0]}."
                if rng.random() < 0.7
                else f"let {name} = {rng.randint(1, 30)}."
            )
            known.append(name)
        text = [_filler(rng) for _ in range(n_filler)]
        for line in lines:
            text.insert(rng.randint(0, len(text)), f"Note: {line}")
        prompt = (
            "Read the text. Each variable is assigned exactly once.\n"
            + "\n".join(text)
            + f"\nWhat is the value of {chain[-1]}? Answer with an integer.\n{ANSWER_INSTRUCTION}"
        )
        stats = {"hops": hops, "distractors": n_distract, "filler_lines": n_filler}
        return Task(self.name, seed, difficulty, prompt, value, {"trace": trace}, stats)

    def check(self, task: Task, span: str) -> bool:
        return parse_int(span) == task.answer

    def answer_text(self, task: Task) -> str:
        return str(task.answer)

    def wrong_texts(self, task: Task) -> list[str]:
        return [str(task.answer + 1), str(task.answer - 3), str(-task.answer - 1)]

    def solution_steps(self, task: Task) -> list[str]:
        return task.hidden["trace"]
