"""Metrics of one RL step, with the field's usual names (see elr_rl/metrics.py)."""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from elr_rl.rl.messages import GenerateReply, Group, StepResult


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def group_metrics(groups: list[Group]) -> dict[str, float]:
    """Reward, pass rate and response length overall, per loop count and per environment;
    pass rate also per (environment, loop count); the fraction of samples cut at the token budget."""
    out: dict[str, float] = {}
    by: dict[str, list] = defaultdict(list)
    for g in groups:
        env = g.assignment.env
        for s in g.samples:
            row = (s.reward, float(s.accuracy), float(s.num_model_tokens))
            for key in ("mean", f"k{g.k}", f"env/{env}"):
                by[key].append(row)
            by[f"env/{env}/k{g.k}"].append(row)
    for key, rows in by.items():
        out[f"critic/pass_rate/{key}"] = _mean([r[1] for r in rows])
        if key.count("/") < 2:  # per (env, k): pass rate only
            out[f"critic/score/{key}"] = _mean([r[0] for r in rows])
            out[f"response_length/{key}"] = _mean([r[2] for r in rows])
    samples = [s for g in groups for s in g.samples]
    if samples:
        out["response_length/clip_ratio"] = _mean([float(s.finish_reason == "length") for s in samples])
    return out


@dataclass
class BatchInfo:
    """What the driver knows of the batch a learner step trains on (for that step's metrics row)."""

    groups: list[Group]
    staleness: list[int]  # policy versions between each group's sampler and the learner
    dropped_stale_new: int  # groups dropped as stale since the previous batch
    lr: float
    stats: dict[str, float]  # batch/* metrics of select_samples and learner_batches
    queued: bool = False  # submitted while the learner was still running the previous step


class StepWindow:
    """Everything since the last metrics row (groups scored, prompts routed, parity checks, weight
    loads, busy seconds of both sides) and the row built from it at the end of a learner step."""

    def __init__(self) -> None:
        self.t_run = self.t_row = time.perf_counter()
        self.groups: list[Group] = []  # scored since the last row
        self.routed: list[Any] = []  # curriculum assignments handed out since the last row
        self.parity: list[float] = []  # finished trainer/rollout logprob checks
        self.weight_loads: list[float] = []  # worker-side weight load seconds
        self.rollout_busy_s = 0.0  # summed over workers: seconds their engines were in use
        self.replies = self.joined = 0  # generate replies, and those whose request joined a running batch
        self.learner_busy_s = 0.0

    def add_reply(self, reply: GenerateReply) -> None:
        self.rollout_busy_s += reply.busy_s
        self.replies += 1
        self.joined += reply.joined
        if reply.weight_load_s:
            self.weight_loads.append(reply.weight_load_s)

    def row(self, results: list[StepResult], info: BatchInfo, *, learner_s: float, version: int, ledger,
            restarts: int, sync_s: float, num_workers: int) -> dict[str, Any]:
        """The step's metrics row (idle ratios over this window: start-up counts against neither side); resets."""
        from elr_rl.metrics import curriculum_metrics

        now = time.perf_counter()
        window_s = max(now - self.t_row, 1e-9)
        self.learner_busy_s += learner_s
        row = step_metrics(results, info, version=version, window=self.groups, ledger=ledger, restarts=restarts,
                           sync_s=sync_s, parity=self.parity, weight_loads=self.weight_loads,
                           learner_busy=self.learner_busy_s / window_s,
                           rollout_busy=self.rollout_busy_s / (max(1, num_workers) * window_s),
                           wall=now - self.t_run, window_s=window_s)
        row["timing_s/update_actor"] = learner_s  # as the driver saw it: queueing and transfers included
        row.update(curriculum_metrics(self.routed))
        if self.replies:  # rollout.requests_per_worker > 1: how often a request found its worker's batch running
            row["perf/rollout_joined_frac"] = self.joined / self.replies
        self.t_row, self.groups, self.routed, self.parity, self.weight_loads = now, [], [], [], []
        self.rollout_busy_s = self.learner_busy_s = 0.0
        self.replies = self.joined = 0
        return row


def step_metrics(results: list[StepResult], info: BatchInfo, *, version: int, window: list[Group],
                 ledger, restarts: int, sync_s: float, parity: list[float], weight_loads: list[float],
                 learner_busy: float, rollout_busy: float, wall: float, window_s: float) -> dict[str, Any]:
    """One metrics row. `learner_busy`/`rollout_busy` are fractions of the time since the last row;
    `parity` and `weight_loads` are the checks and worker loads finished since the last row."""
    mb = [s for r in results for s in r.microbatch_stats if s.get("tokens", 0) > 0]
    tokens = sum(s["tokens"] for s in mb)

    def wmean(key: str, update: int | None = None) -> float | None:
        vals = [(s[key], s["tokens"]) for s in mb if key in s and (update is None or s.get("update") == update)]
        return sum(v * w for v, w in vals) / sum(w for _, w in vals) if vals else None

    staleness = info.staleness or [0]
    # timed on the ranks: the slowest rank's optimizer step, and its CPU seconds per wall second (how many
    # threads were busy; below the rank's thread budget means it waited: on memory, locks or another process)
    slowest = max(results, key=lambda r: r.compute_s, default=None)
    compute_s = slowest.compute_s if slowest is not None and slowest.compute_s > 0 else None
    groups = len(info.groups)
    dropped = info.dropped_stale_new
    row: dict[str, Any] = group_metrics(window)
    row.update({
        "actor/pg_loss": sum(sum(r.losses) for r in results) / max(1, len(results)),
        "actor/pg_clipfrac": wmean("clip_frac"), "actor/entropy": wmean("entropy"), "actor/ppo_kl": wmean("kl"),
        "actor/loop_credit_loss": wmean("loop_credit_loss"),  # algo.loop_credit: the shallower loops' term
        "actor/is_weight_mean": wmean("is_weight_mean"), "actor/ratio_mean": wmean("ratio_mean"),
        "actor/grad_norm": results[0].grad_norm, "actor/lr": info.lr,
        # the first update of a step starts from the weights that the old logprobs came from
        "actor/ratio_mean/update0": wmean("ratio_mean", 0), "actor/is_weight_mean/update0": wmean("is_weight_mean", 0),
        "actor/ratio_max_dev/update0": max((abs(s["ratio_mean"] - 1) for s in mb if s.get("update") == 0), default=None),
        "async/staleness_mean": _mean([float(x) for x in staleness]), "async/staleness_max": max(staleness),
        "async/queued_step": float(info.queued),
        "async/policy_version": version, "async/dropped_stale_groups": ledger.get("dropped_stale", 0),
        "async/dropped_stale_frac": dropped / (dropped + groups) if dropped + groups else 0.0,
        "batch/frac_reward_zero_std": info.stats.get("batch/uninformative_groups", 0.0) / groups if groups else None,
        "timing_s/step": window_s, "timing_s/weight_sync": sync_s, "timing_s/elapsed": wall,
        "timing_s/weight_load": max(weight_loads) if weight_loads else None,
        "timing_s/learner_compute": compute_s,
        # the ranks' idle time since their previous step (waiting on generation, or on the driver)
        "timing_s/learner_wait": max((r.wait_s for r in results if r.wait_s is not None), default=None),
        "perf/learner_threads_busy": slowest.cpu_s / compute_s if compute_s else None,
        # learner.borrow_idle_cores: the rollout cores the slowest rank ran on besides its own, on average
        "perf/learner_borrowed_cores": slowest.borrowed_core_s / compute_s if compute_s else None,
        "perf/weight_sync_frac": min(1.0, sync_s / window_s) if window_s else None,
        "perf/learner_idle_ratio": max(0.0, 1.0 - learner_busy),
        "perf/rollout_idle_ratio": max(0.0, 1.0 - rollout_busy), "perf/trained_tokens": tokens,
        "perf/trained_tokens_per_s": tokens / window_s if window_s else None,
        "faults/restarted_workers": restarts, "faults/requeued_prompts": ledger.get("requeued", 0),
        "sync/parity_max_abs_diff": max(parity) if parity else None,
    })
    # the batch's depth mix and its size in token-loops (prompt + response tokens x k): steps at different k
    # mixes carry different learner work, so compare learner speed as loop tokens per second, not steps
    for k in sorted({g.k for g in info.groups}):
        row[f"batch/groups_k{k}"] = sum(g.k == k for g in info.groups)
    loop_tokens = sum((len(s.prompt_ids) + len(s.response_ids)) * g.k for g in info.groups for s in g.samples)
    row["batch/loop_tokens"] = loop_tokens
    if compute_s:
        row["perf/learner_loop_tokens_per_s"] = loop_tokens / compute_s
        # the tokens the learner ran x the sublayers each passed through (D_eff(k)): a speed that does not
        # move with the batch's depth mix (k = 1 runs 4 sublayers per loop of a 1 + 2 + 1 model, k = 4 2.5)
        if info.stats.get("batch/learner_sublayer_tokens"):
            row["perf/learner_sublayer_tokens_per_s"] = info.stats["batch/learner_sublayer_tokens"] / compute_s
    gen_tokens = sum(s.num_model_tokens for g in window for s in g.samples)
    row["perf/gen_tokens_per_s"] = gen_tokens / window_s if window_s else 0.0  # generated since the last row
    row.update(info.stats)
    return {k: v for k, v in row.items() if v is not None}
