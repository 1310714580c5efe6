"""The loop math, shared by the PyTorch model and the vLLM model so they cannot drift.

State between loops (per token, d channels):

    s_0  = h_in  (or 0)                 initial state
    s~_i = s_{i-1} + h_in               input re-injected every loop
    r_i  = R(s~_i)                      the recurrent block's proposal
    s_i  = Update(s_{i-1}, r_i, s~_i)   one small class per update rule
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

NGPT_EPS = 1e-6


def justnorm(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """nGPT's N(x) = x * rsqrt(sum(x^2) + eps), accumulated in fp32."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).sum(dim=dim, keepdim=True) + NGPT_EPS)).to(x.dtype)


def slerp_step(h: torch.Tensor, f_h: torch.Tensor, lr: torch.Tensor) -> torch.Tensor:
    """nGPT's normalised residual step: h' = N(N(h) + |lr| * (N(f(h)) - N(h)))."""
    a, b = justnorm(h).float(), justnorm(f_h).float()
    return justnorm(a + lr.float().abs() * (b - a)).to(h.dtype)


# ---------------------------------------------------------------------------------------
# Update rules. Each has `inject` (builds the recurrent block's input) and `update`.


class UpdateRule(nn.Module):
    """Base: s~_i = s_{i-1} + h_in."""

    def inject(self, s_prev: torch.Tensor, h_in: torch.Tensor) -> torch.Tensor:
        return s_prev + h_in  # s~_i = s_{i-1} + h_in

    def update(self, s_prev: torch.Tensor, r: torch.Tensor, s_tilde: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError


class ReplaceUpdate(UpdateRule):
    def update(self, s_prev, r, s_tilde):
        return r  # s_i = r_i


class ResidualUpdate(UpdateRule):
    def update(self, s_prev, r, s_tilde):
        return s_prev + r  # s_i = s_{i-1} + r_i


class DeltaUpdate(UpdateRule):
    """s_i = s_{i-1} + a * (r_i - s_{i-1}), a per channel, init 0.05."""

    def __init__(self, d: int, init: float = 0.05) -> None:
        super().__init__()
        self.a = nn.Parameter(torch.full((d,), init))

    def update(self, s_prev, r, s_tilde):
        return s_prev + self.a * (r - s_prev)


class AdaptiveDeltaUpdate(UpdateRule):
    """ELR eq. 2: s_i = s_{i-1} + b_i * (r_i - s_{i-1}), b_i = sigmoid(W s~_i + c) * softplus(g).

    W, c, g are zero-initialised and shared by all loops, so every gate starts at
    sigmoid(0) * softplus(0) = ln(2)/2 = 0.3466; d^2 + 2d parameters.
    """

    def __init__(self, d: int) -> None:
        super().__init__()
        self.W = nn.Linear(d, d, bias=True)  # weight W (d x d) and bias c (d)
        self.g = nn.Parameter(torch.zeros(d))
        nn.init.zeros_(self.W.weight)
        nn.init.zeros_(self.W.bias)

    def gate(self, s_tilde: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.W(s_tilde)) * nn.functional.softplus(self.g)  # b_i

    def update(self, s_prev, r, s_tilde):
        return s_prev + self.gate(s_tilde) * (r - s_prev)


class NgptUpdate(UpdateRule):
    """Dory: u_i = N(s_{i-1} + h_in), s_i = N(R(u_i))."""

    def inject(self, s_prev, h_in):
        return justnorm(s_prev + h_in)

    def update(self, s_prev, r, s_tilde):
        return justnorm(r)


def make_update_rule(name: str, d: int) -> UpdateRule:
    rules: dict[str, Callable[[], UpdateRule]] = {
        "replace": ReplaceUpdate,
        "residual": ResidualUpdate,
        "delta": lambda: DeltaUpdate(d),
        "adaptive_delta": lambda: AdaptiveDeltaUpdate(d),
        "ngpt": NgptUpdate,
    }
    if name not in rules:
        raise ValueError(f"unknown update_rule {name!r}; choose one of {', '.join(rules)}")
    return rules[name]()


# ---------------------------------------------------------------------------------------
# Loop-conditioned modulation (ELR eq. 4).


def loop_features(x: float, n_freq: int, device=None) -> torch.Tensor:
    """phi(x) = [sin(2^j pi x), cos(2^j pi x)]_{j < n_freq}."""
    freqs = (2.0 ** torch.arange(n_freq, dtype=torch.float32, device=device)) * math.pi * x
    return torch.cat([freqs.sin(), freqs.cos()])


LOW_RANK = 8  # rank r of the gated low-rank term A(g(c) * B x~), capped at d


@dataclass
class Modulation:
    """One sublayer's loop-conditioned modulation (ELR eq. 4), for the loop being run.

        x~ = (1 + lambda(c)) * x + mu(c)              FiLM on the sublayer's (normalised) input
        x^ = x~ + A (g(c) * B x~)                      gated low-rank correction, rank r
        y  = (1 + omega(c)) * f(x^)                    output scale on the sublayer's output
    """

    lam: torch.Tensor  # [d]
    mu: torch.Tensor  # [d]
    gate: torch.Tensor  # [r]
    omega: torch.Tensor  # [d]
    down: nn.Linear  # B: d -> r
    up: nn.Linear  # A: r -> d

    def apply_input(self, x: torch.Tensor) -> torch.Tensor:
        x = x * (1 + self.lam) + self.mu  # x~ = (1 + lambda(c)) x + mu(c)
        return x + self.up(self.gate * self.down(x))  # x^ = x~ + A(g(c) * B x~)

    def apply_output(self, y: torch.Tensor) -> torch.Tensor:
        return y * (1 + self.omega)  # (1 + omega(c)) f(x^)


class LoopConditioning(nn.Module):
    """c_i = MLP([phi(i/k); phi(k/K)]) modulating each recurrent and output sublayer (ELR eq. 4).

    Sublayer j has heads giving (lambda_j, mu_j) (`heads`), the low-rank gate g_j
    (`gate_heads`) and the output scale omega_j (`scale_heads`), plus its own low-rank
    pair B_j (`down`, d -> r) and A_j (`up`, r -> d). The heads are zero-initialised,
    so switching conditioning on leaves the function unchanged bit for bit (g = 0
    silences the low-rank term); A and B keep a random init so that g gets gradients.
    """

    def __init__(self, d: int, n_heads: int, max_loops: int, n_freq: int = 4, hidden: int = 64) -> None:
        super().__init__()
        self.n_freq, self.max_loops = n_freq, max_loops
        r = min(LOW_RANK, d)
        self.trunk = nn.Sequential(nn.Linear(4 * n_freq, hidden), nn.SiLU(), nn.Linear(hidden, hidden), nn.SiLU())
        self.heads = nn.ModuleList(nn.Linear(hidden, 2 * d) for _ in range(n_heads))
        self.gate_heads = nn.ModuleList(nn.Linear(hidden, r) for _ in range(n_heads))
        self.scale_heads = nn.ModuleList(nn.Linear(hidden, d) for _ in range(n_heads))
        self.down = nn.ModuleList(nn.Linear(d, r, bias=False) for _ in range(n_heads))
        self.up = nn.ModuleList(nn.Linear(r, d, bias=False) for _ in range(n_heads))
        self.reset_heads()

    def reset_heads(self) -> None:
        for head in (*self.heads, *self.gate_heads, *self.scale_heads):
            nn.init.zeros_(head.weight)
            nn.init.zeros_(head.bias)

    def forward(self, i: int, k: int, head_ids: range) -> list[Modulation]:
        dev = self.heads[0].weight.device
        x = torch.cat([loop_features(i / k, self.n_freq, dev), loop_features(k / self.max_loops, self.n_freq, dev)])
        c = self.trunk(x.to(self.heads[0].weight.dtype))
        mods = []
        for j in head_ids:
            lam, mu = self.heads[j](c).chunk(2)
            mods.append(Modulation(lam, mu, self.gate_heads[j](c), self.scale_heads[j](c), self.down[j], self.up[j]))
        return mods


def modulate(x: torch.Tensor, mod: Modulation | None) -> torch.Tensor:
    """A sublayer's input under eq. 4 (identity when conditioning is off)."""
    return x if mod is None else mod.apply_input(x)


def scale_output(y: torch.Tensor, mod: Modulation | None) -> torch.Tensor:
    """A sublayer's output times (1 + omega(c)) (identity when conditioning is off)."""
    return y if mod is None else mod.apply_output(y)


# ---------------------------------------------------------------------------------------
# The loop itself.


def run_loops(
    h_in: torch.Tensor,
    k: int,
    recurrent_block: Callable[[torch.Tensor, int], torch.Tensor],
    rule: UpdateRule,
    initial_state: str = "input_copy",
    truncate: int | None = None,
    on_state: Callable[[int, torch.Tensor], None] | None = None,
) -> torch.Tensor:
    """Run the recurrent block k times; loop i (1-based) calls recurrent_block(s~_i, i).

    Truncated backprop: with `truncate = n`, loops 1..k-n run without autograd, so
    only the last n loops carry gradients. `on_state(i, s_i)` sees every loop's state
    (per-loop readouts).
    """
    s = h_in if initial_state == "input_copy" else torch.zeros_like(h_in)  # s_0
    for i in range(1, k + 1):
        track = truncate is None or i > k - truncate
        with torch.set_grad_enabled(track and torch.is_grad_enabled()):
            s_tilde = rule.inject(s, h_in)  # s~_i = s_{i-1} + h_in
            r = recurrent_block(s_tilde, i)  # r_i = R(s~_i)
            s = rule.update(s, r, s_tilde)  # s_i = Update(s_{i-1}, r_i, s~_i)
        if on_state is not None:
            on_state(i, s)
    return s
