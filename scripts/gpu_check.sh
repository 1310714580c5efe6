#!/usr/bin/env bash
# GPU check of the PyTorch looped model, for a machine with an accelerator but no vLLM,
# DeepSpeed or Ray (only python3 with torch, transformers, safetensors): about 3-5 minutes on an H200.
#
#   scripts/gpu_check.sh                      # cuda, a Dory-shaped slice at the released hidden size (2560)
#   scripts/gpu_check.sh --device cpu --tiny  # the same checks on a tiny model (a CPU test runs this)
#
# Measures: the matrix-product ceiling (bf16 unless --dtype float32); forward + backward and an AdamW learner step
# (MFU against that ceiling), also with activation checkpointing (time and peak memory against the plain step);
# forward time per token at k = 1..4 against D_eff(k)/D_eff(1);
# GPU-vs-CPU parity of fp32 logits at k = 1 and 4. Prints a table, then one JSON line.
# PYTHON=... picks the interpreter (default python3).
set -euo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec "${PYTHON:-python3}" - "$@" <<'PYEOF'
import argparse
import json
import sys
import time

import torch

sys.path.insert(0, "scripts")
from bench_train import train_flops_per_token  # noqa: E402  (stdlib-only at import)

from elr_rl.model import DoryConfig, LoopedForCausalLM  # noqa: E402

p = argparse.ArgumentParser(prog="gpu_check.sh")
p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
p.add_argument("--tiny", action="store_true", help="a tiny model and few steps (CPU tests)")
p.add_argument("--seq", type=int, default=None, help="tokens per row")
p.add_argument("--batch", type=int, default=None, help="rows per step")
p.add_argument("--steps", type=int, default=None, help="timed learner steps")
p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"],
               help="of the learner step, the forward timings and the ceiling (parity is always fp32)")
args = p.parse_args(sys.argv[1:])
dev = torch.device(args.device)
if dev.type == "cuda" and not torch.cuda.is_available():
    raise SystemExit("gpu_check: no CUDA device visible; run with --device cpu --tiny for the CPU check")
torch.backends.cuda.matmul.allow_tf32 = False  # parity in true fp32
torch.backends.cudnn.allow_tf32 = False

if args.tiny:
    shape = dict(vocab_size=512, hidden_size=64, num_hidden_layers=24, intermediate_size=128, num_attention_heads=4,
                 num_key_value_heads=2, attention_head_dim=16, swa_window_size=32, n_input_layers=8,
                 n_recurrent_layers=8, n_output_layers=8)
    seq, batch, steps, mm_n = args.seq or 64, args.batch or 4, args.steps or 2, 256
else:  # the released widths (hidden 2560, 16 heads of 256, 4 KV heads, MLP 7168, vocab 131072), 24 of its 72 sublayers
    shape = dict(num_hidden_layers=24, n_input_layers=8, n_recurrent_layers=8, n_output_layers=8)
    seq, batch, steps, mm_n = args.seq or 2048, args.batch or 4, args.steps or 5, 8192
config = DoryConfig(**shape, n_recurrent_loops=4, max_position_embeddings=max(seq, 64))


def sync():
    if dev.type == "cuda":
        torch.cuda.synchronize()


def timed(fn, reps):
    fn()  # warm-up (kernels, allocator)
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    sync()
    return (time.perf_counter() - t) / reps


def matmul_tflops(dtype):
    a = torch.randn(mm_n, mm_n, device=dev, dtype=dtype)
    b = torch.randn(mm_n, mm_n, device=dev, dtype=dtype)
    return 2 * mm_n**3 / timed(lambda: a @ b, 10) / 1e12


result = {"device": torch.cuda.get_device_name() if dev.type == "cuda" else "cpu", "torch": torch.__version__,
          "tiny": args.tiny, "seq": seq, "batch": batch}
dtype = getattr(torch, args.dtype)
result["dtype"] = args.dtype
ceiling = matmul_tflops(dtype)
result["ceiling_tflops"] = round(ceiling, 3)

torch.manual_seed(0)
model = LoopedForCausalLM(config)
result["params"] = model.num_parameters()
cpu_ref = {n: t.clone() for n, t in model.state_dict().items()}
model = model.to(dev, dtype)
ids = torch.randint(0, config.vocab_size, (batch, seq), device=dev)

# Learner step: forward + backward at k = 4 (the deepest, where MFU matters most) and AdamW.
opt = torch.optim.AdamW(model.parameters(), lr=1e-5, fused=dev.type == "cuda")


def learner_step(k=4):
    logits = model(ids, k=k)
    loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), ids[:, 1:].flatten())
    loss.backward()
    opt.step()
    opt.zero_grad(set_to_none=True)
    return loss


step_s = timed(learner_step, steps)
step_flops = train_flops_per_token(model, 4, seq) * batch * seq
result["learner_step_s_k4"] = round(step_s, 4)
result["learner_tflops"] = round(step_flops / step_s / 1e12, 3)
result["learner_mfu"] = round(step_flops / step_s / 1e12 / ceiling, 4)
result["loss_finite"] = bool(torch.isfinite(learner_step()).item())
if dev.type == "cuda":
    result["peak_mem_gib"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)

# The same step with activation checkpointing (engine.activation_checkpointing: what the 4B configs run).
model.backbone.checkpoint_sublayers = True
if dev.type == "cuda":
    torch.cuda.reset_peak_memory_stats()
ckpt_s = timed(learner_step, steps)
model.backbone.checkpoint_sublayers = False
result["learner_step_s_k4_checkpointed"] = round(ckpt_s, 4)
result["checkpointed_time_ratio"] = round(ckpt_s / step_s, 3)
if dev.type == "cuda":
    result["peak_mem_gib_checkpointed"] = round(torch.cuda.max_memory_allocated() / 2**30, 1)
del opt

# Forward time per token at k = 1..4 against D_eff(k) / D_eff(1).
model.eval()
per_token = {}
with torch.no_grad():
    for k in (1, 2, 3, 4):
        per_token[k] = timed(lambda k=k: model(ids, k=k), max(2, steps)) / (batch * seq)
spec = model.spec
result["forward_us_per_token"] = {f"k{k}": round(1e6 * v, 3) for k, v in per_token.items()}
result["time_ratio_vs_k1"] = {f"k{k}": round(per_token[k] / per_token[1], 3) for k in per_token}
result["d_eff_ratio_vs_k1"] = {f"k{k}": round(spec.effective_depth(k) / spec.effective_depth(1), 3) for k in per_token}

# Parity: fp32 logits on this device against the CPU, same weights, at k = 1 and 4.
del model
ref = LoopedForCausalLM(config).eval()
ref.load_state_dict(cpu_ref)
short = ids[:1, : min(seq, 128)].cpu()
parity = {}
with torch.no_grad():
    for k in (1, 4):
        want = ref(short, k=k).log_softmax(-1)
        got = ref.to(dev)(short.to(dev), k=k).log_softmax(-1).cpu()
        ref = ref.cpu()
        parity[f"k{k}"] = float((got - want).abs().max())
result["parity_max_abs_logprob_fp32"] = parity

print(f"{'device':28s}{result['device']}  ({result['params'] / 1e6:.1f}M parameters, batch {batch} x {seq} tokens)")
print(f"{args.dtype + ' matmul ceiling':28s}{ceiling:.2f} TFLOP/s")
print(f"{'learner step k=4':28s}{step_s:.3f} s, {result['learner_tflops']} TFLOP/s, MFU {result['learner_mfu']:.1%}"
      + (f", peak {result['peak_mem_gib']} GiB" if "peak_mem_gib" in result else ""))
print(f"{'  activations checkpointed':28s}{ckpt_s:.3f} s (x{result['checkpointed_time_ratio']})"
      + (f", peak {result['peak_mem_gib_checkpointed']} GiB" if "peak_mem_gib_checkpointed" in result else ""))
for k in per_token:
    print(f"forward k={k}: {1e6 * per_token[k]:9.3f} us/token  time x{per_token[k] / per_token[1]:.3f} "
          f"vs D_eff x{spec.effective_depth(k) / spec.effective_depth(1):.3f}")
print(f"{'fp32 parity vs CPU':28s}{parity}")
print(json.dumps(result))
PYEOF
