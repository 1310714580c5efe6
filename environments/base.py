"""The environment API: every verifiable-reward environment has this shape.

A task is generated deterministically from (seed, difficulty) with a local
`random.Random`, never the global one. Its hidden answer and tests live in
`Task.answer` / `Task.hidden` and never enter the prompt. Scoring reads only
the extracted answer span: an empty answer, or several different answers,
score 0. Model output is untrusted: reward code never `eval`s it in-process.
"""

from __future__ import annotations

import abc
import random
import re
from dataclasses import dataclass, field
from typing import Any, ClassVar

ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)

ANSWER_INSTRUCTION = "Put your final answer, and nothing else, between <answer> and </answer>."


@dataclass
class Task:
    """One generated problem. `answer` and `hidden` are kept out of `prompt`."""

    env: str
    seed: int
    difficulty: int
    prompt: str
    answer: Any
    hidden: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, float] = field(default_factory=dict)  # task statistics that grow with difficulty
    system: str | None = None  # a system message of the task's own (a dataset's system_prompt), rendered by the chat template

    @property
    def id(self) -> str:
        return f"{self.env}/d{self.difficulty}/s{self.seed}"


@dataclass
class Score:
    """A reward in [0, 1] with its named components and the strict accuracy bit."""

    reward: float
    accuracy: bool
    components: dict[str, float] = field(default_factory=dict)
    error: str | None = None  # set when the verifier failed (timeout, crash): reward is then 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.reward <= 1.0:
            raise ValueError(f"reward must be in [0, 1], got {self.reward}")

    @classmethod
    def zero(cls, error: str | None = None, **components: float) -> "Score":
        return cls(0.0, False, dict(components), error)

    @classmethod
    def binary(cls, ok: bool, **components: float) -> "Score":
        return cls(1.0 if ok else 0.0, bool(ok), {"accuracy": float(ok), **components})


def tag_spans(text: str, tag: str) -> list[str]:
    """Bodies of every `<tag>...</tag>`, left to right, non-nested (what `ANSWER_RE.findall` finds).

    Linear in len(text) for any input: a regex with a lazy body rescans the rest of
    the text from every unclosed opening tag (200 KB of `<answer>` took seconds)."""
    if not isinstance(text, str):
        return []
    open_tag, close_tag = f"<{tag}>", f"</{tag}>"
    spans, pos = [], 0
    while True:
        start = text.find(open_tag, pos)
        if start < 0:
            return spans
        end = text.find(close_tag, start + len(open_tag))
        if end < 0:  # no later opening tag can be closed either
            return spans
        spans.append(text[start + len(open_tag) : end])
        pos = end + len(close_tag)


def extract_answer(completion: str) -> str | None:
    """The single answer span of a completion, stripped; None if absent, empty or ambiguous.

    Several <answer> blocks are accepted only when they all hold the same text
    (a model that hedges with different answers scores 0).
    """
    spans = [s.strip() for s in tag_spans(completion, "answer")]
    spans = [s for s in spans if s]
    if not spans or len(set(spans)) != 1:
        return None
    return spans[0]


class Environment(abc.ABC):
    """A single-turn verifiable-reward environment."""

    name: ClassVar[str]
    domain: ClassVar[str]
    multi_turn: ClassVar[bool] = False
    # Whether scoring runs model output in the sandbox (commands then check its tier before any engine starts).
    sandboxed: ClassVar[bool] = False
    min_difficulty: ClassVar[int] = 1
    max_difficulty: ClassVar[int] = 10
    # How many scoring jobs of this environment may run at once in the pool.
    max_concurrency: ClassVar[int] = 8
    # Seconds a scoring job may run before the pool gives it reward 0.
    score_timeout_s: ClassVar[float] = 10.0

    def check_difficulty(self, difficulty: int) -> None:
        if not self.min_difficulty <= difficulty <= self.max_difficulty:
            raise ValueError(
                f"{self.name}: difficulty must be in [{self.min_difficulty}, {self.max_difficulty}], got {difficulty}"
            )

    def generate(self, seed: int, difficulty: int) -> Task:
        """Deterministic task for (seed, difficulty)."""
        self.check_difficulty(difficulty)
        rng = random.Random(f"{self.name}:{seed}:{difficulty}")
        return self._generate(rng, seed, difficulty)

    @abc.abstractmethod
    def _generate(self, rng: random.Random, seed: int, difficulty: int) -> Task:
        """Build the task from a private generator."""

    @abc.abstractmethod
    def score(self, task: Task, completion: str) -> Score:
        """Reward of a completion (untrusted text). Never raises on bad model output."""

    @abc.abstractmethod
    def reference_solution(self, task: Task) -> str:
        """A completion that scores 1.0."""

    @abc.abstractmethod
    def bad_answers(self, task: Task) -> list[str]:
        """Well-formed but wrong completions that must score 0.0."""

    def worked_solution(self, task: Task) -> str:
        """The task with a worked solution, for the pretraining/SFT corpus:
        `task.prompt + WORKED_SEPARATOR + response` (see `split_worked`)."""
        return task.prompt + WORKED_SEPARATOR + self.worked_response(task)

    def worked_response(self, task: Task) -> str:
        """The response part of `worked_solution`: reasoning steps, then the scored answer."""
        return self.reference_solution(task)


@dataclass
class StepResult:
    """The environment's answer to one model turn."""

    observation: str  # text appended after the model's turn (tool result, shell output)
    done: bool
    error: str | None = None  # set by the scoring pool when the step raised or timed out: the episode ends, reward 0


class MultiTurnEnvironment(Environment):
    """An environment that answers each model turn until the episode ends."""

    multi_turn: ClassVar[bool] = True
    max_turns: ClassVar[int] = 8

    @abc.abstractmethod
    def reset(self, task: Task) -> Any:
        """Fresh episode state for a task."""

    @abc.abstractmethod
    def step(self, task: Task, state: Any, model_turn: str) -> StepResult:
        """Apply one model turn (untrusted) to the episode state and answer it."""

    @abc.abstractmethod
    def score_episode(self, task: Task, state: Any) -> Score:
        """Reward of a finished (or truncated) episode."""

    @abc.abstractmethod
    def reference_turns(self, task: Task) -> list[str]:
        """Model turns that solve the task; feeding them through `step` scores 1.0."""

    def score(self, task: Task, completion: str) -> Score:
        """Single-string scoring for a multi-turn env: the turns are split on the turn separator."""
        state = self.reset(task)
        for i, turn in enumerate(split_turns(completion)):
            if i >= self.max_turns:
                break
            if self.step(task, state, turn).done:
                break
        return self.score_episode(task, state)

    def reference_solution(self, task: Task) -> str:
        return join_turns(self.reference_turns(task))


TURN_SEPARATOR = "\n<|turn|>\n"
WORKED_SEPARATOR = "\n\n"


def split_worked(task: Task, worked: str) -> tuple[str, str]:
    """(prompt, response) of a `worked_solution` text; SFT puts its loss on the response only."""
    if worked.startswith(task.prompt):
        return task.prompt, worked[len(task.prompt) :].lstrip("\n")
    return task.prompt, worked


def split_turns(completion: str) -> list[str]:
    return completion.split(TURN_SEPARATOR)


def join_turns(turns: list[str]) -> str:
    return TURN_SEPARATOR.join(turns)
