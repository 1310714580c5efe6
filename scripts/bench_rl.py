"""Benchmark: asynchronous against synchronous GRPO on the same tiny config, in one run.

Prints a table and a final JSON line: samples/s of each mode (goal: async >= 1.6x sync),
weight-sync seconds over learner-step seconds (goal <= 5%). Both runs use the same toy
checkpoint, batch, group size and lengths, on a local Ray.

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


def run_mode(mode: str, ckpt: Path, out: Path, steps: int) -> dict:
    from elr_rl.rl.config import RLConfig
    from elr_rl.rl.driver import Driver

    cfg = RLConfig(model_path=str(ckpt))
    cfg.run.output_dir = str(out / mode)
    cfg.run.total_steps = steps
    cfg.run.save_interval = 10**6
    cfg.run.progress = False
    cfg.envs.names = ["even_odd"]
    cfg.rollout.group_size = 8
    cfg.rollout.max_new_tokens = 24
    cfg.rollout.max_model_len = 128
    cfg.learner.engine.accelerator = "cpu"
    cfg.learner.optim.lr = 5e-4
    cfg.algo.groups_per_step = 8
    cfg.async_.mode = mode
    cfg.async_.max_staleness = 1
    cfg.validate()
    shutil.rmtree(out / mode, ignore_errors=True)
    t0 = time.perf_counter()
    Driver(cfg).run()
    wall = time.perf_counter() - t0
    rows = [json.loads(line) for line in open(out / mode / "metrics.jsonl")]
    # steady state: from the first step's end to the last step's end (excludes engine start-up)
    span = rows[-1]["perf/wall_s"] - rows[0]["perf/wall_s"]
    samples = sum(r["batch/trained_samples"] + 8 * r["batch/uninformative_groups"] for r in rows[1:])
    sync = [r["perf/weight_sync_s"] for r in rows]
    step_s = span / max(1, len(rows) - 1)
    return {"mode": mode, "samples_per_s": samples / span if span else 0.0, "step_s": step_s,
            "weight_sync_s": sum(sync) / len(sync), "sync_over_step": (sum(sync) / len(sync)) / step_s,
            "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--out", default="runs/bench_rl")
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
        res = {m: run_mode(m, ckpt, out, args.steps) for m in ("sync", "async")}
    finally:
        ray.shutdown()
    print(f"{'mode':>6} {'samples/s':>10} {'step s':>8} {'sync s':>8} {'sync/step':>10}")
    for r in res.values():
        print(f"{r['mode']:>6} {r['samples_per_s']:>10.2f} {r['step_s']:>8.2f} {r['weight_sync_s']:>8.3f} "
              f"{r['sync_over_step']:>10.1%}")
    ratio = res["async"]["samples_per_s"] / max(res["sync"]["samples_per_s"], 1e-9)
    print(json.dumps({"async_over_sync_samples_per_s": round(ratio, 3),
                      "weight_sync_over_learner_step": round(res["async"]["sync_over_step"], 4),
                      **{f"{m}_{k}": round(v, 4) for m, r in res.items() for k, v in r.items() if k != "mode"}}))


if __name__ == "__main__":
    main()
