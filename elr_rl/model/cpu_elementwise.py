"""One-pass CPU kernels for a bf16 decode step's RMSNorm and rotary embedding (`csrc/elementwise.cpp`).

PyTorch runs the model's RMSNorm as seven kernels over fp32 temporaries and `Rotary._rotate` as eleven; on
one thread at a decode step's sizes that cost 84-259 us per RMSNorm and 100-340 us per query rotation (a
47M model, 96-384 rows), a few percent of the step. The kernels compute the same values with the same
roundings (see the C++ file for the one exception, the order of RMSNorm's sum of squares), and are built
into the decode-attention extension (`cpu_attention.load`).

`fuse(model)` points the model's `RMSNorm` and `Rotary` modules at them, for bf16 inputs without autograd
(anything else runs the PyTorch code as before). The vLLM model calls it on CPU in eager mode where the
kernels were built with AVX-512 (without it their scalar sums of squares round differently from PyTorch's
more often, and such CPUs run fp32 anyway); the training model never does.
"""

from __future__ import annotations

import types

import torch

from elr_rl.model import cpu_attention
from elr_rl.model.layers import RMSNorm, Rotary


def _kernels():
    module = cpu_attention.load()
    return module if module is not None and hasattr(module, "rms_norm_bf16") else None


def rms_norm(module, norm: RMSNorm, x: torch.Tensor) -> torch.Tensor | None:
    """`norm(x)` by the kernel, or None where it does not apply."""
    w = norm.weight
    if (x.dtype != torch.bfloat16 or w.dtype != torch.bfloat16 or x.device.type != "cpu" or not x.is_contiguous()
            or x.dim() < 1 or x.shape[-1] != w.shape[0] or (torch.is_grad_enabled() and (x.requires_grad or w.requires_grad))):
        return None
    return module.rms_norm_bf16(x, w.detach(), float(norm.eps))


def rotate(module, rot: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor | None:
    """`Rotary._rotate(x, cos, sin)` for x [T, H, D] by the kernel, or None where it does not apply."""
    half = rot // 2
    if (x.dtype != torch.bfloat16 or x.device.type != "cpu" or x.dim() != 3 or not x.is_contiguous()
            or cos.dtype != torch.float32 or sin.dtype != torch.float32 or cos.shape != (x.shape[0], 1, half)
            or sin.shape != cos.shape or (torch.is_grad_enabled() and x.requires_grad)):
        return None
    return module.rotary_bf16(x, cos.reshape(x.shape[0], half).contiguous(), sin.reshape(x.shape[0], half).contiguous(), rot)


def fuse(model: torch.nn.Module) -> int:
    """Route `model`'s RMSNorm and Rotary modules through the kernels; returns how many (0 where the kernels
    cannot be built: `cpu_attention.load_error()` says why)."""
    module = _kernels()
    if module is None:
        return 0
    count = 0
    for sub in model.modules():
        if type(sub) is RMSNorm:
            plain = sub.forward

            def forward(self, x, _plain=plain):
                out = rms_norm(module, self, x)
                return _plain(x) if out is None else out

            sub.forward = types.MethodType(forward, sub)
            count += 1
        elif type(sub) is Rotary and sub.rot > 0:
            plain = sub._rotate

            def _rotate(self, x, cos, sin, _plain=plain):
                out = rotate(module, self.rot, x, cos, sin)
                return _plain(x, cos, sin) if out is None else out

            sub._rotate = types.MethodType(_rotate, sub)
            count += 1
    return count


def unfuse(model: torch.nn.Module) -> int:
    """Undo `fuse`: the modules run PyTorch's code again; returns how many were routed."""
    count = 0
    for sub in model.modules():
        for name in ("forward", "_rotate"):
            if name in vars(sub) and type(sub) in (RMSNorm, Rotary):
                delattr(sub, name)
                count += 1
    return count
