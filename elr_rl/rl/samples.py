"""Rollout samples, the rollout buffer, and their packing into learner microbatches.

A `Group` is one prompt's G completions at one loop count k, tagged with the
policy version that produced it. The buffer hands the learner groups no older
than `max_staleness` versions; `learner_batches` turns groups into per-rank
microbatches (one per loop count, so each sample is trained at the k that
produced it), balanced across ranks by cost = tokens x D_eff(k).
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Sequence

import torch

from curriculum.routing import Assignment
from elr_rl.rl import grpo
from elr_rl.rl.messages import FinishReason, Group, Sample


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
        """JSON-ready (a checkpoint's run_state.json)."""
        # buffered groups are scored: their tasks are not kept (rebuilt from the assignment if ever needed)
        return {"groups": [asdict(replace(g, task=None)) for g in self.groups], "dropped_stale": self.dropped_stale}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.groups = collections.deque(_group_from_json(g) for g in state["groups"])
        self.dropped_stale = state["dropped_stale"]


def _group_from_json(d: dict[str, Any]) -> Group:
    samples = [Sample(**(s | {"finish_reason": FinishReason(s["finish_reason"])})) for s in d["samples"]]
    return Group(Assignment(**d["assignment"]), samples, d["version"], d["worker_id"], scored=d.get("scored", True))


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
            if overlong_filter and s.finish_reason == FinishReason.LENGTH:
                n_overlong += 1
                continue
            ids = (s.prompt_ids + s.response_ids)[:max_seq_len]
            mask = ([0] * len(s.prompt_ids) + list(s.response_mask))[:max_seq_len]
            logp = ([0.0] * len(s.prompt_ids) + list(s.rollout_logprobs))[:max_seq_len]
            out.append(TrainSample(ids, mask, logp, a, g.k))
    stats = {"batch/uninformative_groups": float(n_uninformative), "batch/overlong_samples": float(n_overlong),
             "batch/trained_samples": float(len(out))}
    return out, stats


def _collate(samples: list[TrainSample], global_denominator: float) -> dict[str, torch.Tensor]:
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
            "global_denominator": torch.tensor(global_denominator)}


def learner_batches(samples: list[TrainSample], world_size: int, depth: Callable[[int], int],
                    aggregation: str, loop_counts: list[int]) -> LearnerBatch:
    """Split samples over ranks (greedy by cost = tokens x D_eff(k)) and into one microbatch per k.

    Every rank gets one microbatch per entry of `loop_counts` (empty ones are a masked pad
    row), so every rank runs the same number of backward passes and the gradient
    all-reduces line up; all depths meet in one optimizer step. Every microbatch carries the
    whole batch's `global_denominator` (trained tokens, or sequences with a trained token, per
    `aggregation`), so the pieces' losses add up to the batch's (`grpo.aggregate`).
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
        denominator = sum(sum(s.loss_mask) for s in samples)
    else:
        denominator = sum(1 for s in samples if sum(s.loss_mask) > 0)
    denominator = max(float(denominator), 1.0)
    mbs = [[_collate([s for s in rank if s.k == k], denominator) | {"k": k} for k in ks] for rank in per_rank]
    cost_max, cost_mean = max(loads), sum(loads) / world_size
    stats = {"batch/rank_cost_imbalance": cost_max / cost_mean if cost_mean else 1.0,
             "batch/normalizer": denominator}
    return LearnerBatch(mbs, [list(ks) for _ in range(world_size)], stats)


def take_one_loop_count(queue: Sequence[Assignment], n: int) -> tuple[list[Assignment], list[Assignment]]:
    """Up to n assignments at the loop count of the oldest one, in queue order, and the rest (in order).

    A rollout request then runs one k (one batched generate); the oldest assignment always goes,
    so no loop count waits behind the others for long.
    """
    if not queue:
        return [], []
    k = queue[0].k
    work: list[Assignment] = []
    rest: list[Assignment] = []
    for a in queue:
        (work if len(work) < n and a.k == k else rest).append(a)
    return work, rest
