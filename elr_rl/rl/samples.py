"""Rollout samples, the rollout buffer, and their packing into learner microbatches.

A `Group` is one prompt's G completions at one loop count k, tagged with the
policy version that produced it. The buffer hands the learner groups no older
than `max_staleness` versions; `learner_batches` turns groups into per-rank
microbatches (one per loop count, so each sample is trained at the k that
produced it), balanced across ranks by cost = tokens x D_eff(k).
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Sequence

import torch

from elr_rl.rl import grpo


@dataclass
class Sample:
    """One completion (or multi-turn episode) of a prompt."""

    prompt_ids: list[int]
    response_ids: list[int]  # every token after the prompt: model turns and environment text
    response_mask: list[int]  # 1: produced by the model (trained), 0: environment text (never trained)
    rollout_logprobs: list[float]  # behaviour-policy logprob of each response token (0 for env tokens)
    finish_reason: str  # "stop" or "length"
    text: str = ""  # the model's text, as scored
    reward: float = 0.0
    accuracy: bool = False
    error: str | None = None

    @property
    def num_model_tokens(self) -> int:
        return int(sum(self.response_mask))


@dataclass
class Group:
    """G samples of one prompt at one loop count."""

    assignment: dict[str, Any]  # the curriculum's Assignment as a dict (prompt_id, env, seed, difficulty, k, q, ...)
    samples: list[Sample]
    version: int  # policy version the worker held when it generated this group
    worker_id: int = 0

    @property
    def k(self) -> int:
        return int(self.assignment["k"])

    @property
    def prompt_id(self) -> str:
        return str(self.assignment["prompt_id"])

    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Group":
        return cls(d["assignment"], [Sample(**s) for s in d["samples"]], d["version"], d.get("worker_id", 0))


class RolloutBuffer:
    """FIFO of scored groups; `pop_batch` enforces bounded staleness."""

    def __init__(self) -> None:
        self.groups: collections.deque[Group] = collections.deque()
        self.dropped_stale = 0

    def __len__(self) -> int:
        return len(self.groups)

    def add(self, group: Group) -> None:
        self.groups.append(group)

    def evict_stale(self, version: int, max_staleness: int) -> list[Group]:
        """Remove and return groups produced more than max_staleness versions before `version`."""
        stale = [g for g in self.groups if version - g.version > max_staleness]
        if stale:
            self.groups = collections.deque(g for g in self.groups if version - g.version <= max_staleness)
            self.dropped_stale += len(stale)
        return stale

    def pop_batch(self, n: int, version: int, max_staleness: int) -> list[Group] | None:
        """The n oldest fresh groups, or None while fewer than n are available."""
        self.evict_stale(version, max_staleness)
        if len(self.groups) < n:
            return None
        return [self.groups.popleft() for _ in range(n)]

    def state_dict(self) -> dict[str, Any]:
        return {"groups": [g.to_dict() for g in self.groups], "dropped_stale": self.dropped_stale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups = collections.deque(Group.from_dict(g) for g in state["groups"])
        self.dropped_stale = int(state["dropped_stale"])


@dataclass
class TrainSample:
    """One sample as the learner sees it."""

    ids: list[int]
    loss_mask: list[int]  # aligned with ids: 1 where the token is a trained model token
    rollout_logp: list[float]  # aligned with ids
    advantage: float
    k: int


@dataclass
class LearnerBatch:
    """Per-rank microbatches (same count on every rank) and batch statistics."""

    microbatches: list[list[dict[str, torch.Tensor]]]  # [rank][i]
    ks: list[list[int]]  # [rank][i]
    stats: dict[str, float] = field(default_factory=dict)


def select_samples(groups: list[Group], std_normalize: bool, dynamic_sampling: bool, overlong_filter: bool,
                   max_seq_len: int) -> tuple[list[TrainSample], dict[str, float]]:
    """Group-normalised advantages, then the filters (dynamic sampling, overlong)."""
    out: list[TrainSample] = []
    n_uninformative = n_overlong = 0
    for g in groups:
        rewards = torch.tensor([g.rewards()], dtype=torch.float32)
        if dynamic_sampling and not bool(grpo.informative_groups(rewards)[0]):
            n_uninformative += 1
            continue
        adv = grpo.group_advantages(rewards, std_normalize=std_normalize)[0]
        for s, a in zip(g.samples, adv.tolist()):
            if overlong_filter and s.finish_reason == "length":
                n_overlong += 1
                continue
            ids = (s.prompt_ids + s.response_ids)[:max_seq_len]
            mask = ([0] * len(s.prompt_ids) + list(s.response_mask))[:max_seq_len]
            logp = ([0.0] * len(s.prompt_ids) + list(s.rollout_logprobs))[:max_seq_len]
            out.append(TrainSample(ids, mask, logp, a, g.k))
    stats = {"batch/uninformative_groups": float(n_uninformative), "batch/overlong_samples": float(n_overlong),
             "batch/trained_samples": float(len(out))}
    return out, stats


def _collate(samples: list[TrainSample], scale: float) -> dict[str, torch.Tensor]:
    """Right-padded tensors of one microbatch; an empty list gives one all-masked pad row."""
    # Padding sits after each row's tokens and carries no loss, so a causal model never lets it
    # change a real position: any valid id will do (0 exists in every vocabulary).
    rows = samples or [TrainSample([0, 0], [0, 0], [0.0, 0.0], 0.0, 1)]
    T = max(len(s.ids) for s in rows)
    ids = torch.zeros((len(rows), T), dtype=torch.long)
    mask = torch.zeros(len(rows), T, dtype=torch.float32)
    logp = torch.zeros(len(rows), T, dtype=torch.float32)
    for i, s in enumerate(rows):
        ids[i, : len(s.ids)] = torch.tensor(s.ids)
        mask[i, : len(s.ids)] = torch.tensor(s.loss_mask, dtype=torch.float32)
        logp[i, : len(s.ids)] = torch.tensor(s.rollout_logp)
    adv = torch.tensor([[s.advantage] for s in rows], dtype=torch.float32)
    return {"input_ids": ids, "loss_mask": mask, "rollout_logp": logp, "advantages": adv,
            "scale": torch.tensor(scale)}


def learner_batches(samples: list[TrainSample], world_size: int, depth: Callable[[int], int],
                    aggregation: str, loop_counts: list[int]) -> LearnerBatch:
    """Split samples over ranks (greedy by cost = tokens x D_eff(k)) and into one microbatch per k.

    Every rank gets one microbatch per entry of `loop_counts` (empty ones are a masked pad
    row), so every rank runs the same number of backward passes and the gradient
    all-reduces line up; all depths meet in one optimizer step. `scale` makes the pieces
    sum to the batch's loss: DeepSpeed divides by the accumulation steps and averages over
    ranks, and the scale undoes both.
    """
    ks = list(loop_counts)
    unknown = {s.k for s in samples} - set(ks)
    if unknown:
        raise ValueError(f"samples at loop counts {sorted(unknown)} are not in loop_counts {ks}")
    loads = [0.0] * world_size
    per_rank: list[list[TrainSample]] = [[] for _ in range(world_size)]
    for s in sorted(samples, key=lambda s: -len(s.ids) * depth(s.k)):
        r = min(range(world_size), key=loads.__getitem__)
        per_rank[r].append(s)
        loads[r] += len(s.ids) * depth(s.k)
    if aggregation == "token":
        normalizer = sum(sum(s.loss_mask) for s in samples)
    else:
        normalizer = sum(1 for s in samples if sum(s.loss_mask) > 0)
    scale = len(ks) * world_size / max(float(normalizer), 1.0)
    mbs = [[_collate([s for s in rank if s.k == k], scale) | {"k": k} for k in ks] for rank in per_rank]
    cost_max, cost_mean = max(loads), sum(loads) / world_size
    stats = {"batch/rank_cost_imbalance": cost_max / cost_mean if cost_mean else 1.0,
             "batch/normalizer": float(normalizer)}
    return LearnerBatch(mbs, [list(ks) for _ in range(world_size)], stats)


def take_one_loop_count(queue: Sequence[dict[str, Any]], n: int) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Up to n assignments at the loop count of the oldest one, in queue order, and the rest (in order).

    A rollout request then runs one k (one batched generate); the oldest assignment always goes,
    so no loop count waits behind the others for long.
    """
    if not queue:
        return [], []
    k = queue[0]["k"]
    work: list[dict[str, Any]] = []
    rest: list[dict[str, Any]] = []
    for a in queue:
        (work if len(work) < n and a["k"] == k else rest).append(a)
    return work, rest
