"""Benchmark: asynchronous against synchronous GRPO (and TRL's GRPOTrainer) on one config, in one run.

Prints a table and a final JSON line: samples/s of each mode (goal: async >= 1.6x sync),
weight-sync seconds over learner-step seconds (goal <= 5%), and the most that overlapping can
give on this config, (generate + learn + sync) / max(generate, learn), measured from the sync
run. Both runs use the same checkpoint, batch, group size and lengths, on a local Ray.

    python scripts/bench_rl.py [--steps 12] [--size toy|12m|50m] [--out runs/bench_rl]

--size toy (default) uses the format-trained 172k-parameter toy policy. 12m / 50m write a
RANDOMLY INITIALISED ELR checkpoint of about 12M / 47M parameters with `elr-rl model init`
(byte tokenizer, 1 input + 2 recurrent + 1 output blocks), in the dtype whose measured matrix
product is faster (bench_rollout.py's pick_dtype: fp32 on AVX2-only CPUs), and turn dynamic sampling
off: a random policy gets the same reward on most of a group, and those groups must still be
trained for the learner's share of a step to be measured. TRL (k = 1) gets a plain Llama of
the same k = 1 shape.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import shutil
import time
from pathlib import Path

# ELR model shapes of the random-init sizes (1 input + 2 recurrent + 1 output blocks, K = 4); TRL's
# plain Llama takes the same shape with 4 layers (one pass through each block: our k = 1).
SIZES = {
    "12m": {"hidden_size": 512, "intermediate_size": 1408, "num_attention_heads": 8, "num_key_value_heads": 2},
    "50m": {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4},
}
BLOCKS = {"n_input_layers": 1, "n_recurrent_layers": 2, "n_output_layers": 1}


def random_checkpoint(size: str, out: Path) -> Path:
    """A random-init ELR checkpoint of `size` written by `elr-rl model init` (reused when present)."""
    from elr_rl.model.cli import main as model_cli

    ckpt = out / f"random_{size}_ckpt"
    if not (ckpt / "config.json").is_file():
        overrides = [f"{k}={v}" for k, v in {**SIZES[size], **BLOCKS}.items()]
        if model_cli(["init", str(ckpt), *overrides]) != 0:
            raise SystemExit(f"elr-rl model init failed for --size {size}")
    return ckpt


def run_mode(name: str, ckpt: Path, out: Path, steps: int, workers: int, random_init: bool = False,
             dtype: str = "float32", share_prompts: bool = True, queued_steps: int = 1,
             borrow_idle_cores: bool = False, requests_per_worker: int = 2) -> dict:
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
    cfg.async_.queued_steps = queued_steps
    if name.endswith("_k1"):  # the plain-transformer depth, as TRL runs it
        cfg.curriculum.loop_counts = [1]
    if random_init:  # a random policy scores most groups flat: train them anyway (throughput, not learning)
        cfg.algo.dynamic_sampling = False
    cfg.rollout.dtype = dtype
    cfg.learner.engine.precision = "bf16" if dtype == "bfloat16" else "fp32"
    cfg.learner.share_prompts = share_prompts
    cfg.learner.borrow_idle_cores = borrow_idle_cores
    cfg.rollout.requests_per_worker = requests_per_worker
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
    # on the rank itself (excludes the driver's queueing), and how many threads it kept busy
    compute = [r["timing_s/learner_compute"] for r in rows[1:] if "timing_s/learner_compute" in r]
    busy = [r["perf/learner_threads_busy"] for r in rows[1:] if "perf/learner_threads_busy" in r]
    borrowed = [r.get("perf/learner_borrowed_cores", 0.0) for r in rows[1:]]
    wait = [r["timing_s/learner_wait"] for r in rows[1:] if r.get("timing_s/learner_wait") is not None]
    joined = [r["perf/rollout_joined_frac"] for r in rows[1:] if "perf/rollout_joined_frac" in r]
    loop_tokens = sum(r.get("batch/loop_tokens", 0) for r in rows[1:])
    sublayer_tokens = sum(r.get("batch/learner_sublayer_tokens", 0) for r in rows[1:])
    # tokens the learner computed (each group's prompt once with share_prompts) over the samples' own tokens
    computed = sum(r.get("batch/learner_tokens", 0) for r in rows[1:])
    own = computed + sum(r.get("batch/shared_prompt_tokens", 0) for r in rows[1:])
    return {"mode": name, "samples_per_s": samples / span if span else 0.0, "step_s": step_s, "learner_step_s": learn_s,
            "learner_compute_s": sum(compute) / len(compute) if compute else None,
            "learner_threads_busy": sum(busy) / len(busy) if busy else None,
            "learner_borrowed_cores": sum(borrowed) / len(borrowed) if borrowed else None,
            "learner_wait_s": sum(wait) / len(wait) if wait else None,  # the rank idle between steps
            # requests that joined a batch their worker's engine was running (rollout.requests_per_worker)
            "rollout_joined_frac": sum(joined) / len(joined) if joined else None,
            # the learner's speed on the work it got (steps at deeper k mixes carry more)
            "learner_loop_tokens_per_s": loop_tokens / sum(compute) if compute else None,
            # the same on the tokens it ran x D_eff(k): comparable between runs of different depth mixes
            "learner_sublayer_tokens_per_s": sublayer_tokens / sum(compute) if compute else None,
            "weight_sync_s": sum(sync) / len(sync), "sync_over_learner_step": (sum(sync) / len(sync)) / learn_s,
            "learner_tokens_over_sample_tokens": computed / own if own else None, "wall_s": wall}


def run_trl(steps: int, async_samples_per_s: float, size: str = "toy", dtype: str = "float32") -> dict:
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
           "--steps", str(steps), "--threads", str(os.cpu_count() or 1),  # all cores, as our run uses
           "--size", size, "--dtype", dtype]
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
    p.add_argument("--modes", default="sync,async,async_k1",
                   help="comma-separated runs (async_k1 is needed for the TRL comparison)")
    p.add_argument("--size", choices=["toy", *SIZES], default="toy",
                   help="toy: the trained 172k-parameter policy; 12m / 50m: a random-init fp32 checkpoint of that size")
    p.add_argument("--trl", action=argparse.BooleanOptionalAction, default=True,
                   help="also run TRL's GRPOTrainer on the same config (own venv: scripts/setup_bench_trl.sh)")
    p.add_argument("--share-prompts", action=argparse.BooleanOptionalAction, default=True,
                   help="learner.share_prompts: each group's prompt computed once in the learner (--no-share-prompts: "
                        "every sample carries its own copy, as before)")
    p.add_argument("--queued-steps", type=int, default=1,
                   help="async_.queued_steps: learner steps submitted behind the running one (0: none, as before)")
    p.add_argument("--requests-per-worker", type=int, default=2,
                   help="rollout.requests_per_worker: requests a worker holds at once, sharing its engine's batch "
                        "at one k (1: one at a time, as before)")
    p.add_argument("--borrow-idle-cores", action=argparse.BooleanOptionalAction, default=False,
                   help="learner.borrow_idle_cores: the learner also runs on the rollout worker's core while that "
                        "worker is idle (every mode)")
    args = p.parse_args()
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not {"sync", "async"} <= set(modes) or set(modes) - {"sync", "async", "async_k1"}:
        p.error(f"--modes {args.modes!r}: sync and async are required, async_k1 optional")
    if args.requests_per_worker < 1:
        p.error(f"--requests-per-worker {args.requests_per_worker}: use 1 or more")
    if args.trl and "async_k1" not in modes:
        p.error("--trl compares TRL with async_k1: add async_k1 to --modes or pass --no-trl")
    logging.basicConfig(level=logging.WARNING)
    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    import ray

    from elr_rl.rl.toy import format_sft_checkpoint

    out = Path(args.out)
    if args.size == "toy":
        ckpt = out / "toy_ckpt"
        if not (ckpt / "config.json").is_file():
            format_sft_checkpoint(ckpt)
    dtype = "float32"
    if args.size != "toy":
        from bench_rollout import pick_dtype  # scripts/ is on sys.path when this script runs

        ckpt = random_checkpoint(args.size, out)
        dtype, why = pick_dtype("auto")
        print(f"size {args.size}: random-init checkpoint {ckpt}\ndtype: {why}\nalgo.dynamic_sampling=false: the "
              "flat-reward groups of a random policy are trained too, so every step carries the full learner work")
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        res = {m: run_mode(m, ckpt, out, args.steps, args.workers, args.size != "toy", dtype, args.share_prompts,
                           args.queued_steps, args.borrow_idle_cores, args.requests_per_worker) for m in modes}
    finally:
        ray.shutdown()
    # TRL's model is a plain transformer of the k = 1 size: compare it with our run at k = 1
    trl = run_trl(args.steps, res["async_k1"]["samples_per_s"], args.size, dtype) if args.trl else {}
    # learn s: the driver's view of a learner step; rank s: timed on the rank; busy: its CPU s per s (1 thread: <= 1)
    # loop tok/s: the rank's (prompt + response) tokens x k per second, its speed on the work it was given
    # sub tok/s: the tokens the rank ran x D_eff(k) per second (a speed that does not move with the k mix)
    # computed: the tokens the learner ran over the samples' own (prompt + response) tokens
    # wait s: the rank idle between the end of one step and the start of the next
    # borrow: the rollout cores the rank ran on besides its own, mean over the step (--borrow-idle-cores)
    # joined: the share of generate requests that joined their worker's running batch
    print(f"learner.share_prompts={args.share_prompts} async_.queued_steps={args.queued_steps} "
          f"learner.borrow_idle_cores={args.borrow_idle_cores} rollout.requests_per_worker={args.requests_per_worker}")
    print(f"{'mode':>8} {'samples/s':>10} {'step s':>8} {'learn s':>8} {'rank s':>8} {'wait s':>7} {'busy':>6} "
          f"{'loop tok/s':>10} {'sub tok/s':>9} {'sync s':>8} {'sync/learn':>10} {'computed':>9} {'borrow':>6} {'joined':>6}")
    nan = float("nan")
    for r in res.values():
        rank_s, busy = r["learner_compute_s"] or nan, r["learner_threads_busy"] or nan
        wait = r["learner_wait_s"] if r["learner_wait_s"] is not None else nan
        print(f"{r['mode']:>8} {r['samples_per_s']:>10.2f} {r['step_s']:>8.2f} {r['learner_step_s']:>8.2f} "
              f"{rank_s:>8.2f} {wait:>7.2f} {busy:>6.2f} {r['learner_loop_tokens_per_s'] or nan:>10.0f} "
              f"{r['learner_sublayer_tokens_per_s'] or nan:>9.0f} "
              f"{r['weight_sync_s']:>8.3f} {r['sync_over_learner_step']:>10.1%} "
              f"{r['learner_tokens_over_sample_tokens'] or nan:>9.1%} {r['learner_borrowed_cores'] or 0.0:>6.2f} "
              f"{r['rollout_joined_frac'] if r['rollout_joined_frac'] is not None else nan:>6.2f}")
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
          f" -> overlap bound for async/sync {bound:.2f}x (from the sync run's times: an async learner that runs"
          f" faster than the sync one can pass it); measured {ratio:.2f}x")
    print(json.dumps({"async_over_sync_samples_per_s": round(ratio, 3), "async_over_sync_bound": round(bound, 3),
                      "weight_sync_over_learner_step": round(res["async"]["sync_over_learner_step"], 4),
                      **{f"{m}_{k}": None if v is None else round(v, 4) for m, r in res.items() for k, v in r.items()
                         if k != "mode"},
                      **{k: trl.get(k) for k in ("trl_samples_per_s", "async_over_trl_samples_per_s", "trl_version")}}))


if __name__ == "__main__":
    main()
