"""The depth ladder's common shape: compact prompts, direct answers, difficulty = serial steps.

Every ladder task needs D steps that each depend on the previous one (a hop, a
dereference, a move, an operation), so a looped model can only answer it when its
loops carry out the chain. Prompts are tens of bytes (no instruction text: at this
scale it would be most of the prompt; SFT teaches the format), the answer is one symbol
between answer tags, and every task records the answer after each step
(`Task.hidden["steps"]`, the last one being the answer), which the training
stages can use as per-loop targets (`TrainConfig.loop_aux`).

Where the chain is laid out in the prompt (a move, a closing bracket, a binding line),
a task also records dense targets (`Task.hidden["dense"]`): (end, depth, value) says the
prompt's first `end` characters determine `value` in `depth` serial steps, so a causal
model can hold it at that character from loop `depth` on (`loop_aux.targets=dense`).
Where the chain's rule is the same at every link, a task also records partial targets
(`Task.hidden["partial"]`): (end, loop, value) says what loop `loop` < depth can hold at that
character by applying the rule `loop` times (the automaton's last moves composed into one
map, the variable a binding line reaches after `loop` look-ups), so that every link of the
chain has a target at every loop (`loop_aux.targets=chain`).
"""

from __future__ import annotations

from typing import ClassVar

from environments.base import Environment, Score, Task, extract_answer


class LadderEnvironment(Environment):
    """A ladder task: `_generate` sets `answer` (one symbol) and `hidden["steps"]` (answer after each step)."""

    domain = "ladder"
    min_difficulty = 1
    max_difficulty = 8
    score_timeout_s = 2.0
    alphabet: ClassVar[str]  # every symbol an answer can be (bad answers are drawn from it)
    partial_alphabet: ClassVar[str] = ""  # every symbol a partial target can be (extra to `alphabet`)

    def make_task(self, seed: int, difficulty: int, prompt: str, steps: list[str],
                  dense: list[tuple[int, int, str]] = (), partial: list[tuple[int, int, str]] = (),
                  **stats: float) -> Task:
        if len(steps) != difficulty:
            raise AssertionError(f"{self.name}: {len(steps)} step targets for difficulty {difficulty}")
        for end, depth, value in dense:
            if not (0 < end <= len(prompt) and 1 <= depth <= difficulty and value in self.alphabet):
                raise AssertionError(f"{self.name}: dense target {(end, depth, value)} does not fit {prompt!r}")
        for end, loop, value in partial:
            if not (0 < end <= len(prompt) and 1 <= loop < difficulty and value in self.alphabet + self.partial_alphabet):
                raise AssertionError(f"{self.name}: partial target {(end, loop, value)} does not fit {prompt!r}")
        return Task(self.name, seed, difficulty, prompt, steps[-1],
                    hidden={"steps": list(steps), "dense": [list(t) for t in dense],
                            "partial": [list(t) for t in partial]},
                    stats={"serial_steps": float(difficulty), **stats})

    def step_targets(self, task: Task) -> list[str]:
        """The answer after each of the task's serial steps (the last one is the answer)."""
        return list(task.hidden["steps"])

    def dense_targets(self, task: Task) -> list[tuple[int, int, str]]:
        """(end, depth, value): the first `end` prompt characters give `value` after `depth` serial steps."""
        return [(int(e), int(d), str(v)) for e, d, v in task.hidden.get("dense", ())]

    def partial_targets(self, task: Task) -> list[tuple[int, int, str]]:
        """(end, loop, value): what loop `loop` alone holds at the first `end` prompt characters (below their depth)."""
        return [(int(e), int(i), str(v)) for e, i, v in task.hidden.get("partial", ())]

    def steps_needed(self, task: Task) -> int:
        """Serial steps the task needs (its difficulty)."""
        return len(task.hidden["steps"])

    def score(self, task: Task, completion: str) -> Score:
        answer = extract_answer(completion)  # untrusted text: only the single answer span counts
        if answer is None:
            return Score.zero(format=0.0)
        return Score.binary(answer == task.answer, format=1.0)

    def reference_solution(self, task: Task) -> str:
        return f"<answer>{task.answer}</answer>"

    def step_solution(self, task: Task, step: int) -> str:
        """The completion that answers with the state after `step` steps (1-based)."""
        return f"<answer>{task.hidden['steps'][step - 1]}</answer>"

    def bad_answers(self, task: Task) -> list[str]:
        wrong = [s for s in self.alphabet if s != task.answer][:3]
        # an intermediate state is a wrong answer too (the chain stopped early)
        early = [s for s in task.hidden["steps"][:-1] if s != task.answer][:2]
        return [f"<answer>{w}</answer>" for w in wrong + early]
