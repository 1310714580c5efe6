"""A synthetic, deterministic recorded run directory, for the dashboard's tests and demos.

It imitates an asynchronous GRPO run with the loop curriculum: a pool of
prompts over several environments with a latent difficulty, pass rates that
rise with training and with the loop count, routing by the design's rule
(score `s = alpha*q + (1-alpha)*u`, lowest scores fill the deepest slots),
response lengths that fall as k grows, and system-health figures with two
worker restarts. Nothing depends on the clock: the same
seed gives the same files.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from curriculum.routing import midpoint_quantiles, routing_scores
from elr_rl.metrics import CONFIG_FILE, PROFILE_DIR, MetricsWriter

DEMO_ENVS = ("arith_multidigit", "expr_eval", "code_output_prediction", "graph_algorithms",
             "logic_deduction", "automata_simulation")
START_TIME = 1_780_000_000.0
"""Fixed wall time of step 0 (unix seconds), so the files do not depend on when they were made."""
SECONDS_PER_STEP = 30.0
RESTART_STEPS = (23, 41)
"""Steps at which a rollout worker 'crashes' and is restarted."""


@dataclass
class DemoSpec:
    """Shape of the synthetic run."""

    loops: tuple[int, ...] = (1, 2, 3, 4)
    """Loop counts the curriculum routes to."""
    prompts_per_env: int = 40
    """Prompts in the pool per environment."""
    batch_prompts: int = 64
    """Prompts per step's batch, split into per-k slots."""
    alpha: float = 0.3
    """Routing-score weight on the quantile q (the rest is uniform noise)."""
    samples: int = 8
    """Completions per prompt when profiling."""
    seed: int = 0
    """Seed of every random draw."""


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x))


class DemoRun:
    """The synthetic run's state; every method is a pure function of (spec, step)."""

    def __init__(self, spec: DemoSpec):
        self.spec = spec
        rng = np.random.default_rng(spec.seed)
        n = spec.prompts_per_env * len(DEMO_ENVS)
        self.env = np.repeat(np.arange(len(DEMO_ENVS)), spec.prompts_per_env)
        self.difficulty = rng.integers(1, 6, size=n)
        env_bias = rng.normal(0.0, 0.8, size=len(DEMO_ENVS))
        # Latent logit of success at k=1 before training; harder prompts start lower.
        self.logit = env_bias[self.env] + 1.6 - 0.75 * self.difficulty + rng.normal(0, 0.6, size=n)
        self.base_tokens = rng.uniform(120, 420, size=len(DEMO_ENVS))[self.env] * (1 + 0.15 * self.difficulty)

    def pass_rate(self, step: int, k: int) -> np.ndarray:
        """True pass rate of every prompt at loop count k: sigmoid(logit + 0.45 log k + 1.2 * progress)."""
        progress = 1.0 - np.exp(-step / 40.0)
        return _sigmoid(self.logit + 0.45 * np.log(k) + 1.2 * progress)

    def profile_table(self, step: int) -> dict[str, list]:
        """One row per (prompt, k): measured pass rate over `samples` completions."""
        rng = np.random.default_rng([self.spec.seed, step, 1])
        cols: dict[str, list] = {c: [] for c in ("prompt_id", "env", "difficulty", "seed", "k", "samples",
                                                  "successes", "pass_rate", "mean_response_tokens")}
        for k in self.spec.loops:
            successes = rng.binomial(self.spec.samples, self.pass_rate(step, k))
            tokens = self.base_tokens * (1 - 0.11 * (k - 1)) * rng.uniform(0.85, 1.15, size=len(successes))
            for i, (s, t) in enumerate(zip(successes, tokens)):
                cols["prompt_id"].append(f"{DEMO_ENVS[self.env[i]]}-{i:04d}")
                cols["env"].append(DEMO_ENVS[self.env[i]])
                cols["difficulty"].append(int(self.difficulty[i]))
                cols["seed"].append(1000 + i)
                cols["k"].append(int(k))
                cols["samples"].append(self.spec.samples)
                cols["successes"].append(int(s))
                cols["pass_rate"].append(float(s) / self.spec.samples)
                cols["mean_response_tokens"].append(round(float(t), 1))
        return cols

    def slots(self, step: int) -> dict[int, int]:
        """Prompts per loop count: the deepest share grows from 10% to 35% of the batch over training."""
        ks = self.spec.loops
        deep = 0.10 + 0.25 * (1 - np.exp(-step / 30.0))
        weights = np.array([(1 - deep) / (len(ks) - 1)] * (len(ks) - 1) + [deep])
        counts = np.floor(weights * self.spec.batch_prompts).astype(int)
        counts[0] += self.spec.batch_prompts - counts.sum()
        return {k: int(c) for k, c in zip(ks, counts)}

    def route(self, step: int) -> dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per k: (prompt indices, their q, their routing score); lowest scores fill the deepest slots first."""
        rng = np.random.default_rng([self.spec.seed, step, 2])
        batch = rng.choice(len(self.env), size=self.spec.batch_prompts, replace=False)
        q = midpoint_quantiles(self.pass_rate(step, self.spec.loops[0]))[batch]
        score = routing_scores(q, rng.uniform(size=len(batch)), self.spec.alpha)
        order = np.argsort(score)
        routed, start = {}, 0
        for k, n in sorted(self.slots(step).items(), reverse=True):
            take = order[start:start + n]
            routed[k] = (batch[take], q[take], score[take])
            start += n
        return routed

    def step_record(self, step: int) -> tuple[dict[str, float], dict[int, dict[str, list[float]]]]:
        """(metrics row, routing record) of one step."""
        rng = np.random.default_rng([self.spec.seed, step, 3])
        spec = self.spec
        rates1 = self.pass_rate(step, spec.loops[0])
        metrics: dict[str, float] = {}
        routing: dict[int, dict[str, list[float]]] = {}
        env_stats: dict[str, list[tuple[float, float]]] = {e: [] for e in DEMO_ENVS}
        for k, (idx, q, score) in self.route(step).items():
            rates = self.pass_rate(step, k)[idx]
            passed = rng.binomial(8, rates) / 8.0
            lengths = self.base_tokens[idx] * (1 - 0.11 * (k - 1)) * (1 - 0.15 * step / (step + 60))
            lengths = lengths * rng.uniform(0.9, 1.1, size=len(idx))
            metrics[f"curriculum/prompts_k{k}"] = len(idx)
            metrics[f"curriculum/mean_q_k{k}"] = float(q.mean()) if len(idx) else None
            metrics[f"pass_rate/k{k}"] = float(passed.mean())
            metrics[f"reward/k{k}"] = float(0.9 * passed.mean() + 0.05)
            metrics[f"response_length/k{k}"] = float(lengths.mean())
            routing[k] = {"q": q.round(4).tolist(), "pass_rate": rates1[idx].round(4).tolist(),
                          "score": score.round(4).tolist()}
            for i, p, t in zip(idx, passed, lengths):
                env_stats[DEMO_ENVS[self.env[i]]].append((p, t))
        for env, stats in env_stats.items():
            if stats:
                p, t = np.array(stats).mean(axis=0)
                metrics[f"pass_rate/env/{env}"] = float(p)
                metrics[f"reward/env/{env}"] = float(0.9 * p + 0.05)
                metrics[f"response_length/env/{env}"] = float(t)
        ks = [f"k{k}" for k in spec.loops]
        metrics["pass_rate/mean"] = float(np.mean([metrics[f"pass_rate/{k}"] for k in ks]))
        metrics["reward/mean"] = float(np.mean([metrics[f"reward/{k}"] for k in ks]))
        metrics["response_length/mean"] = float(np.mean([metrics[f"response_length/{k}"] for k in ks]))
        metrics.update(self._health(step, rng))
        return metrics, routing

    def _health(self, step: int, rng: np.random.Generator) -> dict[str, float]:
        restarted = sum(step >= s for s in RESTART_STEPS)
        dip = 0.55 if step in RESTART_STEPS else 1.0  # throughput drops while a worker restarts
        return {
            "perf/tokens_per_s": float(12_000 * dip * rng.uniform(0.92, 1.08)),
            "perf/weight_sync_s": float(rng.gamma(9.0, 0.13)),
            "perf/rollout_idle_ratio": float(np.clip(rng.normal(0.06, 0.02), 0, 1)),
            "perf/learner_idle_ratio": float(np.clip(rng.normal(0.22 if step < 5 else 0.12, 0.03), 0, 1)),
            "async/staleness_mean": float(np.clip(rng.normal(0.9, 0.15), 0, None)),
            "async/staleness_max": float(rng.integers(1, 3)),
            "faults/restarted_workers": float(restarted),
            "loss/policy": float(rng.normal(0.0, 0.02)),
            "kl": float(0.002 * step ** 0.7 * rng.uniform(0.9, 1.1)),
            "entropy": float(0.85 * np.exp(-step / 120) * rng.uniform(0.97, 1.03)),
            "clip_frac": float(np.clip(rng.normal(0.06, 0.01), 0, 1)),
            "lr": 1e-6,
        }


def write_steps(run_dir: str | Path, start: int, count: int, spec: DemoSpec | None = None,
                tensorboard: bool = False) -> None:
    """Append steps `start .. start+count-1` of the demo run to metrics.jsonl and routing.jsonl."""
    run = DemoRun(spec or DemoSpec())
    with MetricsWriter(run_dir, tensorboard=tensorboard) as writer:
        for step in range(start, start + count):
            metrics, routing = run.step_record(step)
            wall = START_TIME + SECONDS_PER_STEP * step
            writer.log(step, metrics, wall_time=wall)
            writer.log_routing(step, routing, wall_time=wall)


def write_profile(run_dir: str | Path, step: int, spec: DemoSpec | None = None) -> Path:
    """Write the demo's profile table at `step` to RUN_DIR/profile/step_{step:06d}.parquet."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table(DemoRun(spec or DemoSpec()).profile_table(step))
    path = Path(run_dir) / PROFILE_DIR / f"step_{step:06d}.parquet"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".parquet.tmp")  # rename into place: readers never see half a table
    pq.write_table(table, tmp)
    tmp.replace(path)
    return path


def make_demo_run(run_dir: str | Path, steps: int = 60, spec: DemoSpec | None = None,
                  tensorboard: bool = False) -> Path:
    """Write a complete recorded run: config, `steps` steps of metrics and routing, two profile tables."""
    if steps < 1:
        raise ValueError(f"steps must be >= 1, got {steps}")
    spec = spec or DemoSpec()
    run_dir = Path(run_dir)
    if (run_dir / "metrics.jsonl").exists():
        raise ValueError(f"{run_dir} already holds a run (metrics.jsonl): pick a new directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    from omegaconf import OmegaConf

    config = {"run": {"name": run_dir.name, "seed": spec.seed, "demo": True},
              "curriculum": {"alpha": spec.alpha, "loops": list(spec.loops), "batch_prompts": spec.batch_prompts},
              "environments": list(DEMO_ENVS), "rl": {"group_size": spec.samples, "max_staleness": 2}}
    (run_dir / CONFIG_FILE).write_text(OmegaConf.to_yaml(OmegaConf.create(config)))
    write_profile(run_dir, 0, spec)
    write_steps(run_dir, 0, steps, spec, tensorboard=tensorboard)
    write_profile(run_dir, steps - 1, spec)
    return run_dir
