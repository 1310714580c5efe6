"""What crosses an actor boundary in an RL run, as dataclasses (Ray carries them as they are).

    driver -> rollout worker   list[Assignment]  (the curriculum's, curriculum.routing.Assignment)
    rollout worker -> driver   GenerateReply     (groups of Samples, skipped assignments, timings)
    driver -> learner          per-rank microbatches (tensors, elr_rl.rl.samples.learner_batches)
    learner rank -> driver     StepResult
    driver -> curriculum       list[RolloutResult] (curriculum.passrates.RolloutResult)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from curriculum.routing import Assignment
from environments.base import Task


class FinishReason(StrEnum):
    """Why a completion (or a multi-turn episode) ended."""

    STOP = "stop"  # a stop token (or the episode's end)
    LENGTH = "length"  # the token budget (max_new_tokens, or the context)
    ABORT = "abort"  # the engine aborted the request


class AsyncMode(StrEnum):
    """How generation and training overlap (`async_.mode`)."""

    ASYNC = "async"  # workers keep sampling while the learner trains; staleness is bounded
    SYNC = "sync"  # generate, then train, in turn


@dataclass
class Sample:
    """One completion (or multi-turn episode) of a prompt."""

    prompt_ids: list[int]
    response_ids: list[int]  # every token after the prompt: model turns and environment text
    response_mask: list[int]  # 1: produced by the model (trained), 0: environment text (never trained)
    rollout_logprobs: list[float]  # behaviour-policy logprob of each response token (0 for env tokens)
    finish_reason: FinishReason
    text: str = ""  # the model's text, as scored
    reward: float = 0.0
    accuracy: bool = False
    error: str | None = None

    @property
    def num_model_tokens(self) -> int:
        return sum(self.response_mask)


@dataclass
class Group:
    """G samples of one prompt at one loop count."""

    assignment: Assignment
    samples: list[Sample]
    version: int  # policy version the worker held when it generated this group
    worker_id: int = 0
    task: Task | None = None  # the environment's task, built once by the worker (the driver scores against it)
    scored: bool = False  # rewards already set (multi-turn episodes are scored as they are played)

    @property
    def k(self) -> int:
        return self.assignment.k

    @property
    def prompt_id(self) -> str:
        return self.assignment.prompt_id

    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]


@dataclass
class GenerateReply:
    """A rollout worker's answer to one `generate` call."""

    groups: list[Group]
    skipped: list[Assignment]  # prompts longer than the engine's context: not sampled
    busy_s: float  # seconds the worker's engine was in use since its previous reply (overlapping requests once)
    weight_load_s: float  # seconds spent loading weights since the previous reply
    joined: bool = False  # the request joined a batch the worker's engine was running (continuous batching)


@dataclass
class StepResult:
    """One learner rank's optimizer step."""

    losses: list[float]  # one per microbatch (and update)
    grad_norm: float
    microbatch_stats: list[dict[str, float]]  # grpo_loss statistics per microbatch, with "k", "tokens", "update"
    weights_serialize_s: float  # seconds spent gathering (and on rank 0 serialising) the new weights
    weights_ref: list[Any] = field(default_factory=list)  # rank 0: [ref of the safetensors bytes]; others: []
    compute_s: float = 0.0  # wall seconds inside the rank's optimizer step(s), timed on the rank
    cpu_s: float = 0.0  # CPU seconds of the rank's process over the same span (all its threads)
    parity_logprobs: list[list[float]] | None = None  # rank 0: the step's parity sequences scored by the new weights
    wait_s: float | None = None  # seconds the rank sat idle between its previous step's end and this one (None: first)
    borrowed_core_s: float = 0.0  # core-seconds the rank ran on idle rollout cores it borrowed (learner.borrow_idle_cores)
    ended_unix: float | None = None  # time.time() when the rank returned: where a step queued behind this one began
