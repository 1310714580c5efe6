"""even_odd: is the number even or odd? A one-decision task a tiny model can learn by RL in minutes.

Difficulty D sets the number of digits (D digits). The answer depends only on
the last digit, so a policy that learned the format but guesses at random
scores 0.5, and RL has a clean signal to climb.
"""

from __future__ import annotations

import random

from environments.base import ANSWER_INSTRUCTION, Environment, Score, Task, extract_answer


class EvenOdd(Environment):
    name = "even_odd"
    domain = "toy"
    max_difficulty = 6
    score_timeout_s = 2.0

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        n = rng.randrange(10 ** (difficulty - 1) if difficulty > 1 else 0, 10**difficulty)
        prompt = f"Is {n} even or odd? {ANSWER_INSTRUCTION}"
        return Task(self.name, seed, difficulty, prompt, "even" if n % 2 == 0 else "odd",
                    stats={"digits": float(difficulty)})

    def score(self, task: Task, completion: str) -> Score:
        answer = extract_answer(completion)  # untrusted text: only the answer span counts
        if answer is None:
            return Score.zero(format=0.0)
        return Score.binary(answer.lower() == task.answer, format=1.0)

    def reference_solution(self, task: Task) -> str:
        return f"<answer>{task.answer}</answer>"

    def bad_answers(self, task: Task) -> list[str]:
        wrong = "odd" if task.answer == "even" else "even"
        return [f"<answer>{wrong}</answer>", f"<answer>{task.answer}</answer><answer>{wrong}</answer>"]
