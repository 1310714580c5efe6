"""Benchmark: asynchronous against synchronous GRPO on the same tiny config, in one run.

Prints a table and a final JSON line: samples/s of each mode (goal: async >= 1.6x sync),
weight-sync seconds over learner-step seconds (goal <= 5%), and the most that overlapping can
give on this config, (generate + learn + sync) / max(generate, learn), measured from the sync
run. Both runs use the same toy checkpoint, batch, group size and lengths, on a local Ray.

    python scripts/bench_rl.py [--steps 12] [--out runs/bench_rl]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from pathlib import Path


def run_mode(name: str, ckpt: Path, out: Path, steps: int, workers: int) -> dict:
    """One RL run: `sync`, `async` (loop counts 1-4 from the curriculum) or `async_k1` (k = 1 only)."""
    from elr_rl.rl.config import RLConfig
    from elr_rl.rl.driver import Driver

    cfg = RLConfig(model_path=str(ckpt))
    mode = name.split("_")[0]
    cfg.run.output_dir = str(out / name)
    cfg.run.total_steps = steps
    cfg.run.save_interval = 10**6
    cfg.run.progress = False
    cfg.envs.names = ["even_odd"]
    cfg.rollout.group_size = 8
    cfg.rollout.num_workers = workers
    cfg.rollout.prompts_per_request = 8  # one batched generate per step and loop count
    cfg.rollout.max_new_tokens = 24
    cfg.rollout.max_model_len = 128
    cfg.learner.engine.accelerator = "cpu"
    cfg.learner.optim.lr = 5e-4
    cfg.algo.groups_per_step = 8
    cfg.async_.mode = mode
    cfg.async_.max_staleness = 1
    if name.endswith("_k1"):  # the plain-transformer depth, as TRL runs it
        cfg.curriculum.loop_counts = [1]
    cfg.validate()
    shutil.rmtree(out / name, ignore_errors=True)
    t0 = time.perf_counter()
    Driver(cfg).run()
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in open(out / name / "metrics.jsonl")]
    # steady state: from the first step's end to the last step's end (excludes engine start-up)
    span = rows[-1]["timing_s/elapsed"] - rows[0]["timing_s/elapsed"]
    samples = sum(r["batch/trained_samples"] + 8 * r["batch/uninformative_groups"] for r in rows[1:])
    sync = [r["timing_s/weight_sync"] for r in rows]
    step_s = span / max(1, len(rows) - 1)
    learn_s = sum(r["timing_s/update_actor"] for r in rows[1:]) / max(1, len(rows) - 1)
    return {"mode": name, "samples_per_s": samples / span if span else 0.0, "step_s": step_s, "learner_step_s": learn_s,
            "weight_sync_s": sum(sync) / len(sync), "sync_over_learner_step": (sum(sync) / len(sync)) / learn_s,
            "wall_s": wall}


def run_trl(steps: int, async_samples_per_s: float) -> dict:
    """TRL's GRPOTrainer on the same config, in its own venv (scripts/setup_bench_trl.sh, scripts/bench_trl.py).

    Returns the TRL keys of the final JSON; they stay None when the setup or the run fails.
    """
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    res = {"trl_samples_per_s": None, "async_over_trl_samples_per_s": None, "trl_version": None,
           "trl_step_s": None, "trl_completion_tokens_mean": None}
    try:
        subprocess.run(["bash", str(root / "scripts" / "setup_bench_trl.sh")], cwd=root, check=True, timeout=3600)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"trl: setup failed ({e}); TRL keys left null (rerun scripts/setup_bench_trl.sh to see why)")
        return res
    cmd = [str(root / ".venv-bench-trl" / "bin" / "python"), str(root / "scripts" / "bench_trl.py"),
           "--steps", str(steps), "--threads", str(os.cpu_count() or 1)]  # all cores, as our run uses
    try:
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, timeout=3600)
    except (OSError, subprocess.SubprocessError) as e:
        print(f"trl: benchmark failed to run ({e}); TRL keys left null")
        return res
    found = None
    for line in reversed(proc.stdout.splitlines()):
        try:
            found = json.loads(line)
        except ValueError:
            continue
        if isinstance(found, dict) and "trl_samples_per_s" in found:
            break
        found = None
    if proc.returncode != 0 or found is None:
        print(f"trl: benchmark failed (exit {proc.returncode}); TRL keys left null. Last output:\n"
              + (proc.stdout + proc.stderr)[-2000:], file=sys.stderr)
        return res
    for k in ("trl_samples_per_s", "trl_version", "trl_step_s", "trl_completion_tokens_mean"):
        res[k] = found.get(k)
    if res["trl_samples_per_s"]:
        res["async_over_trl_samples_per_s"] = round(async_samples_per_s / res["trl_samples_per_s"], 3)
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", default="runs/bench_rl")
    p.add_argument("--workers", type=int, default=1, help="rollout workers in both modes")
    p.add_argument("--trl", action=argparse.BooleanOptionalAction, default=True,
                   help="also run TRL's GRPOTrainer on the same config (own venv: scripts/setup_bench_trl.sh)")
    args = p.parse_args()
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from elr_rl.rl.toy import format_sft_checkpoint

    out = Path(args.out)
    ckpt = out / "toy_ckpt"
    if not (ckpt / "config.json").is_file():
        format_sft_checkpoint(ckpt)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        res = {m: run_mode(m, ckpt, out, args.steps, args.workers) for m in ("sync", "async", "async_k1")}
    finally:
        ray.shutdown()
    # TRL's model is a plain transformer of the k = 1 size: compare it with our run at k = 1
    trl = run_trl(args.steps, res["async_k1"]["samples_per_s"]) if args.trl else {}
    print(f"{'mode':>8} {'samples/s':>10} {'step s':>8} {'learn s':>8} {'sync s':>8} {'sync/learn':>10}")
    for r in res.values():
        print(f"{r['mode']:>8} {r['samples_per_s']:>10.2f} {r['step_s']:>8.2f} {r['learner_step_s']:>8.2f} "
              f"{r['weight_sync_s']:>8.3f} {r['sync_over_learner_step']:>10.1%}")
    if trl.get("trl_samples_per_s"):
        print(f"{'trl':>8} {trl['trl_samples_per_s']:>10.2f} {trl['trl_step_s']:>8.2f} {'-':>8} {'-':>8} {'-':>10}")
        print(f"trl: GRPOTrainer {trl['trl_version']}, random-init Llama of the k = 1 size, completion tokens mean "
              f"{trl['trl_completion_tokens_mean']}; async_k1/trl {trl['async_over_trl_samples_per_s']:.2f}x (goal >= 3x)")
    ratio = res["async"]["samples_per_s"] / max(res["sync"]["samples_per_s"], 1e-9)
    # In sync mode a step is generate + learn + sync; overlapping them can at best hide the shorter part.
    sr = res["sync"]
    generate_s = max(1e-9, sr["step_s"] - sr["learner_step_s"] - sr["weight_sync_s"])
    bound = sr["step_s"] / max(generate_s, sr["learner_step_s"])
    print(f"sync step: generate {generate_s:.2f} s + learn {sr['learner_step_s']:.2f} s + sync {sr['weight_sync_s']:.3f} s"
          f" -> overlap bound for async/sync {bound:.2f}x; measured {ratio:.2f}x")
    print(json.dumps({"async_over_sync_samples_per_s": round(ratio, 3), "async_over_sync_bound": round(bound, 3),
                      "weight_sync_over_learner_step": round(res["async"]["sync_over_learner_step"], 4),
                      **{f"{m}_{k}": round(v, 4) for m, r in res.items() for k, v in r.items() if k != "mode"},
                      **{k: trl.get(k) for k in ("trl_samples_per_s", "async_over_trl_samples_per_s", "trl_version")}}))


if __name__ == "__main__":
    main()
