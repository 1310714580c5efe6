"""Multi-turn episodes, token in / token out: one implementation for RL rollouts and profiling.

After each model turn the environment answers (tool output, shell output); its
text is rendered with the checkpoint's chat template as a tool (or user) message
plus the next generation prompt (`TextCodec.observation_ids`), appended as tokens
masked out of the loss, and the model continues from the exact token transcript:
its own sampled ids are kept as sampled, never re-tokenised from decoded text. An episode ends when the environment says so, when the turn budget is
spent, when a turn is cut off by the token budget, or when the transcript would no
longer fit the engine (`max_context`).
"""

from __future__ import annotations

from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol, Sequence

from elr_rl.text import TextCodec


class TurnCompletion(Protocol):
    token_ids: Sequence[int]
    finish_reason: str  # and, from the rollout engine, logprobs: Sequence[float]


# contexts (token ids) -> one completion each
GenerateTurns = Callable[[list[list[int]]], list[TurnCompletion]]


@dataclass
class Episode:
    response_ids: list[int]  # everything after the prompt: model turns and environment text
    response_mask: list[int]  # 1: model token, 0: environment token
    logprobs: list[float]  # behaviour logprob of each model token, 0 for environment tokens
    turns: list[str] = field(default_factory=list)  # the model's turns as text
    finish_reason: str = "stop"
    score: Any = None  # environments.base.Score of the finished episode

    @property
    def model_tokens(self) -> int:
        return int(sum(self.response_mask))

    def add_model_turn(self, c: TurnCompletion, codec: TextCodec) -> None:
        self.response_ids += list(c.token_ids)
        self.response_mask += [1] * len(c.token_ids)
        lps = getattr(c, "logprobs", None)  # profiling completions may carry none
        self.logprobs += [float(x) for x in lps] if lps is not None else [0.0] * len(c.token_ids)
        self.turns.append(codec.decode(list(c.token_ids)))
        self.finish_reason = str(c.finish_reason)

    def add_observation(self, text: str, codec: TextCodec) -> None:
        obs = codec.observation_ids(text)  # environment text, never trained
        self.response_ids += obs
        self.response_mask += [0] * len(obs)
        self.logprobs += [0.0] * len(obs)


class EpisodeHandle(Protocol):
    """One episode's environment side: `environments.pool.EpisodeSession` (stepped and scored in the
    scoring pool, with its timeout and error rule) or `environments.pool.LocalEpisode` (in process)."""

    def step(self, turn: str) -> Future: ...  # Future[StepResult]

    def finish(self) -> Future: ...  # Future[Score]


def play_episodes(generate: GenerateTurns, codec: TextCodec, sessions: Sequence[EpisodeHandle], max_turns: int,
                  prompt_ids: list[int], first: Sequence[TurnCompletion], max_context: int | None = None) -> list[Episode]:
    """Continue each first turn's episode (one session each) until it ends, then score it.

    The environment answers every active episode's turn at once (the pool runs them side by
    side); a step that failed ends its episode, whose reward is then 0 with the error."""
    episodes = [Episode([], [], []) for _ in first]
    for ep, c in zip(episodes, first):
        ep.add_model_turn(c, codec)
    active = list(range(len(first)))
    try:
        for turn in range(max_turns):
            answers = {i: sessions[i].step(episodes[i].turns[-1]) for i in active}  # untrusted turns: parsed there
            still = []
            for i in active:
                ep, result = episodes[i], answers[i].result()
                if result.done or turn == max_turns - 1 or ep.finish_reason == "length":
                    continue
                ep.add_observation(result.observation, codec)
                if max_context is None or len(prompt_ids) + len(ep.response_ids) < max_context:
                    still.append(i)
            if not still:
                break
            for i, c in zip(still, generate([prompt_ids + episodes[i].response_ids for i in still])):
                episodes[i].add_model_turn(c, codec)
            active = still
    finally:  # every session is finished (its state released), also when generation failed
        scores = [s.finish() for s in sessions]
    for ep, score in zip(episodes, scores):
        ep.score = score.result()
    return episodes
