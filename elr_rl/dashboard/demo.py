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

import json
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
                cols["prompt_id"].append(self.prompt_id(i))
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
        env_k: dict[tuple[str, int], list[float]] = {(e, k): [] for e in DEMO_ENVS for k in spec.loops}
        self.live = {}
        for k, (idx, q, score) in self.route(step).items():
            rates = self.pass_rate(step, k)[idx]
            passed = rng.binomial(8, rates) / 8.0
            lengths = self.base_tokens[idx] * (1 - 0.11 * (k - 1)) * (1 - 0.15 * step / (step + 60))
            lengths = lengths * rng.uniform(0.9, 1.1, size=len(idx))
            metrics[f"curriculum/prompts_k{k}"] = len(idx)
            metrics[f"curriculum/mean_q_k{k}"] = float(q.mean()) if len(idx) else None
            metrics[f"critic/pass_rate/k{k}"] = float(passed.mean())
            metrics[f"critic/score/k{k}"] = float(0.9 * passed.mean() + 0.05)
            metrics[f"response_length/k{k}"] = float(lengths.mean())
            routing[k] = {"q": q.round(4).tolist(), "pass_rate": rates1[idx].round(4).tolist(),
                          "score": score.round(4).tolist()}
            for i, p, t in zip(idx, passed, lengths):
                env_stats[DEMO_ENVS[self.env[i]]].append((p, t))
                env_k[(DEMO_ENVS[self.env[i]], k)].append(p)
                self.live[f"{self.prompt_id(i)}|{k}"] = [8, int(round(p * 8))]
        for env, stats in env_stats.items():
            if stats:
                p, t = np.array(stats).mean(axis=0)
                metrics[f"critic/pass_rate/env/{env}"] = float(p)
                metrics[f"critic/score/env/{env}"] = float(0.9 * p + 0.05)
                metrics[f"response_length/env/{env}"] = float(t)
        for (env, k), ps in env_k.items():
            if ps:
                metrics[f"critic/pass_rate/env/{env}/k{k}"] = float(np.mean(ps))
        ks = [f"k{k}" for k in spec.loops]
        metrics["critic/pass_rate/mean"] = float(np.mean([metrics[f"critic/pass_rate/{k}"] for k in ks]))
        metrics["critic/score/mean"] = float(np.mean([metrics[f"critic/score/{k}"] for k in ks]))
        metrics["response_length/mean"] = float(np.mean([metrics[f"response_length/{k}"] for k in ks]))
        metrics.update(self._health(step, rng))
        return metrics, routing

    def prompt_id(self, i: int) -> str:
        return f"{DEMO_ENVS[self.env[i]]}-{i:04d}"

    def _health(self, step: int, rng: np.random.Generator) -> dict[str, float]:
        restarted = sum(step >= s for s in RESTART_STEPS)
        dip = 0.55 if step in RESTART_STEPS else 1.0  # throughput drops while a worker restarts
        step_s = float(SECONDS_PER_STEP * rng.uniform(0.08, 0.12))
        sync_s = float(rng.gamma(9.0, 0.03))
        zero_std = float(np.clip(0.15 + 0.5 * step / (step + 80) + rng.normal(0, 0.03), 0, 1))
        return {
            "perf/gen_tokens_per_s": float(12_000 * dip * rng.uniform(0.92, 1.08)),
            "perf/trained_tokens_per_s": float(9_000 * dip * rng.uniform(0.92, 1.08)),
            "timing_s/step": step_s, "timing_s/weight_sync": sync_s, "perf/weight_sync_frac": sync_s / step_s,
            "timing_s/update_actor": float(step_s * rng.uniform(0.6, 0.8)),
            "perf/rollout_idle_ratio": float(np.clip(rng.normal(0.06, 0.02), 0, 1)),
            "perf/learner_idle_ratio": float(np.clip(rng.normal(0.22 if step < 5 else 0.12, 0.03), 0, 1)),
            "async/staleness_mean": float(np.clip(rng.normal(0.9, 0.15), 0, None)),
            "async/staleness_max": float(rng.integers(1, 3)),
            "async/dropped_stale_frac": float(np.clip(rng.normal(0.03, 0.02), 0, 1)),
            "batch/frac_reward_zero_std": zero_std,
            "batch/trained_samples": float(self.spec.batch_prompts * 8 * (1 - zero_std)),
            "response_length/clip_ratio": float(np.clip(rng.normal(0.04, 0.01), 0, 1)),
            "faults/restarted_workers": float(restarted),
            "actor/pg_loss": float(rng.normal(0.0, 0.02)),
            "actor/ppo_kl": float(0.002 * step ** 0.7 * rng.uniform(0.9, 1.1)),
            "actor/entropy": float(0.85 * np.exp(-step / 120) * rng.uniform(0.97, 1.03)),
            "actor/pg_clipfrac": float(np.clip(rng.normal(0.06, 0.01), 0, 1)),
            "actor/grad_norm": float(rng.gamma(4.0, 0.05)),
            "actor/lr": 1e-6 * min(1.0, (step + 1) / 10),
        }

    def validation(self, step: int) -> dict[str, float]:
        """Greedy pass@1 on a fixed held-out set (30 prompts per environment), per k and per environment."""
        rng = np.random.default_rng([self.spec.seed, step, 4])
        held_out = np.arange(0, len(self.env), max(1, len(self.env) // (30 * len(DEMO_ENVS))))
        out: dict[str, float] = {}
        for k in self.spec.loops:
            solved = rng.uniform(size=len(held_out)) < self.pass_rate(step, k)[held_out]
            out[f"val/pass_at_1/k{k}"] = float(solved.mean())
            for e, env in enumerate(DEMO_ENVS):
                mask = self.env[held_out] == e
                if mask.any():
                    out[f"val/pass_at_1/{env}/k{k}"] = float(solved[mask].mean())
        return out

    def samples(self, step: int) -> list[dict]:
        """Eight logged completions of the step: prompt, completion, reward, k, environment, policy version."""
        rng = np.random.default_rng([self.spec.seed, step, 5])
        out = []
        for k, (idx, _, _) in self.route(step).items():
            for i in idx[:2]:
                a, b = (int(x) for x in rng.integers(10, 99, size=2))
                ok = bool(rng.uniform() < self.pass_rate(step, k)[i])
                answer = a + b if ok else a + b + int(rng.integers(1, 9))
                out.append({"env": DEMO_ENVS[self.env[i]], "prompt_id": self.prompt_id(i), "k": int(k),
                            "policy_version": max(0, step - int(rng.integers(0, 2))), "reward": float(ok),
                            "accuracy": ok, "finish_reason": "stop",
                            "prompt": f"What is {a} + {b}? Put the final answer in \\boxed{{}}.",
                            "completion": f"{a} + {b} = {answer}, so the answer is \\boxed{{{answer}}}."})
        return out


VALIDATION_INTERVAL = 5
"""Steps between the demo's held-out validations."""


def write_steps(run_dir: str | Path, start: int, count: int, spec: DemoSpec | None = None,
                tensorboard: bool = False) -> None:
    """Append steps `start .. start+count-1` of the demo run: metrics (validation every
    VALIDATION_INTERVAL steps), routing, samples, and the curriculum's live pass-rate counts."""
    run = DemoRun(spec or DemoSpec())
    live = _read_live(run_dir)
    with MetricsWriter(run_dir, tensorboard=tensorboard) as writer:
        for step in range(start, start + count):
            metrics, routing = run.step_record(step)
            for key, (n, s) in run.live.items():
                old = live.setdefault(key, [0, 0])
                old[0], old[1] = old[0] + n, old[1] + s
            if step % VALIDATION_INTERVAL == 0:
                metrics.update(run.validation(step))
            wall = START_TIME + SECONDS_PER_STEP * step
            writer.log(step, metrics, wall_time=wall)
            writer.log_routing(step, routing, wall_time=wall)
            writer.log_samples(step, run.samples(step), wall_time=wall)
    state = Path(run_dir) / "curriculum" / "state.json"
    tmp = state.with_suffix(".tmp")
    tmp.write_text(json.dumps({"version": 1, "tracker": {"per_k": live}}))
    tmp.replace(state)  # atomic, as the curriculum service writes it


def _read_live(run_dir: str | Path) -> dict[str, list[int]]:
    path = Path(run_dir) / "curriculum" / "state.json"
    return json.loads(path.read_text())["tracker"]["per_k"] if path.is_file() else {}


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


def make_demo_train_run(run_dir: str | Path, steps: int = 60, loops: tuple[int, ...] = (1, 2, 3, 4),
                        seed: int = 0, eval_interval: int = 10) -> Path:
    """A recorded pretraining/SFT run: training loss per loop count (deeper k learns faster) and held-out loss."""
    run_dir = Path(run_dir)
    if (run_dir / "metrics.jsonl").exists():
        raise ValueError(f"{run_dir} already holds a run (metrics.jsonl): pick a new directory")
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / CONFIG_FILE).write_text(f"stage: sft\nmodel:\n  max_loops: {max(loops)}\nrun:\n  seed: {seed}\n")
    rng = np.random.default_rng([seed, 7])
    with MetricsWriter(run_dir, tensorboard=False) as writer:
        for step in range(steps):
            loss = {k: 3.2 * np.exp(-step / (25 + 4 * k)) + 1.1 - 0.08 * np.log(k) for k in loops}
            row = {f"loss/k{k}": float(v * rng.uniform(0.97, 1.03)) for k, v in loss.items()}
            row.update({"loss/mean": float(np.mean(list(row.values()))), "lr": 3e-3 * min(1.0, (step + 1) / 5),
                        "grad_norm": float(rng.gamma(4.0, 0.2)), "perf/tokens": 4096.0,
                        "perf/tokens_per_s": float(5200 * rng.uniform(0.9, 1.1)),
                        "perf/step_time_s": float(0.8 * rng.uniform(0.9, 1.1))})
            if step % eval_interval == 0 or step == steps - 1:
                row.update({f"eval/loss_k{k}": float(v + 0.05) for k, v in loss.items()})
            writer.log(step, row, wall_time=START_TIME + step)
    return run_dir


def make_demo_collection(root: str | Path, steps: int = 40) -> Path:
    """A folder of runs as the quickstart leaves it: `sft`, and two RL runs to overlay (`rl`: the loop
    curriculum; `rl_uniform`: routing without the pass-rate quantile, alpha = 0)."""
    root = Path(root)
    make_demo_train_run(root / "sft", steps=steps)
    make_demo_run(root / "rl", steps=steps)
    make_demo_run(root / "rl_uniform", steps=steps, spec=DemoSpec(alpha=0.0, seed=1))
    return root
