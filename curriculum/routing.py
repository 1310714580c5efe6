"""Difficulty-aware loop routing, plain Python, no Ray.

    q_i = (#{j: p_j < p_i} + 0.5 * #{j: p_j = p_i}) / N     midpoint quantile of pass rate
    s_i = alpha * q_i + (1 - alpha) * u_i,  u_i ~ U(0, 1)    routing score
    lowest scores (hardest, unluckiest) fill the deepest-loop slots first.

Ties count half, so a table where many prompts sit at pass rate 0 or 1 still
spreads them over the middle of [0, 1] instead of piling them at an end; a
table where every prompt has the same pass rate gives q = 0.5 everywhere.

Prompts are served in epochs: each epoch is a fresh permutation of the pool
and hands every (not dropped) prompt out exactly once; batches run straight
across epoch boundaries. All randomness comes from one seeded numpy Generator
whose state is in `state_dict()`, so a restored router continues the same
sequence of assignments.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Optional

import numpy as np

from curriculum.passrates import (
    PassRateTracker,
    RolloutResult,
    pool_fingerprint,
    pooled_profile,
    validate_profile_rows,
)


@dataclass
class CurriculumConfig:
    """Loop-curriculum settings (the `curriculum` section of an RL or profile config)."""

    alpha: float = 0.3
    """Weight of difficulty in the routing score s = alpha*q + (1-alpha)*u; 1 = pure difficulty, 0 = random."""
    batch_size: int = 16
    """Prompts per batch handed out by `next_batch()` (each prompt is then rolled out as a group)."""
    loop_counts: list[int] = field(default_factory=lambda: [1, 2, 3, 4])
    """Loop counts k that receive slots in every batch."""
    slot_counts: Optional[list[int]] = None
    """Prompts per batch for each entry of loop_counts (must sum to batch_size); None = equal shares."""
    prior_pass_rate: float = 0.5
    """Pass rate assumed for prompts that were never profiled and whose (environment, difficulty) has no
    profiled prompt either (an unprofiled prompt of a profiled group starts at that group's pooled rate)."""
    prior_weight: float = 8.0
    """Pseudo-samples the prior (profile or prior_pass_rate) counts for against live rollouts."""
    live_decay: float = 0.7
    """Per-report forgetting factor gamma of the live estimate (1 = plain cumulative counts)."""
    drop_solved: bool = False
    """Stop handing out prompts whose estimated pass rate reached solved_threshold."""
    solved_threshold: float = 1.0
    """Estimated pass rate at or above which a prompt counts as always solved."""
    min_solved_samples: float = 8.0
    """Decayed sample count a prompt needs before it may be dropped as solved."""
    profile_table: Optional[str] = None
    """Parquet file or profile output directory written by `elr-rl profile` (None = priors only)."""
    profile_k: Optional[int] = None
    """Use only this loop count's rows of the profile table (None = pool all loop counts)."""
    seed: int = 0
    """Seed of the router's generator (epoch permutations and the score noise u)."""
    save_interval_s: float = 0.0
    """Least seconds between state writes caused by report() (next_batch always writes); 0 = every call.
    A 23,000-prompt pool's state is ~0.6 MB, ~30 ms a write: raise this when reports are many and small."""

    def validate(self) -> None:
        if not 0.0 <= self.alpha <= 1.0:
            raise ValueError(f"curriculum.alpha must be in [0, 1], got {self.alpha}")
        if self.batch_size <= 0:
            raise ValueError(f"curriculum.batch_size must be positive, got {self.batch_size}")
        if not 0.0 <= self.prior_pass_rate <= 1.0:
            raise ValueError(f"curriculum.prior_pass_rate must be in [0, 1], got {self.prior_pass_rate}")
        if self.prior_weight <= 0:
            raise ValueError(f"curriculum.prior_weight must be > 0, got {self.prior_weight}")
        if self.save_interval_s < 0:
            raise ValueError(f"curriculum.save_interval_s must be >= 0, got {self.save_interval_s}")
        if not 0.0 < self.live_decay <= 1.0:
            raise ValueError(f"curriculum.live_decay must be in (0, 1], got {self.live_decay}")
        slot_plan(self.batch_size, self.loop_counts, self.slot_counts)


@dataclass(frozen=True)
class Prompt:
    """One prompt of the pool: an environment task named by (env, difficulty, seed)."""

    env: str
    difficulty: int
    seed: int

    @property
    def prompt_id(self) -> str:
        # Same spelling as environments.base.Task.id, so profile rows and tasks join on it.
        return f"{self.env}/d{self.difficulty}/s{self.seed}"


@dataclass
class Assignment:
    """One routed prompt of a batch: roll prompt `prompt_id` out at loop count `k`."""

    prompt_id: str
    env: str
    seed: int
    difficulty: int
    k: int
    q: float  # midpoint quantile of its pass rate when routed
    score: float  # routing score s = alpha*q + (1-alpha)*u
    batch: int  # index of the batch it belongs to (0-based, across epochs)
    epoch: int  # epoch whose permutation handed it out


def build_pool(envs: Iterable[str], difficulties: Iterable[int], seeds: Iterable[int]) -> list[Prompt]:
    """Every (env, difficulty, seed) combination, in a fixed order."""
    seeds, difficulties = list(seeds), list(difficulties)
    return [Prompt(e, d, s) for e in envs for d in difficulties for s in seeds]


def pool_from_profile(rows: Iterable[dict[str, Any]]) -> list[Prompt]:
    """The distinct prompts of a profile table, in first-seen order."""
    seen: dict[str, Prompt] = {}
    for row in validate_profile_rows(rows):
        prompt = Prompt(str(row["env"]), int(row["difficulty"]), int(row["seed"]))
        seen.setdefault(prompt.prompt_id, prompt)
    return list(seen.values())


def midpoint_quantiles(pass_rates: np.ndarray | list[float]) -> np.ndarray:
    """q_i = (#{j: p_j < p_i} + 0.5 * #{j: p_j == p_i}) / N, over all N prompts.

    Counting prompt i itself among its ties makes an all-equal table give
    exactly 0.5 and keeps q in (0, 1): a single prompt has q = 0.5.
    """
    p = np.asarray(pass_rates, dtype=np.float64)
    if p.size == 0:
        return p.copy()
    srt = np.sort(p)
    below = np.searchsorted(srt, p, side="left")
    at_or_below = np.searchsorted(srt, p, side="right")
    return (below + 0.5 * (at_or_below - below)) / p.size


def routing_scores(q: np.ndarray, u: np.ndarray, alpha: float) -> np.ndarray:
    """s = alpha * q + (1 - alpha) * u."""
    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    return alpha * np.asarray(q, dtype=np.float64) + (1.0 - alpha) * np.asarray(u, dtype=np.float64)


def slot_plan(batch_size: int, loop_counts: list[int], slot_counts: list[int] | None) -> dict[int, int]:
    """k -> slots per batch. None = equal shares (batch_size must divide evenly)."""
    ks = [int(k) for k in loop_counts]
    if not ks or any(k < 1 for k in ks) or len(set(ks)) != len(ks):
        raise ValueError(f"curriculum.loop_counts must be distinct loop counts >= 1, got {list(loop_counts)}")
    if slot_counts is None:
        if batch_size % len(ks):
            raise ValueError(
                f"batch_size {batch_size} does not split into equal shares for loop counts {ks}: "
                "set curriculum.slot_counts explicitly or change batch_size"
            )
        return {k: batch_size // len(ks) for k in ks}
    counts = [int(c) for c in slot_counts]
    if len(counts) != len(ks) or any(c < 0 for c in counts):
        raise ValueError(f"curriculum.slot_counts {counts} must give one count >= 0 per loop count {ks}")
    if sum(counts) != batch_size:
        raise ValueError(
            f"curriculum.slot_counts {counts} sum to {sum(counts)}, not batch_size {batch_size}: "
            "make them add up to the batch size"
        )
    return dict(zip(ks, counts))


def assign_slots(scores: np.ndarray, plan: dict[int, int]) -> list[int]:
    """Loop count for each score: ascending scores fill the deepest k's slots first.

    Ties keep their batch order (stable sort), so the result is deterministic.
    """
    if len(scores) != sum(plan.values()):
        raise ValueError(f"{len(scores)} scores for {sum(plan.values())} slots")
    order = np.argsort(np.asarray(scores), kind="stable")
    ks = [k for k in sorted(plan, reverse=True) for _ in range(plan[k])]
    out = [0] * len(ks)
    for rank, i in enumerate(order):
        out[int(i)] = ks[rank]
    return out


class LoopRouter:
    """Hands out batches of (prompt, k) assignments and learns pass rates from results."""

    def __init__(
        self,
        cfg: CurriculumConfig,
        pool: list[Prompt],
        profile_rows: list[dict[str, Any]] | None = None,
    ) -> None:
        cfg.validate()
        ids = [p.prompt_id for p in pool]
        if len(set(ids)) != len(ids):
            raise ValueError("the prompt pool holds duplicate prompts: each (env, difficulty, seed) must appear once")
        if len(pool) < cfg.batch_size:
            raise ValueError(f"the prompt pool has {len(pool)} prompts, fewer than batch_size {cfg.batch_size}")
        self.cfg = cfg
        self.pool = list(pool)
        self.plan = slot_plan(cfg.batch_size, cfg.loop_counts, cfg.slot_counts)
        profile = pooled_profile(validate_profile_rows(profile_rows or []), cfg.profile_k)
        self.tracker = PassRateTracker(ids, profile, cfg.prior_pass_rate, cfg.prior_weight, cfg.live_decay)
        self.rng = np.random.default_rng(cfg.seed)
        self.epoch = -1
        self.perm: list[int] = []  # pool indices of the current epoch, in serving order
        self.cursor = 0  # next position in perm
        self.batches = 0
        self.dropped: set[int] = set()
        self._q_cache: tuple[int, np.ndarray] | None = None
        self.totals = _Totals()

    # -- routing ------------------------------------------------------------------------
    def quantiles(self) -> np.ndarray:
        """Midpoint quantiles of every pool prompt's current pass-rate estimate.

        Dropped (solved) prompts stay in the reference set: they are the easiest,
        so dropping them never changes the order of the others.
        """
        if self._q_cache is None or self._q_cache[0] != self.tracker.version:
            self._q_cache = (self.tracker.version, midpoint_quantiles(self.tracker.estimates()))
        return self._q_cache[1]

    def next_batch(self) -> list[Assignment]:
        """The next batch: batch_size prompts, routed to loop counts by score (lowest = deepest)."""
        drawn = self._draw(self.cfg.batch_size)
        q = self.quantiles()[[i for i, _ in drawn]]
        u = self.rng.random(len(drawn))
        s = routing_scores(q, u, self.cfg.alpha)
        ks = assign_slots(s, self.plan)
        out = []
        for (i, epoch), k, qi, si in zip(drawn, ks, q, s):
            p = self.pool[i]
            out.append(
                Assignment(p.prompt_id, p.env, p.seed, p.difficulty, k, float(qi), float(si), self.batches, epoch)
            )
        out.sort(key=lambda a: (-a.k, a.score))
        self.totals.add_batch(out)
        self.batches += 1
        return out

    def _draw(self, n: int) -> list[tuple[int, int]]:
        """n distinct (pool index, epoch) pairs from the epoch stream, skipping dropped prompts."""
        drawn: list[tuple[int, int]] = []
        taken: set[int] = set()
        while len(drawn) < n:
            if self.cursor >= len(self.perm):
                self._new_epoch(taken)
            i = self.perm[self.cursor]
            self.cursor += 1
            if i in self.dropped:
                continue
            drawn.append((i, self.epoch))
            taken.add(i)
        return drawn

    def _new_epoch(self, taken: set[int]) -> None:
        """Start the next epoch's permutation over the prompts not dropped.

        Prompts already in the batch being drawn move to the end of the new
        permutation, so a batch that straddles two epochs never repeats one.
        """
        self._refresh_dropped()
        active = [i for i in range(len(self.pool)) if i not in self.dropped]
        if len(active) < self.cfg.batch_size:
            raise RuntimeError(
                f"only {len(active)} prompts remain after dropping solved ones, fewer than batch_size "
                f"{self.cfg.batch_size}: add prompts, lower batch_size or set curriculum.drop_solved=false"
            )
        perm = [active[j] for j in self.rng.permutation(len(active))]
        self.perm = [i for i in perm if i not in taken] + [i for i in perm if i in taken]
        self.cursor = 0
        self.epoch += 1

    def _refresh_dropped(self) -> None:
        if not self.cfg.drop_solved:
            return
        p, n = self.tracker.estimates(), self.tracker.evidence()
        solved = (p >= self.cfg.solved_threshold - 1e-12) & (n >= self.cfg.min_solved_samples)
        self.dropped |= {int(i) for i in np.flatnonzero(solved)}

    # -- live refresh -------------------------------------------------------------------
    def report(self, results: Iterable[RolloutResult]) -> int:
        """Fold finished rollouts into the pass-rate estimates; returns how many were applied.

        All results are checked before any is applied, so a bad one changes nothing.
        """
        checked = list(results)
        unknown = [r.prompt_id for r in checked if r.prompt_id not in self.tracker.index]
        if unknown:
            raise ValueError(f"results for prompts not in the curriculum's pool: {unknown[:5]}")
        for result in checked:
            self.tracker.update(result)
            self.totals.add_result(result)
        if self.cfg.drop_solved:
            self._refresh_dropped()  # dropped prompts are skipped for the rest of the epoch too
        return len(checked)

    # -- inspection ---------------------------------------------------------------------
    def stats(self) -> dict[str, Any]:
        """Dashboard numbers: slots, q, scores, pass rates, rewards and lengths per k."""
        p = self.tracker.estimates()
        return {
            "batches": self.batches,
            "epoch": self.epoch,
            "pool_size": len(self.pool),
            "dropped": len(self.dropped),
            "unprofiled": int((~self.tracker.profiled).sum()),
            "mean_pass_rate": float(p.mean()),
            "pass_rate_histogram": np.histogram(p, bins=10, range=(0.0, 1.0))[0].tolist(),
            **self.totals.summary(),
        }

    # -- state --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {
            "version": 1,
            "config": asdict(self.cfg),
            "pool": pool_fingerprint(self.tracker.prompt_ids),
            "rng": self.rng.bit_generator.state,
            "epoch": self.epoch,
            "perm": list(self.perm),  # pool indices (the fingerprint pins the pool's order)
            "cursor": self.cursor,
            "batches": self.batches,
            "dropped": sorted(self.dropped),
            "tracker": self.tracker.state_dict(),
            "totals": self.totals.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["pool"] != pool_fingerprint(self.tracker.prompt_ids):
            raise ValueError("saved curriculum state belongs to a different prompt pool: start a fresh run directory")
        self.rng.bit_generator.state = state["rng"]
        self.epoch = int(state["epoch"])
        self.perm = [int(i) for i in state["perm"]]
        self.cursor = int(state["cursor"])
        self.batches = int(state["batches"])
        self.dropped = {int(i) for i in state["dropped"]}
        self.tracker.load_state_dict(state["tracker"])
        self.totals.load_state_dict(state["totals"])
        self._q_cache = None


class _Totals:
    """Running sums per loop count for `stats()` (kept small: no per-batch history)."""

    BINS = 10

    def __init__(self) -> None:
        self.slots: Counter[int] = Counter()
        self.q_sum: Counter[int] = Counter()
        self.score_hist = [0] * self.BINS
        self.last_batch: dict[str, dict[str, float]] = {}
        # k -> [samples, successes, groups, reward_sum, reward_groups, tokens_sum, token_groups]
        self.results: dict[int, list[float]] = {}

    def add_batch(self, batch: list[Assignment]) -> None:
        last: dict[str, dict[str, float]] = {}
        for a in batch:
            self.slots[a.k] += 1
            self.q_sum[a.k] += a.q
            self.score_hist[min(int(a.score * self.BINS), self.BINS - 1)] += 1
            entry = last.setdefault(str(a.k), {"prompts": 0, "q_sum": 0.0})
            entry["prompts"] += 1
            entry["q_sum"] += a.q
        self.last_batch = {
            k: {"prompts": v["prompts"], "mean_q": v["q_sum"] / v["prompts"]} for k, v in sorted(last.items())
        }

    def add_result(self, r: RolloutResult) -> None:
        acc = self.results.setdefault(r.k, [0.0] * 7)
        acc[0] += r.samples
        acc[1] += r.successes
        acc[2] += 1
        if r.reward_mean is not None:
            acc[3] += r.reward_mean
            acc[4] += 1
        if r.response_tokens_mean is not None:
            acc[5] += r.response_tokens_mean
            acc[6] += 1

    def summary(self) -> dict[str, Any]:
        per_k: dict[str, dict[str, Any]] = {}
        for k in sorted(set(self.slots) | set(self.results)):
            row: dict[str, Any] = {"prompts": self.slots[k]}
            row["mean_q"] = self.q_sum[k] / self.slots[k] if self.slots[k] else None
            acc = self.results.get(k)
            if acc:
                row["samples"] = int(acc[0])
                row["pass_rate"] = acc[1] / acc[0] if acc[0] else None
                row["mean_reward"] = acc[3] / acc[4] if acc[4] else None
                row["mean_response_tokens"] = acc[5] / acc[6] if acc[6] else None
            per_k[str(k)] = row
        return {"per_k": per_k, "last_batch": self.last_batch, "score_histogram": list(self.score_hist)}

    def state_dict(self) -> dict[str, Any]:
        return {
            "slots": {str(k): v for k, v in self.slots.items()},
            "q_sum": {str(k): v for k, v in self.q_sum.items()},
            "score_hist": self.score_hist,
            "last_batch": self.last_batch,
            "results": {str(k): v for k, v in self.results.items()},
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.slots = Counter({int(k): int(v) for k, v in state["slots"].items()})
        self.q_sum = Counter({int(k): float(v) for k, v in state["q_sum"].items()})
        self.score_hist = list(state["score_hist"])
        self.last_batch = dict(state["last_batch"])
        self.results = {int(k): list(v) for k, v in state["results"].items()}
