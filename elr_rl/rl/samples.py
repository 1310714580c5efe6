"""Rollout samples, the rollout buffer, and their packing into learner microbatches.

A `Group` is one prompt's G completions at one loop count k, tagged with the
policy version that produced it. The buffer hands the learner groups no older
than `max_staleness` versions; `learner_batches` turns groups into per-rank
microbatches (per loop count, so each sample is trained at the k that produced
it; within a token budget per row), balanced across ranks by cost = tokens x D_eff(k).
"""

from __future__ import annotations

import collections
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Callable, Iterable, Sequence

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
    prompt_len: int = 0  # ids[:prompt_len] is the prompt, the same for every sample of the group
    group: int = -1  # the samples of one group (>= 0) share their prompt in the learner's packed rows


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
    for gi, g in enumerate(groups):
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
            out.append(TrainSample(ids, mask, logp, a, g.k, prompt_len=min(len(s.prompt_ids), max_seq_len), group=gi))
    stats = {"batch/uninformative_groups": float(n_uninformative), "batch/overlong_samples": float(n_overlong),
             "batch/trained_samples": float(len(out))}
    return out, stats


def _shares_prompt(s: TrainSample) -> bool:
    """A sample whose prompt can be shared: it has one, something after it, and no trained token in it."""
    return s.group >= 0 and 0 < s.prompt_len < len(s.ids) and not any(s.loss_mask[: s.prompt_len])


def pack_units(samples: list[TrainSample], share_prompts: bool) -> list[list[int]]:
    """Indices of the samples that go into the learner together: with `share_prompts`, the samples of one
    group at one loop count with the same prompt; every other sample alone. In first-seen order."""
    units: dict[tuple, list[int]] = {}
    for i, s in enumerate(samples):
        key = (s.k, s.group, tuple(s.ids[: s.prompt_len])) if share_prompts and _shares_prompt(s) else ("alone", i)
        units.setdefault(key, []).append(i)
    return list(units.values())


def unit_tokens(samples: list[TrainSample], unit: list[int]) -> int:
    """Tokens a unit puts in the packed row: the shared prompt once, then each sample's tail."""
    if len(unit) == 1:
        return len(samples[unit[0]].ids)
    p = samples[unit[0]].prompt_len
    return p + sum(len(samples[i].ids) - p for i in unit)


_PACK_LONG = ("input_ids", "positions", "segment_ids", "parent_ids", "pred_index", "sequence_ids")
_PACK_FLOAT = ("loss_mask", "rollout_logp", "advantages")


def pack(samples: list[TrainSample], global_denominator: float, share_prompts: bool = True) -> dict[str, torch.Tensor]:
    """One microbatch as one packed row [1, T], no padding; the model attends per segment (`SegmentCore`).

    A sample is a segment of its own; with `share_prompts`, a group's samples with the same prompt share
    one copy of it: the prompt is a segment, and each sample's tail a segment whose parent is the prompt
    (positions continuing from it), so every tail sees exactly what it sees in its own sequence. The
    per-token tensors are aligned with `input_ids`: `pred_index[t]` is the row index whose logits predict
    token t (the previous token of its own sequence; a tail's first token: the prompt's last),
    `sequence_ids` the sample a token belongs to (-1 for a shared prompt), `advantages` its sample's
    advantage. An empty list (or one of samples without tokens) gives one untrained two-token row.
    """
    cols: dict[str, list] = {name: [] for name in _PACK_LONG + _PACK_FLOAT}

    def emit(ids, positions, seg, parent, first_pred, mask, logp, adv, seq):
        start = len(cols["input_ids"])
        cols["input_ids"] += ids
        cols["positions"] += positions
        cols["segment_ids"] += [seg] * len(ids)
        cols["parent_ids"] += [parent] * len(ids)
        cols["pred_index"] += [first_pred] + list(range(start, start + len(ids) - 1))
        cols["loss_mask"] += mask
        cols["rollout_logp"] += logp
        cols["advantages"] += [adv] * len(ids)
        cols["sequence_ids"] += [seq] * len(ids)

    real = [s for s in samples if s.ids]  # a sample without tokens has nothing to compute or train
    rows = real or [TrainSample([0, 0], [0, 0], [0.0, 0.0], 0.0, 1)]
    seg = 0
    for unit in pack_units(rows, share_prompts):
        if len(unit) == 1:  # a sequence on its own; its first token has no context and is never trained
            s = rows[unit[0]]
            emit(s.ids, list(range(len(s.ids))), seg, -1, len(cols["input_ids"]), [0] + list(s.loss_mask[1:]),
                 list(s.rollout_logp), s.advantage, unit[0] if real else -1)
            seg += 1
            continue
        first = rows[unit[0]]
        p = first.prompt_len
        emit(first.ids[:p], list(range(p)), seg, -1, len(cols["input_ids"]), [0] * p, [0.0] * p, 0.0, -1)
        prompt_seg, prompt_last = seg, len(cols["input_ids"]) - 1
        seg += 1
        for i in unit:
            s = rows[i]
            emit(s.ids[p:], list(range(p, len(s.ids))), seg, prompt_seg, prompt_last, list(s.loss_mask[p:]),
                 list(s.rollout_logp[p:]), s.advantage, i)
            seg += 1
    out = {name: torch.tensor([cols[name]], dtype=torch.long) for name in _PACK_LONG}
    out |= {name: torch.tensor([cols[name]], dtype=torch.float32) for name in _PACK_FLOAT}
    out |= logit_selection(cols["pred_index"], cols["loss_mask"])
    out["global_denominator"] = torch.tensor(global_denominator)
    return out


def logit_selection(pred_index: list[int], loss_mask: list[float]) -> dict[str, torch.Tensor]:
    """The positions whose logits a packed row trains on (`logit_rows` [1, N]: those predicting a trained
    token, in order) and where each token's predictor sits among them (`logit_index` [1, T]; 0 for an
    untrained token, which the mask drops). The model then computes the head, and the sublayers after
    its last attention, for those rows alone: a shared prompt's positions predict nothing trained but
    its last one predicts the first completion token."""
    rows = sorted({p for p, m in zip(pred_index, loss_mask) if m > 0}) or [0]
    where = {r: i for i, r in enumerate(rows)}
    return {"logit_rows": torch.tensor([rows], dtype=torch.long),
            "logit_index": torch.tensor([[where.get(p, 0) for p in pred_index]], dtype=torch.long)}


def learner_batches(samples: list[TrainSample], world_size: int, depth: Callable[[int], int],
                    aggregation: str, loop_counts: list[int], share_prompts: bool = True,
                    max_tokens: int | None = None) -> LearnerBatch:
    """Split samples over ranks (greedy by cost = tokens x D_eff(k)) and into microbatches per k.

    A microbatch is one packed row (`pack`): no padding, and with `share_prompts` each group's prompt
    computed once for all its samples; a group's samples at one k stay on one rank. Each k gets one
    microbatch, or with `max_tokens` as many as keep every row within that many tokens (a group too
    big for one row is split, each part with its own copy of the prompt; a sample longer than the
    budget trains alone in a row of its own, counted in `batch/over_budget_samples`). Every rank runs
    the same microbatches' loop counts in the same order (a rank with less work gets empty ones: an
    untrained two-token row), so the backward passes and the gradient all-reduces line up, and all
    depths meet in one optimizer step. Every microbatch carries the whole batch's
    `global_denominator` (trained tokens, or sequences with a trained token, per `aggregation`), so
    the pieces' losses add up to the batch's (`grpo.aggregate`), and `accum_steps`, the step's
    microbatch count, which undoes the engine's division by it.
    """
    if max_tokens is not None and max_tokens < 2:
        raise ValueError(f"max_tokens={max_tokens}: a microbatch needs room for at least 2 tokens")
    ks = list(loop_counts)
    unknown = {s.k for s in samples} - set(ks)
    if unknown:
        raise ValueError(f"samples at loop counts {sorted(unknown)} are not in loop_counts {ks}")
    units = pack_units(samples, share_prompts)
    cost = [unit_tokens(samples, u) * depth(samples[u[0]].k) for u in units]
    loads = [0.0] * world_size
    per_rank: list[list[TrainSample]] = [[] for _ in range(world_size)]
    for j in sorted(range(len(units)), key=lambda j: -cost[j]):
        r = min(range(world_size), key=loads.__getitem__)
        per_rank[r] += [samples[i] for i in units[j]]
        loads[r] += cost[j]
    # a sample's first token has no context and is never trained (`pack`)
    if aggregation == "token":
        denominator = sum(sum(s.loss_mask[1:]) for s in samples)
    else:
        denominator = sum(1 for s in samples if any(s.loss_mask[1:]))
    denominator = max(float(denominator), 1.0)
    # rows[r][k]: rank r's microbatches at k, as lists of samples; then every rank gets as many at each k
    rows = [{k: token_bounded_rows([s for s in rank if s.k == k], share_prompts, max_tokens) for k in ks}
            for rank in per_rank]
    count = {k: max(len(rank[k]) for rank in rows) for k in ks}
    order = [k for k in ks for _ in range(count[k])]
    steps = torch.tensor(float(len(order)))
    mbs: list[list[dict[str, torch.Tensor]]] = []
    computed = sublayer_tokens = 0  # tokens in the rows (a group cut in parts has a prompt per part); not pads
    for rank in rows:
        mbs.append([])
        for k in ks:
            for part in rank[k] + [[]] * (count[k] - len(rank[k])):
                mbs[-1].append(pack(part, denominator, share_prompts) | {"k": k, "accum_steps": steps})
                tokens = mbs[-1][-1]["input_ids"].shape[1] if any(s.ids for s in part) else 0
                computed += tokens
                sublayer_tokens += tokens * depth(k)
    cost_max, cost_mean = max(loads), sum(loads) / world_size
    over = sum(1 for s in samples if max_tokens is not None and len(s.ids) > max_tokens)
    stats = {"batch/rank_cost_imbalance": cost_max / cost_mean if cost_mean else 1.0,
             "batch/normalizer": denominator,
             "batch/learner_tokens": float(computed),
             "batch/learner_sublayer_tokens": float(sublayer_tokens),  # each token x D_eff(k): the work
             "batch/shared_prompt_tokens": float(sum(len(s.ids) for s in samples) - computed),
             "batch/microbatches": float(len(order)),
             "batch/over_budget_samples": float(over)}
    return LearnerBatch(mbs, [list(order) for _ in range(world_size)], stats)


def token_bounded_rows(samples: list[TrainSample], share_prompts: bool, max_tokens: int | None
                       ) -> list[list[TrainSample]]:
    """The samples (of one rank and loop count) as packed rows of at most max_tokens tokens each
    (None: one row). Units (a group sharing its prompt, or one sample) go whole into the first row with
    room, biggest first; a unit over the budget is cut into parts of its samples, each with its own
    copy of the prompt; a single sample over the budget gets a row of its own. Always >= 1 row."""
    if max_tokens is None or not samples:
        return [samples]
    pieces: list[list[int]] = []
    for unit in pack_units(samples, share_prompts):
        if unit_tokens(samples, unit) <= max_tokens:
            pieces.append(unit)
            continue
        part: list[int] = []
        for i in unit:
            if part and unit_tokens(samples, part + [i]) > max_tokens:
                pieces.append(part)
                part = []
            part.append(i)
        pieces.append(part)
    rows: list[list[int]] = []
    room: list[int] = []
    for piece in sorted(pieces, key=lambda p: -unit_tokens(samples, p)):
        need = unit_tokens(samples, piece)
        r = next((r for r in range(len(rows)) if room[r] >= need), None)
        if r is None:
            rows.append([])
            room.append(max_tokens)
            r = len(rows) - 1
        rows[r] += piece
        room[r] -= need
    return [[samples[i] for i in row] for row in rows]


def take_one_loop_count(queue: Sequence[Assignment], n: int, k: int | None = None) -> tuple[list[Assignment], list[Assignment]]:
    """Up to n assignments at loop count k (default: the oldest one's), in queue order, and the rest (in order).

    A rollout request then runs one k (one batched generate).
    """
    if not queue:
        return [], []
    k = queue[0].k if k is None else k
    work: list[Assignment] = []
    rest: list[Assignment] = []
    for a in queue:
        (work if len(work) < n and a.k == k else rest).append(a)
    return work, rest


def sweep_loop_count(waiting: Iterable[int], last: int | None, rising: bool) -> tuple[int | None, bool]:
    """The next request's loop count and sweep direction: the nearest waiting k past `last` in the
    direction of the sweep, turning at the ends (an elevator's scan: 1, 2, 3, 4, 3, 2, 1, 2, ...).

    Consecutive requests then differ by the least depth the queue allows. With few requests per
    learner step, a jump (a k = 1 step followed by a k = 4 batch) leaves the learner waiting on a
    generation four times its step's size; steps of similar depth overlap evenly. Every waiting k is
    served within one sweep. Returns (None, rising) when nothing waits, (k, ...) for `last` None: the
    smallest k, rising.
    """
    ks = set(waiting)
    if not ks:
        return None, rising
    if last is None:
        return min(ks), True
    ahead = [k for k in ks if (k > last if rising else k < last)]
    if ahead:
        return (min(ahead) if rising else max(ahead)), rising
    behind = [k for k in ks if (k < last if rising else k > last)]
    if behind:
        return (max(behind) if rising else min(behind)), not rising
    return last, rising
