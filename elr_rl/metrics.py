"""Run metrics: JSON lines always, TensorBoard by default, Weights & Biases when configured.

The run directory is the contract between a training run and everything that
watches it (the dashboard, TensorBoard, a user with `jq`). Its layout:

    RUN_DIR/
      config.yaml                 resolved config of the run (elr_rl.config.save_config)
      metrics.jsonl               one JSON object per logged step (below)
      curriculum/routing.jsonl    one JSON object per step: what the loop curriculum routed where
      profile/*.parquet           pass-rate tables (one row per prompt and loop count)
      rollouts.jsonl              sample completions (prompt, completion, reward, k, env, policy version)
      tensorboard/                TensorBoard event files (same keys as metrics.jsonl)

metrics.jsonl: `{"step": int, "time": unix seconds, KEY: value, ...}` with flat
keys. A value is a number, `null` (a non-finite number), or a list of numbers
(raw samples, a histogram in TensorBoard). The same names go to TensorBoard and
W&B. Any other keys are kept and ignored by the dashboard.

The naming scheme follows verl's (`critic/score/mean`, `actor/pg_clipfrac`,
`response_length/clip_ratio`, `timing_s/gen`) and TRL's where verl has no name
(`frac_reward_zero_std`): a section prefix, then the quantity, then the slice
(`k{k}` a loop count, `env/{env}` an environment). Every duration is under
`timing_s/` (seconds); a share of something is a `_frac` or `_ratio` in [0, 1].

RL (`elr-rl rl`), one row per learner step:

    critic/score/{mean,k{k},env/{env}}           mean reward of the samples scored since the last row
    critic/pass_rate/{mean,k{k},env/{env}}       fraction of those samples answered correctly
    critic/pass_rate/env/{env}/k{k}              the same per (environment, loop count)
    response_length/{mean,k{k},env/{env}}        mean model tokens per sample
    response_length/clip_ratio                   fraction of samples cut at max_new_tokens
    actor/pg_loss, actor/pg_clipfrac, actor/entropy, actor/ppo_kl, actor/grad_norm, actor/lr
    actor/ratio_mean, actor/is_weight_mean (and /update0: the first update of the step)
    actor/loop_credit_loss                       algo.loop_credit's term (the shallower loops' readouts)
    batch/frac_reward_zero_std                   fraction of the step's groups with one reward for all samples
    batch/trained_samples, batch/uninformative_groups, batch/overlong_samples   counts of this step
    async/staleness_mean, async/staleness_max, async/policy_version
    async/dropped_stale_groups (cumulative), async/dropped_stale_frac (this step's share of the groups)
    async/queued_step                            1 when the step was submitted while the previous one ran
                                                 (async_.queued_steps)
    timing_s/step, timing_s/update_actor, timing_s/weight_sync, timing_s/weight_load, timing_s/elapsed
    timing_s/learner_compute                     the slowest rank's optimizer step, timed on the rank
                                                 (update_actor is the driver's view: queueing included)
    timing_s/learner_wait                        the ranks' idle time between their previous step and this one
    perf/learner_threads_busy                    that rank's CPU seconds per second of its step
    batch/groups_k{k}, batch/loop_tokens         the step's groups per loop count; its (prompt + response)
                                                 tokens x k, the learner's work
    perf/learner_loop_tokens_per_s               batch/loop_tokens / timing_s/learner_compute
    batch/learner_tokens, batch/learner_sublayer_tokens   tokens in the learner's rows (a shared prompt
                                                 once), and those x D_eff(k): the work at any depth mix
    perf/learner_sublayer_tokens_per_s           batch/learner_sublayer_tokens / timing_s/learner_compute
    perf/weight_sync_frac                        timing_s/weight_sync / timing_s/step
    perf/gen_tokens_per_s, perf/trained_tokens_per_s, perf/trained_tokens
    perf/rollout_idle_ratio, perf/learner_idle_ratio   (fractions of the time since the last row)
    perf/rollout_joined_frac                     share of the generate requests since the last row that joined
                                                 a batch their worker's engine was running (rollout.requests_per_worker)
    faults/restarted_workers, faults/requeued_prompts, sync/parity_max_abs_diff
    curriculum/prompts_k{k}                      prompts routed to loop count k since the last row
    curriculum/mean_q_k{k}                       mean pass-rate quantile q of those prompts
    val/pass_at_1/k{k}, val/pass_at_1/{env}/k{k}, val/response_length/k{k}
                                                 greedy pass@1 on the held-out set (every eval_interval steps)

Pretraining and SFT (`elr-rl train`): `loss/mean`, `loss/k{k}` (training loss
at loop count k), `eval/loss_k{k}` (held-out loss), `lr`, `grad_norm`,
`perf/tokens`, `perf/tokens_per_s`, `perf/step_time_s`.

Older RL runs used other names; `LEGACY_NAMES` maps them (old -> new) and
`canonical_key` applies it, so the dashboard reads both:

    reward/...            -> critic/score/...       pass_rate/...  -> critic/pass_rate/...
    loss/policy           -> actor/pg_loss          clip_frac      -> actor/pg_clipfrac
    entropy, kl           -> actor/entropy, actor/ppo_kl           grad_norm, lr -> actor/...
    perf/weight_sync_s    -> timing_s/weight_sync   perf/weight_load_s -> timing_s/weight_load
    perf/learner_step_s   -> timing_s/update_actor  perf/wall_s    -> timing_s/elapsed
    perf/tokens_per_s     -> perf/gen_tokens_per_s  (only in rows of old RL runs, which have loss/policy:
                                                     there it counted generated tokens)

rollouts.jsonl: one JSON object per logged sample: `step`, `time`, `env`,
`prompt_id`, `k`, `policy_version`, `reward`, `accuracy`, `finish_reason`,
`prompt`, `completion` (older runs: `text` for the completion).

A step may be logged again after a resume from a checkpoint; readers treat a
step that is not larger than the previous one as a rewind (later rows win).

curriculum/routing.jsonl, either raw values per loop count
    `{"step": s, "time": t, "k": {"4": {"q": [...], "score": [...], "pass_rate": [...]}, ...}}`
or pre-binned counts over [0, 1]
    `{"step": s, "time": t, "hist": {"edges": [0.0, ..., 1.0], "score": {"4": [counts]}, "q": {...}}}`.

profile/*.parquet columns: prompt_id (str), env (str), difficulty (int),
seed (int), k (int), samples (int), successes (int), pass_rate (float),
mean_response_tokens (float); extra columns are shown too. The most recently
written file is the current profile (write it under a temporary name and
rename it into place, so a reader never opens half a table).

Every line is written with a single `write` and flushed, so a reader sees
whole lines plus at most one partial trailing line, which it must skip
(`read_jsonl` does) and pick up on its next read.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
ROUTING_FILE = "curriculum/routing.jsonl"
PROFILE_DIR = "profile"
CONFIG_FILE = "config.yaml"
TENSORBOARD_DIR = "tensorboard"
SAMPLES_FILE = "rollouts.jsonl"
RESERVED_KEYS = ("step", "time")

LEGACY_NAMES = {
    "loss/policy": "actor/pg_loss", "clip_frac": "actor/pg_clipfrac", "entropy": "actor/entropy",
    "kl": "actor/ppo_kl", "grad_norm": "actor/grad_norm", "lr": "actor/lr",
    "is_weight_mean": "actor/is_weight_mean", "ratio_mean": "actor/ratio_mean",
    "is_weight_mean/update0": "actor/is_weight_mean/update0", "ratio_mean/update0": "actor/ratio_mean/update0",
    "ratio_max_dev/update0": "actor/ratio_max_dev/update0",
    "perf/weight_sync_s": "timing_s/weight_sync", "perf/weight_load_s": "timing_s/weight_load",
    "perf/learner_step_s": "timing_s/update_actor", "perf/wall_s": "timing_s/elapsed",
}
"""Old RL metric name -> the current one (exact names; prefixes in `LEGACY_PREFIXES`)."""
LEGACY_PREFIXES = {"reward/": "critic/score/", "pass_rate/": "critic/pass_rate/"}
"""Old RL metric prefix -> the current one (`reward/k4` -> `critic/score/k4`)."""


def canonical_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics row with old RL names replaced by the current scheme (rows of current runs are unchanged).

    Only rows of RL runs are renamed (the training stages keep `lr`, `grad_norm`,
    `perf/tokens_per_s`); an old RL row is recognised by its `loss/policy`.
    """
    if "loss/mean" in row or not any(k in row for k in ("loss/policy", "reward/mean", "perf/wall_s")):
        return dict(row)
    out: dict[str, Any] = {}
    for key, value in row.items():
        new = LEGACY_NAMES.get(key)
        if new is None:
            prefix = next((p for p in LEGACY_PREFIXES if key.startswith(p)), None)
            new = LEGACY_PREFIXES[prefix] + key[len(prefix):] if prefix else key
        if key == "perf/tokens_per_s":  # old RL rows counted generated tokens
            new = "perf/gen_tokens_per_s"
        out.setdefault(new, value)
    return out


@dataclass
class MetricsConfig:
    """Where a run's metrics go besides metrics.jsonl (which is always written)."""

    tensorboard: bool = True
    """Write TensorBoard event files under RUN_DIR/tensorboard."""
    wandb_project: str | None = None
    """Weights & Biases project; None (the default) means W&B is off."""
    wandb_entity: str | None = None
    """W&B entity (team or user); None uses the account default."""
    wandb_mode: str = "online"
    """W&B mode: "online", "offline" (sync later with `wandb sync`) or "disabled"."""
    wandb_init: dict[str, Any] = field(default_factory=dict)
    """Extra keyword arguments for `wandb.init` (name, tags, group, ...)."""

    def wandb_kwargs(self) -> dict[str, Any] | None:
        """The `wandb` argument for `MetricsWriter`: None when W&B is not configured."""
        if self.wandb_project is None:
            return None
        kwargs = {"project": self.wandb_project, "mode": self.wandb_mode, **self.wandb_init}
        if self.wandb_entity is not None:
            kwargs["entity"] = self.wandb_entity
        return kwargs


def to_json_value(value: Any) -> Any:
    """A JSON-safe copy of a metric value: numbers stay, NaN/inf become None, arrays become lists.

    Tensors and numpy values are converted through `.tolist()` (0-d gives a number).
    """
    if hasattr(value, "tolist") and not isinstance(value, (str, bytes)):
        value = value.tolist()
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, (int, float)):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): to_json_value(v) for k, v in value.items()}
    if isinstance(value, Sequence):
        return [to_json_value(v) for v in value]
    raise ValueError(f"metric value {value!r} of type {type(value).__name__} is not a number or a list of numbers")


def append_jsonl(path: str | Path, row: Mapping[str, Any]) -> None:
    """Append one JSON object as one line, in one write, and flush it to the OS."""
    line = json.dumps(to_json_value(row), allow_nan=False, separators=(",", ":")) + "\n"
    with open(path, "a", encoding="utf-8") as f:
        f.write(line)
        f.flush()


@dataclass
class JsonlChunk:
    """Complete lines read from a JSON-lines file, starting at a byte offset."""

    rows: list[dict[str, Any]]
    """Parsed objects, in file order."""
    next_offset: int
    """Byte offset just past the last complete line: pass it to the next read."""
    skipped: int = 0
    """Complete lines that were not JSON objects (corrupt); they are left out."""
    reset: bool = False
    """True when the file shrank below the offset (rewritten), so reading restarted at 0."""


def read_jsonl(path: str | Path, offset: int = 0) -> JsonlChunk:
    """Read the complete lines of `path` from byte `offset` on; a partial trailing line is left for later.

    A missing file reads as empty. If the file is now shorter than `offset`
    (rewritten by a new run), reading restarts at 0 and `reset` is True.
    """
    path = Path(path)
    if not path.is_file():
        return JsonlChunk([], 0, reset=offset > 0)
    reset = False
    with open(path, "rb") as f:
        size = f.seek(0, os.SEEK_END)
        if offset > size:
            offset, reset = 0, True
        f.seek(offset)
        data = f.read()
    end = data.rfind(b"\n") + 1  # 0 when no complete line yet
    rows, skipped = [], 0
    for raw in data[:end].splitlines():
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except ValueError:
            skipped += 1
            continue
        if isinstance(obj, dict):
            rows.append(obj)
        else:
            skipped += 1
    return JsonlChunk(rows, offset + end, skipped, reset)


def routing_from_assignments(assignments: Iterable[Any]) -> dict[int, dict[str, list[float]]]:
    """One batch's routed prompts grouped by loop count: `{k: {"q": [...], "score": [...]}}`.

    Takes the curriculum's `Assignment`s; the result is the argument of `log_routing`.
    """
    per_k: dict[int, dict[str, list[float]]] = {}
    for a in assignments:
        group = per_k.setdefault(a.k, {"q": [], "score": []})
        group["q"].append(a.q)
        group["score"].append(a.score)
    return dict(sorted(per_k.items()))


def curriculum_metrics(assignments: Iterable[Any]) -> dict[str, float]:
    """`curriculum/prompts_k{k}` (prompts routed to k) and `curriculum/mean_q_k{k}` (their mean q) of one batch."""
    out: dict[str, float] = {}
    for k, group in routing_from_assignments(assignments).items():
        out[f"curriculum/prompts_k{k}"] = len(group["q"])
        out[f"curriculum/mean_q_k{k}"] = sum(group["q"]) / len(group["q"])
    return out


def _now(wall_time: float | None) -> float:
    return time.time() if wall_time is None else float(wall_time)


SAMPLE_COLUMNS = ("env", "prompt_id", "k", "policy_version", "reward", "accuracy", "finish_reason",
                  "prompt", "completion")
"""Fields of one rollouts.jsonl record besides step and time (the W&B samples table's columns)."""
MAX_WANDB_SAMPLE_ROWS = 2000
"""Rows kept in the W&B samples table (the newest)."""


def wandb_init_kwargs(wandb: Mapping[str, Any], config: Any = None) -> dict[str, Any]:
    """`wandb.init` arguments: the configured ones plus the run's config as a plain dict (`config=`).

    `config` may be a dataclass (the typed run config), a mapping or None; an explicit
    `config` in the W&B settings wins.
    """
    kwargs = dict(wandb)
    if config is not None and "config" not in kwargs:
        if dataclasses.is_dataclass(config) and not isinstance(config, type):
            config = dataclasses.asdict(config)
        kwargs["config"] = to_json_value(dict(config))
    return kwargs


class MetricsWriter:
    """Writes a run's metrics to RUN_DIR/metrics.jsonl, TensorBoard and (when configured) W&B.

    `wandb` is None (off) or the keyword arguments of `wandb.init`; wandb is
    imported only then, so it is not a dependency of the project.
    """

    def __init__(self, run_dir: str | Path, tensorboard: bool = True, wandb: Mapping[str, Any] | None = None,
                 config: Any = None):
        self.run_dir = Path(run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_path = self.run_dir / METRICS_FILE
        self.routing_path = self.run_dir / ROUTING_FILE
        self.samples_path = self.run_dir / SAMPLES_FILE
        self._tb = None
        self._wandb_run = None
        self._wandb_module = None
        self._sample_rows: list[list[Any]] = []
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # torch is heavy: import only when asked

            self._tb = SummaryWriter(log_dir=str(self.run_dir / TENSORBOARD_DIR))
        if wandb is not None:
            try:
                import wandb as wandb_module
            except ImportError:
                raise ValueError(
                    "Weights & Biases logging is configured but `wandb` is not installed: "
                    "`pip install wandb`, or unset wandb_project"
                ) from None
            self._wandb_module = wandb_module
            self._wandb_run = wandb_module.init(dir=str(self.run_dir), **wandb_init_kwargs(wandb, config))

    @classmethod
    def from_config(cls, run_dir: str | Path, cfg: MetricsConfig, run_config: Any = None) -> MetricsWriter:
        """A writer as `cfg` says; `run_config` (the run's whole config) goes to W&B as the run's config."""
        return cls(run_dir, tensorboard=cfg.tensorboard, wandb=cfg.wandb_kwargs(), config=run_config)

    def log(self, step: int, metrics: Mapping[str, Any], wall_time: float | None = None) -> None:
        """Record one step's metrics: numbers become scalars, lists of numbers become histograms.

        `wall_time` (unix seconds) defaults to now; replays and the demo run pass their own.
        """
        bad = [k for k in metrics if k in RESERVED_KEYS]
        if bad:
            raise ValueError(f"metric names {bad} are reserved for the row itself: rename them")
        values = {str(k): to_json_value(v) for k, v in metrics.items()}
        append_jsonl(self.metrics_path, {"step": int(step), "time": _now(wall_time), **values})
        if self._tb is not None:
            for key, value in values.items():
                self._tb_add(key, value, step, wall_time)
        if self._wandb_run is not None:
            self._wandb_run.log({k: v for k, v in values.items() if v is not None}, step=int(step))

    def log_routing(
        self, step: int, per_k: Mapping[int, Mapping[str, Sequence[float]]], wall_time: float | None = None
    ) -> None:
        """Record what the curriculum routed to each loop count: `{k: {"q": [...], "score": [...]}}`."""
        self.routing_path.parent.mkdir(parents=True, exist_ok=True)
        record = {str(k): {name: to_json_value(v) for name, v in fields.items()} for k, fields in per_k.items()}
        append_jsonl(self.routing_path, {"step": int(step), "time": _now(wall_time), "k": record})
        if self._tb is not None:
            for k, fields in record.items():
                for name, values in fields.items():
                    self._tb_add(f"curriculum/{name}_k{k}", values, step, wall_time)

    def log_samples(self, step: int, samples: Sequence[Mapping[str, Any]], wall_time: float | None = None) -> None:
        """Append sample completions to rollouts.jsonl and, with W&B, log them as the `samples` table.

        Each sample is a mapping with the `SAMPLE_COLUMNS` (missing ones are null). W&B
        tables cannot grow in place, so the table logged holds every sample so far (the
        last `MAX_WANDB_SAMPLE_ROWS`), as verl does with its generation tables.
        """
        now = _now(wall_time)
        for sample in samples:
            append_jsonl(self.samples_path, {"step": int(step), "time": now,
                                             **{c: sample.get(c) for c in SAMPLE_COLUMNS}})
        if self._wandb_run is not None and samples:
            self._sample_rows += [[int(step)] + [to_json_value(s.get(c)) for c in SAMPLE_COLUMNS] for s in samples]
            self._sample_rows = self._sample_rows[-MAX_WANDB_SAMPLE_ROWS:]
            table = self._wandb_module.Table(columns=["step", *SAMPLE_COLUMNS], data=list(self._sample_rows))
            self._wandb_run.log({"samples": table}, step=int(step))

    def _tb_add(self, key: str, value: Any, step: int, wall_time: float | None) -> None:
        if isinstance(value, bool) or value is None or isinstance(value, str):
            return
        if isinstance(value, (int, float)):
            self._tb.add_scalar(key, value, step, walltime=wall_time)
        elif isinstance(value, list):
            finite = [v for v in value if isinstance(v, (int, float)) and not isinstance(v, bool)]
            if finite:
                import numpy as np

                self._tb.add_histogram(key, np.asarray(finite, dtype=np.float64), step, walltime=wall_time)

    def flush(self) -> None:
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        """Flush and close TensorBoard and W&B; metrics.jsonl is already on disk line by line."""
        if self._tb is not None:
            self._tb.close()
            self._tb = None
        if self._wandb_run is not None:
            self._wandb_run.finish()
            self._wandb_run = None

    def __enter__(self) -> MetricsWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
