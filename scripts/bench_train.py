"""Benchmark tiny pretraining: tokens/s at k = 1 vs mixed depth, and model FLOP utilisation (MFU).

    .venv/bin/python scripts/bench_train.py [--steps 30] [--size tiny|small|d512|d1024] [--threads 2]
        [--precisions fp32,bf16] [--micro-batch N] [--optim default|loop|foreach|fused]

For each precision (fp32, bf16) it trains the same model twice on one rank:
at a fixed k = 1, and under mixed depth (k ~ U{1..K}, f forced to k = 1), the
two runs stepping in turn so that both see the same load on a shared machine.
Mixed depth costs D_eff(k_bar) / D_eff(1) times the compute of k = 1, so the
expected throughput ratio is the inverse of that compute ratio.

MFU = achieved model FLOP/s / ceiling, with the training FLOPs per token counted
the PaLM way: 6 * (matmul parameters, the recurrent ones once per loop) +
12 * (attention sublayer executions) * heads * head_dim * seq_len, against the
ceiling of a 2048^2 matrix product timed in this run with the same threads and
dtype (machines differ: one had AVX-512/AMX with bf16 ~5x fp32, another AVX2 only
with bf16 far slower than fp32, so no constant serves).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SIZES = {
    "tiny": {},  # ElrConfig.tiny(): d = 64
    "small": {"hidden_size": 256, "intermediate_size": 704, "num_attention_heads": 4, "num_key_value_heads": 2},
    # bench_rl.py's 12m / 50m shapes (1 input + 2 recurrent + 1 output blocks)
    "d512": {"hidden_size": 512, "intermediate_size": 1408, "num_attention_heads": 8, "num_key_value_heads": 2,
             "n_recurrent_layers": 2},
    "d1024": {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4,
              "n_recurrent_layers": 2},
}
# torch AdamW's implementation: "default" is what the config asks (optim.fused, on by default); "loop" is
# torch's per-tensor loop (what DeepSpeed builds on a CPU without optim.fused)
OPTIMS = {"default": {}, "loop": {"foreach": False, "fused": None}, "foreach": {"foreach": True, "fused": None},
          "fused": {"foreach": None, "fused": True}}


def train_flops_per_token(model, k: float, seq_len: int) -> float:
    """6 * N_matmul(k) + 12 * n_attn(k) * H * hd * T (forward + backward, per token)."""
    spec = model.spec
    n_in, n_rec = spec.n_in, spec.n_rec
    matmul, attn = 0.0, 0.0
    for name, p in model.named_parameters():
        if p.dim() != 2 or "embeddings" in name or ".loop_cond." in name:
            continue  # embedding lookups and the per-loop conditioning MLP cost no per-token matmuls
        mult = 1.0
        if name.startswith("backbone.layers."):
            i = int(name.split(".")[2])
            mult = k if n_in <= i < n_in + n_rec else 1.0
        elif name.startswith("backbone.update."):
            mult = k  # the update rule's gate runs once per loop
        matmul += mult * p.numel()
    for i in range(spec.num_sublayers):
        if spec.is_attention(i):
            attn += k if n_in <= i < n_in + n_rec else 1.0
    return 6.0 * matmul + 12.0 * attn * spec.num_heads * spec.head_dim * seq_len


def matmul_gflops(dtype_name: str, n: int = 2048, reps: int = 5) -> float:
    """The matrix-product rate right now, with this process's threads and this dtype."""
    import time

    import torch

    dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b  # warm-up
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return 2 * n**3 / best / 1e9


def make_trainer(overrides: list[str], steps: int, out: str, optim: str = "default"):
    from elr_rl.config import load_config
    from elr_rl.train.config import TrainConfig
    from elr_rl.train.trainer import Trainer

    cfg = load_config(TrainConfig, ROOT / "configs" / "pretrain_tiny.yaml", [
        f"run.total_steps={steps}", "run.eval_interval=0", "run.eval_batches=1", "run.progress=false",
        "run.resume=false", "metrics.tensorboard=false", f"run.output_dir={out}", *overrides,
    ])
    trainer = Trainer(cfg, 0, 1)  # the process group stays up for the next run (closed in main)
    for group in trainer.engine.optimizer.param_groups:  # read by AdamW at every step; state is made at the first
        group.update(OPTIMS[optim])
    return trainer


def run_interleaved(trainers: list, steps: int) -> list[dict]:
    """Step the trainers in turn (A, B, A, B, ...) so that all see the same machine load."""
    skip = max(2, steps // 5)  # first steps pay one-off costs (allocations, lazy init)
    times: list[list[float]] = [[] for _ in trainers]
    ks: list[list[int]] = [[] for _ in trainers]
    tokens = [0] * len(trainers)
    for step in range(steps):
        for i, tr in enumerate(trainers):
            row = tr.train_one_step(step)
            tokens[i] = row["perf/tokens"]
            if step >= skip:
                times[i].append(row["perf/step_time_s"])
                ks[i] += row["loops/ks"]
    out = []
    for i, tr in enumerate(trainers):
        k_mean = statistics.fmean(ks[i])
        model = tr.engine.model
        out.append({"tokens_per_s": tokens[i] / statistics.median(times[i]), "k_mean": k_mean,
                    "flops_per_token": train_flops_per_token(model, k_mean, tr.cfg.data.seq_len),
                    "d_eff": model.config.effective_depth, "K": tr.K})
    return out


@contextlib.contextmanager
def _process_group():
    """One process group for all runs: DeepSpeed caches its groups, so it is torn down only once."""
    try:
        yield
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--size", choices=sorted(SIZES), default="tiny")
    ap.add_argument("--threads", type=int, default=1,
                    help="torch threads (1 by default: on a shared 2-core machine 2 threads oversubscribe)")
    ap.add_argument("--f", type=float, default=0.25, help="fraction of ranks forced to k = 1")
    ap.add_argument("--precisions", default="fp32,bf16", help="comma-separated: fp32, bf16")
    ap.add_argument("--micro-batch", type=int, default=None, help="engine.micro_batch_size (config: 8)")
    ap.add_argument("--optim", choices=sorted(OPTIMS), default="default",
                    help="torch AdamW implementation (default: the config's optim.fused, i.e. fused)")
    ap.add_argument("--json", type=str, default=None, help="also write the results here")
    args = ap.parse_args(argv)
    os.environ.setdefault("MASTER_PORT", "29731")
    size = [f"model.overrides.{k}={v}" for k, v in SIZES[args.size].items()]
    common = [f"engine.torch_threads={args.threads}", "engine.zero_stage=0", *size]
    if args.micro_batch:
        common.append(f"engine.micro_batch_size={args.micro_batch}")
    precisions = [x.strip() for x in args.precisions.split(",") if x.strip()]
    if not precisions or set(precisions) - {"fp32", "bf16"}:
        ap.error(f"--precisions {args.precisions!r}: use fp32, bf16 or fp32,bf16")
    from elr_rl.train.sampler import expected_k_bar

    rows = []
    with tempfile.TemporaryDirectory() as tmp, _process_group():
        for precision in precisions:
            base, mixed = run_interleaved([
                make_trainer([*common, f"engine.precision={precision}", "loops.mode=fixed", "loops.fixed_k=1"],
                             args.steps, f"{tmp}/{precision}-k1", args.optim),
                make_trainer([*common, f"engine.precision={precision}", "loops.mode=independent",
                              f"loops.force_one_fraction={args.f}"], args.steps, f"{tmp}/{precision}-mixed",
                             args.optim),
            ], args.steps)
            K, d_eff = mixed["K"], mixed["d_eff"]
            k_bar = expected_k_bar(K, args.f)
            # D_eff(k) is linear in k, so D_eff(k_bar) is the mean effective depth of the mixed run.
            compute_ratio = (d_eff(1) + (d_eff(2) - d_eff(1)) * (k_bar - 1)) / d_eff(1)
            now = matmul_gflops(precision)
            for name, r in (("k=1", base), ("mixed", mixed)):
                gflops = r["tokens_per_s"] * r["flops_per_token"] / 1e9
                rows.append({"precision": precision, "run": name, "tokens_per_s": round(r["tokens_per_s"]),
                             "k_mean": round(r["k_mean"], 3), "model_gflops": round(gflops, 3),
                             "matmul_gflops_now": round(now, 1), "mfu_vs_matmul_now": round(gflops / now, 5)})
            rows.append({"precision": precision, "run": "ratio",
                         "throughput_k1_over_mixed": round(base["tokens_per_s"] / mixed["tokens_per_s"], 3),
                         "compute_ratio_D_eff(k_bar)/D_eff(1)": round(compute_ratio, 3), "k_bar": k_bar})
    rows.append({"threads": args.threads, "size": args.size, "steps": args.steps, "optim": args.optim,
                 "micro_batch": args.micro_batch or "config",
                 "load_average_1min": round(os.getloadavg()[0], 2)})
    for row in rows:
        print(json.dumps(row))
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
