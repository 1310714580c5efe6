"""Sublayers of the looped model: attention and MLP mixers, pre-norm and nGPT wrappers.

Shapes: hidden states are `[..., T, d]` (a batch `[B, T, d]` in training, a flat
token stream `[T, d]` in vLLM) with positions `[..., T]`. Attention calls a
pluggable *core* `core(q, k, v, layer_id, loop_idx, window)` on
`q: [..., T, H, hd]`, `k, v: [..., T, KV, hd]`, so the PyTorch model (SDPA plus
its own KV cache) and the vLLM model (vLLM `Attention`) share everything else.
"""

from __future__ import annotations

from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from elr_rl.model.config import LoopSpec
from elr_rl.model.loop import justnorm, modulate, scale_output, slerp_step


class AttentionCore(Protocol):
    def __call__(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, loop_idx: int, window: int | None
    ) -> torch.Tensor: ...


class RMSNorm(nn.Module):
    def __init__(self, d: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype) * self.weight


class Rotary(nn.Module):
    """Neox-style RoPE on the first `fraction * head_dim` channels of each head."""

    def __init__(self, head_dim: int, theta: float, fraction: float = 1.0) -> None:
        super().__init__()
        self.rot = int(head_dim * fraction)
        self.theta = theta
        self.register_buffer("inv_freq", self._inv_freq(), persistent=False)

    def _inv_freq(self) -> torch.Tensor:
        return 1.0 / (self.theta ** (torch.arange(0, self.rot, 2, dtype=torch.float32) / max(self.rot, 1)))

    def reset_buffers(self) -> None:
        """Recompute the frequencies (after building the module on the meta device)."""
        self.inv_freq = self._inv_freq()

    def _apply(self, fn, recurse=True):
        """Moves keep the frequencies in fp32: a module-wide cast (`model.to(torch.bfloat16)`, DeepSpeed's
        bf16 engine before 0.19) would round them, and the rounding grows with the position into an angle
        error of order position x 2^-9 rad (whole radians at 4-8k tokens)."""
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32 and not self.inv_freq.is_meta:
            self.inv_freq = self._inv_freq().to(self.inv_freq.device)
        return self

    def forward(self, x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        # x: [..., T, H, hd], positions: [..., T]
        if self.rot == 0:
            return x
        return self._rotate(x, *self._cos_sin(positions))

    def qk(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """`forward` on queries and keys, with the angles' cos and sin computed once for both."""
        if self.rot == 0:
            return q, k
        cos, sin = self._cos_sin(positions)
        return self._rotate(q, cos, sin), self._rotate(k, cos, sin)

    def _cos_sin(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ang = positions.float().unsqueeze(-1) * self.inv_freq  # [..., T, rot/2]
        return ang.cos().unsqueeze(-2), ang.sin().unsqueeze(-2)  # [..., T, 1, rot/2]

    def _rotate(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        half = self.rot // 2
        x1, x2, rest = x[..., :half].float(), x[..., half : self.rot].float(), x[..., self.rot :]
        out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
        return torch.cat([out, rest], dim=-1) if rest.shape[-1] else out


class Attention(nn.Module):
    """GQA attention with RoPE, optional sigmoid output gate; variants override the hooks."""

    def __init__(self, spec: LoopSpec, layer: int) -> None:
        super().__init__()
        d, H, KV, hd = spec.hidden_size, spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.H, self.KV, self.hd = H, KV, hd
        self.q_proj = nn.Linear(d, H * hd, bias=False)
        self.k_proj = nn.Linear(d, KV * hd, bias=False)
        self.v_proj = nn.Linear(d, KV * hd, bias=False)
        self.g_proj = nn.Linear(d, H * hd, bias=False) if spec.output_gate else None
        self.o_proj = nn.Linear(H * hd, d, bias=False)
        self.rotary = Rotary(hd, spec.rope_thetas[layer], spec.rotary_fractions[layer])
        self.window = spec.swa_window if spec.pattern[layer] == "S" else None
        self.layer = layer

    def qk_transform(self, q: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return q, k

    def gate_logits(self, g: torch.Tensor) -> torch.Tensor:
        return g

    def post(self, out: torch.Tensor) -> torch.Tensor:
        return out

    def forward(self, h: torch.Tensor, positions: torch.Tensor, core: AttentionCore, loop_idx: int) -> torch.Tensor:
        lead = h.shape[:-1]  # [..., T]
        q = self.q_proj(h).view(*lead, self.H, self.hd)
        k = self.k_proj(h).view(*lead, self.KV, self.hd)
        v = self.v_proj(h).view(*lead, self.KV, self.hd)
        q, k = self.rotary.qk(q, k, positions)
        q, k = self.qk_transform(q, k)
        out = core(q, k, v, self.layer, loop_idx, self.window).reshape(*lead, self.H * self.hd)
        if self.g_proj is not None:
            out = (out.float() * torch.sigmoid(self.gate_logits(self.g_proj(h)).float())).to(out.dtype)
        return self.o_proj(self.post(out))


class NgptAttention(Attention):
    """Dory: q = (sqk * sqrt(hd)/std)^2 * N(q) per head, k = N(k); gate scaled by s_gate; N before o_proj."""

    def __init__(self, spec: LoopSpec, layer: int) -> None:
        super().__init__(spec, layer)
        std = spec.init_std
        self.sqk = nn.Parameter(torch.full((self.H * self.hd,), std))
        self.s_gate = nn.Parameter(torch.full((self.H * self.hd,), std))
        self.sqk_factor = self.hd**0.5 / std
        self.s_gate_factor = spec.gate_logit_scale_init**0.5 / std

    def qk_transform(self, q, k):
        sqk = (self.sqk.float() * self.sqk_factor).view(self.H, self.hd).square()
        return (sqk * justnorm(q).float()).to(q.dtype), justnorm(k)

    def gate_logits(self, g):
        return g.float() * (self.s_gate.float() * self.s_gate_factor).square()

    def post(self, out):
        return justnorm(out)


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(h)) * up(h))."""

    def __init__(self, spec: LoopSpec) -> None:
        super().__init__()
        d, ff = spec.hidden_size, spec.intermediate_size
        self.gate_proj = nn.Linear(d, ff, bias=False)
        self.up_proj = nn.Linear(d, ff, bias=False)
        self.down_proj = nn.Linear(ff, d, bias=False)

    def forward(self, h: torch.Tensor, positions=None, core=None, loop_idx: int = 0) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))


class NgptMLP(MLP):
    """Dory: g = gate(h) * suv_gate * sqrt(d), u = up(h) * suv_up * sqrt(d), down(N(silu(g) * u))."""

    def __init__(self, spec: LoopSpec) -> None:
        super().__init__(spec)
        ff = spec.intermediate_size
        self.suv_gate = nn.Parameter(torch.ones(ff))
        self.suv_up = nn.Parameter(torch.ones(ff))
        self.suv_factor = spec.hidden_size**0.5

    def forward(self, h, positions=None, core=None, loop_idx: int = 0):
        g = self.gate_proj(h).float() * (self.suv_gate.float() * self.suv_factor)
        u = self.up_proj(h).float() * (self.suv_up.float() * self.suv_factor)
        return self.down_proj(justnorm((F.silu(g) * u).to(h.dtype)))


class PrenormSublayer(nn.Module):
    """h' = h + (1 + omega(c)) * f(modulate(RMSNorm(h))) (conditioning off: h + f(RMSNorm(h)))."""

    def __init__(self, spec: LoopSpec, layer: int) -> None:
        super().__init__()
        self.norm = RMSNorm(spec.hidden_size, spec.norm_eps)
        self.mixer = Attention(spec, layer) if spec.is_attention(layer) else MLP(spec)

    def forward(self, h, positions, core, loop_idx=0, mod=None):
        return h + scale_output(self.mixer(modulate(self.norm(h), mod), positions, core, loop_idx), mod)


class NgptSublayer(nn.Module):
    """h' = N(N(h) + |alpha * alpha_init / std| * (N(f(h)) - N(h))), alpha named attn_alpha / mlp_alpha."""

    def __init__(self, spec: LoopSpec, layer: int) -> None:
        super().__init__()
        attn = spec.is_attention(layer)
        self.mixer = NgptAttention(spec, layer) if attn else NgptMLP(spec)
        self.alpha_name = "attn_alpha" if attn else "mlp_alpha"
        self.register_parameter(self.alpha_name, nn.Parameter(torch.full((spec.hidden_size,), spec.init_std)))
        self.alpha_scale = spec.ngpt_alpha_init / spec.init_std

    def forward(self, h, positions, core, loop_idx=0, mod=None):
        out = scale_output(self.mixer(modulate(h, mod), positions, core, loop_idx), mod)
        return slerp_step(h, out, getattr(self, self.alpha_name) * self.alpha_scale)

