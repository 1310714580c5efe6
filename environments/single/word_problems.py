"""Templated multi-step word problems with distractor sentences; the answer is an exact integer.

D sets the number of steps (each changes the tracked quantity) and the number
of distractor sentences (facts about other people that do not matter).
"""

from __future__ import annotations

import random

from environments.base import Task
from environments.single._common import ANSWER_INSTRUCTION, SingleTurnEnv
from environments.verifiers import math_equal

NAMES = ["Ana", "Ben", "Chen", "Dana", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena", "Mo", "Nia"]
ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "shells", "cards", "stamps", "eggs"]


def _step(rng: random.Random, name: str, item: str, q: int, others: list[str]) -> tuple[str, int, str]:
    """One change to the quantity q: (sentence, new q, worked line)."""
    kinds = ["add", "add", "sub", "mul", "div", "pack"]
    while True:
        kind = rng.choice(kinds)
        if kind == "add":
            k = rng.randint(2, 20)
            verb = rng.choice([f"{name} buys {k} more {item}.", f"{rng.choice(others)} gives {name} {k} {item}."])
            return verb, q + k, f"{q} + {k} = {q + k}"
        if kind == "sub" and q > 2:
            k = rng.randint(1, q - 1)
            return f"{name} gives {k} {item} to {rng.choice(others)}.", q - k, f"{q} - {k} = {q - k}"
        if kind == "mul" and q <= 200:
            k = rng.choice([2, 3])
            word = {2: "doubles", 3: "triples"}[k]
            return f"{name} {word} the number of {item}.", q * k, f"{q} * {k} = {q * k}"
        if kind == "div":
            ks = [k for k in (2, 3, 4, 5) if q % k == 0 and q > k]
            if ks:
                k = rng.choice(ks)
                text = f"{name} splits the {item} into {k} equal piles and keeps only one pile."
                return text, q // k, f"{q} / {k} = {q // k}"
        if kind == "pack":
            n, per = rng.randint(2, 4), rng.randint(2, 6)
            text = f"{name} buys {n} bags with {per} {item} in each bag."
            return text, q + n * per, f"{n} * {per} = {n * per}; {q} + {n * per} = {q + n * per}"


def _distractor(rng: random.Random, others: list[str], item: str) -> str:
    who = rng.choice(others)
    return rng.choice(
        [
            f"{who} has {rng.randint(2, 60)} {rng.choice(ITEMS)}.",
            f"{who} is {rng.randint(6, 70)} years old.",
            f"{who} walks {rng.randint(2, 9)} km every day.",
            f"{who} once had {rng.randint(3, 40)} {item} too.",
            f"The shop sells {item} for {rng.randint(1, 9)} dollars each.",
        ]
    )


class WordProblems(SingleTurnEnv):
    name = "word_problems"
    domain = "math"

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        steps, n_distract = difficulty, difficulty // 2
        name, *others = rng.sample(NAMES, 4)
        item = rng.choice(ITEMS)
        q = rng.randint(2, 5 + 3 * difficulty)
        sentences = [f"{name} has {q} {item}."]
        lines = [f"Start: {q}"]
        for _ in range(steps):
            text, q, line = _step(rng, name, item, q, others)
            sentences.append(text)
            lines.append(line)
        for _ in range(n_distract):
            sentences.insert(rng.randint(1, len(sentences)), _distractor(rng, others, item))
        prompt = (
            " ".join(sentences)
            + f" How many {item} does {name} have now? Answer with a whole number.\n{ANSWER_INSTRUCTION}"
        )
        stats = {"steps": steps, "distractors": n_distract}
        return Task(self.name, seed, difficulty, prompt, q, {"lines": lines}, stats)

    def check(self, task: Task, span: str) -> bool:
        return math_equal(span, str(task.answer))  # the shared math checker

    def answer_text(self, task: Task) -> str:
        return str(task.answer)

    def wrong_texts(self, task: Task) -> list[str]:
        return [str(task.answer + 1), str(task.answer * 2 + 3), str(max(0, task.answer - 4))]

    def solution_steps(self, task: Task) -> list[str]:
        return task.hidden["lines"]
