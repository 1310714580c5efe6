"""interactive_deduction: find a hidden number or a Mastermind code from feedback, within a turn budget.

Even seeds play hidden-number search over 1..N (feedback "higher"/"lower",
N = 10 * 2^D, budget = the binary-search worst case). Odd seeds play
Mastermind with (pegs, colours) growing with D (feedback: exact and
colour-only matches); the budget is the reference solver's guess count + 2.
The secret is only in `Task.hidden`. Reward 1 when solved within the budget.
"""

from __future__ import annotations

import itertools
import math
import random
import re
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from environments.base import MultiTurnEnvironment, Score, StepResult, Task, join_turns
from environments.turns import format_help, parse_action

# difficulty -> (pegs, colours): log2(colours^pegs) grows with every level.
MASTERMIND = {1: (3, 4), 2: (3, 5), 3: (3, 6), 4: (4, 4), 5: (4, 5), 6: (4, 6), 7: (4, 7), 8: (5, 5), 9: (5, 6), 10: (5, 7)}


def feedback(secret: tuple[int, ...], guess: tuple[int, ...]) -> tuple[int, int]:
    """(exact, colour-only): exact = same colour same place; colour-only = common colours minus exact."""
    exact = sum(a == b for a, b in zip(secret, guess))
    common = sum((Counter(secret) & Counter(guess)).values())
    return exact, common - exact


def solve_mastermind(secret: tuple[int, ...], pegs: int, colours: int) -> list[tuple[int, ...]]:
    """Guess the first code consistent with all feedback so far (lexicographic order)."""
    candidates = list(itertools.product(range(1, colours + 1), repeat=pegs))
    guesses = []
    while True:
        guess = candidates[0]
        guesses.append(guess)
        fb = feedback(secret, guess)
        if fb == (pegs, 0):
            return guesses
        candidates = [c for c in candidates if feedback(c, guess) == fb]


def solve_number(secret: int, n: int) -> list[int]:
    lo, hi, guesses = 1, n, []
    while True:
        mid = (lo + hi) // 2
        guesses.append(mid)
        if mid == secret:
            return guesses
        lo, hi = (mid + 1, hi) if secret > mid else (lo, mid - 1)


@dataclass
class _Episode:
    turns: int = 0
    solved: bool = False
    done: bool = False


class InteractiveDeduction(MultiTurnEnvironment):
    name: ClassVar[str] = "interactive_deduction"
    domain: ClassVar[str] = "agentic"
    max_turns: ClassVar[int] = 20

    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        # The mode depends on the seed only, so a seed's task gets harder with D in the same game.
        if seed % 2 == 0:
            n = 10 * 2**difficulty
            secret = rng.randint(1, n)
            budget, space = math.ceil(math.log2(n + 1)), n
            ref = [str(g) for g in solve_number(secret, n)]
            rules = (
                f"I am thinking of an integer between 1 and {n}. Each turn, guess one number as <guess>N</guess>; "
                "I answer 'higher' (the secret is larger), 'lower' or 'correct'."
            )
            hidden = {"mode": "number", "secret": secret, "n": n}
        else:
            pegs, colours = MASTERMIND[difficulty]
            secret_code = tuple(rng.randint(1, colours) for _ in range(pegs))
            ref_codes = solve_mastermind(secret_code, pegs, colours)
            budget, space = len(ref_codes) + 2, colours**pegs
            ref = [" ".join(map(str, g)) for g in ref_codes]
            rules = (
                f"Mastermind: I hide a code of {pegs} pegs, each a colour 1-{colours} (repeats allowed). Each turn, "
                f"guess a code as <guess>{' '.join(['1'] * pegs)}</guess>; I answer 'exact=E partial=P': E pegs "
                "have the right colour in the right place, P more have a right colour in a wrong place."
            )
            hidden = {"mode": "mastermind", "secret": list(secret_code), "pegs": pegs, "colours": colours}
        prompt = f"{rules} You have {budget} guesses; the game ends when you find it."
        return Task(
            self.name, seed, difficulty, prompt, answer=ref[-1],
            hidden={**hidden, "turn_budget": budget, "reference": ref},
            stats={"log2_space": math.log2(space), "turn_budget": float(budget)},
        )  # fmt: skip

    def reset(self, task: Task) -> _Episode:
        return _Episode()

    def step(self, task: Task, state: _Episode, model_turn: str) -> StepResult:
        if state.done:
            return StepResult("The game is over.", True)
        state.turns += 1
        h = task.hidden
        action = parse_action(model_turn, ("guess",))
        guess = _parse_guess(action.body if action else "", h)
        if guess is None:
            obs = format_help(("guess",)) + (" A guess is one integer." if h["mode"] == "number" else
                                             f" A guess is {h['pegs']} colours 1-{h['colours']}.")  # fmt: skip
        elif h["mode"] == "number":
            state.solved = guess == h["secret"]
            obs = "correct" if state.solved else ("higher" if h["secret"] > guess else "lower")
        else:
            exact, partial = feedback(tuple(h["secret"]), guess)
            state.solved = exact == h["pegs"]
            obs = "correct" if state.solved else f"exact={exact} partial={partial}"
        state.done = state.solved or state.turns >= h["turn_budget"]
        return StepResult(obs, state.done)

    def score_episode(self, task: Task, state: _Episode) -> Score:
        return Score.binary(state.solved, turns=float(state.turns))

    def reference_turns(self, task: Task) -> list[str]:
        return [f"<guess>{g}</guess>" for g in task.hidden["reference"]]

    def bad_answers(self, task: Task) -> list[str]:
        ref = self.reference_turns(task)
        wrong = ref[0] if len(ref) > 1 else ("<guess>1</guess>" if task.hidden["mode"] == "number" else
                                             f"<guess>{' '.join(['9'] * task.hidden['pegs'])}</guess>")  # fmt: skip
        return [
            join_turns([wrong] * task.hidden["turn_budget"]),
            join_turns(ref[:-1]) if len(ref) > 1 else wrong,  # stops one guess short
            "<guess>PASSED</guess>",
            f"<answer>{task.answer}</answer>",  # the answer without playing: not a guess
        ]

    def worked_response(self, task: Task) -> str:
        state, parts = self.reset(task), []
        how = ("Halve the interval each time." if task.hidden["mode"] == "number"
               else "Each guess is the first code consistent with every answer so far.")  # fmt: skip
        parts.append(how)
        for turn in self.reference_turns(task):
            parts.append(f"{turn}\n<output>{self.step(task, state, turn).observation}</output>")
        return "\n".join(parts)


def _parse_guess(body: str, h: dict) -> int | tuple[int, ...] | None:
    text = body.strip()
    if h["mode"] == "number":
        return int(text) if re.fullmatch(r"-?\d{1,12}", text) else None
    digits = re.findall(r"\d+", text)
    if re.fullmatch(r"[\d\s,]+", text) is None or len(digits) != h["pegs"]:
        return None
    code = tuple(int(d) for d in digits)
    return code if all(1 <= c <= h["colours"] for c in code) else None
