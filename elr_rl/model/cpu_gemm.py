"""Few-row fp32 matrix products for an AVX2 CPU's decode steps (`csrc/small_gemm.cpp`).

A decode step multiplies every projection's weight by one row per running sequence: 1-64 rows in a small
batch or a request's thinning tail. On an AVX2-only AMD EPYC (Zen 3), fp32, this model's shapes, MKL and
oneDNN ran those products far under the machine's matmul ceiling (one thread: 6-48 and 5-57 GFLOP/s at 1-64
rows against a ceiling of 67-77); the kernel here ran them 0.97-1.48x the faster of the two at 1-4 rows and
1.09-1.36x at 8-256 on one thread, 1.26-2.88x at 1-128 rows on two (`scripts/bench_gemm.py`, two runs). It reads a copy of the weight packed in panels
of 16 output columns (`pack_panels`), made after each weight load, as vLLM's oneDNN handles are.

The kernel is built into the decode-attention extension (`cpu_attention.load`, compiled for the machine on
first use). `available()` says whether it can run here: built with AVX2 + FMA, on a CPU whose torch runs at
AVX2 (an AVX-512 CPU keeps oneDNN, measured faster there, and picks bf16 anyway). The vLLM model uses it for
fp32 batches below `vllm_model.onednn_row_limits` rows (`EngineOptions.cpu_gemm` = "elr", the default
where it is available); larger batches go to MKL. `reference` is the same product in PyTorch, for tests.
"""

from __future__ import annotations

import torch

PANEL = 16  # output columns per panel (two AVX2 registers)


def kernels():
    """The built extension holding `gemm_f32_panels`, or None (`cpu_attention.load_error()` says why)."""
    from elr_rl.model import cpu_attention

    module = cpu_attention.load()
    return module if module is not None and hasattr(module, "gemm_f32_panels") else None


def available(capability: str | None = None) -> bool:
    """Whether the kernel runs vectorised here and the CPU is one it was measured on (AVX2 without AVX-512)."""
    capability = capability or torch.backends.cpu.get_cpu_capability()
    if capability.upper() != "AVX2":
        return False
    module = kernels()
    return module is not None and bool(module.vectorised_gemm())


def pack_panels(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] fp32 -> [ceil(N / 16), K, 16]: panel p holds columns 16p..16p+15 of x W^T, zero-padded."""
    if weight.dim() != 2 or weight.dtype != torch.float32:
        raise ValueError(f"pack_panels takes a 2-D fp32 weight, got {tuple(weight.shape)} {weight.dtype}")
    n, k = weight.shape
    panels = -(-n // PANEL)
    padded = torch.nn.functional.pad(weight.detach(), (0, 0, 0, panels * PANEL - n))
    return padded.view(panels, PANEL, k).transpose(1, 2).contiguous()


def linear(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`F.linear(x, weight, bias)` for fp32 x [..., K], with `panels = pack_panels(weight)` and n = weight rows."""
    module = kernels()
    if module is None:
        from elr_rl.model import cpu_attention

        raise RuntimeError(f"the CPU gemm kernel is not built here: {cpu_attention.load_error()}")
    rows = x.reshape(-1, x.shape[-1])
    out = module.gemm_f32_panels(rows if rows.is_contiguous() else rows.contiguous(), panels, int(n),
                                 None if bias is None else bias.detach())
    return out.view(*x.shape[:-1], int(n))


def reference(x: torch.Tensor, panels: torch.Tensor, n: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """The same product from the packed weight, in PyTorch (for tests)."""
    weight = panels.transpose(1, 2).reshape(-1, panels.shape[1])[:n]
    return torch.nn.functional.linear(x, weight, bias)
