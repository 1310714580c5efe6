"""An independent, plainly written reference of the pre-norm looped model, read from a state dict.

Used by the tests to check the model against the equations rather than against itself.
Supports the update rules replace / residual / adaptive_delta, full attention, no gate, and
ELR eq. 4's loop conditioning, all written out from the equations:

    c      = SiLU(W2 SiLU(W1 [phi(i/k); phi(k/K)] + b1) + b2),  phi(x) = [sin(2^j pi x); cos(2^j pi x)]
    x~     = (1 + lambda_j(c)) * RMSNorm(h) + mu_j(c)
    x^     = x~ + A_j (g_j(c) * B_j x~)
    h'     = h + (1 + omega_j(c)) * f(x^)
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F


def rms(x, w, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def rope(x, pos, theta=10000.0):
    # x: [T, H, hd] neox style
    hd = x.shape[-1]
    inv = 1.0 / (theta ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    ang = pos.float()[:, None] * inv  # [T, hd/2]
    cos, sin = ang.cos()[:, None], ang.sin()[:, None]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)


class Ref:
    """Reference forward of one sequence (batch of 1), with an explicit K/V store for cached decoding."""

    def __init__(self, model):
        self.sd = {n: t.detach() for n, t in model.state_dict().items()}
        c = model.config
        self.H, self.KV = c.num_attention_heads, c.num_key_value_heads
        self.hd = c.hidden_size // c.num_attention_heads
        self.n_in, self.n_rec, self.n_out = 2 * c.n_input_layers, 2 * c.n_recurrent_layers, 2 * c.n_output_layers
        self.rule, self.init = c.update_rule, c.initial_state
        self.cond, self.K = c.loop_conditioning, c.max_loops

    def conditioning(self, i, k, j):
        """Sublayer j's (lambda, mu, g, omega, A, B) at loop i of k (j counts recurrent then output sublayers)."""
        p = "backbone.loop_cond."
        feats = []
        for x in (i / k, k / self.K):
            feats += [math.sin(2**f * math.pi * x) for f in range(4)] + [math.cos(2**f * math.pi * x) for f in range(4)]
        c = torch.tensor(feats)
        c = F.silu(c @ self.sd[p + "trunk.0.weight"].T + self.sd[p + "trunk.0.bias"])
        c = F.silu(c @ self.sd[p + "trunk.2.weight"].T + self.sd[p + "trunk.2.bias"])
        lin = lambda name: c @ self.sd[f"{p}{name}.{j}.weight"].T + self.sd[f"{p}{name}.{j}.bias"]  # noqa: E731
        lam_mu = lin("heads")
        d = lam_mu.shape[0] // 2
        return (lam_mu[:d], lam_mu[d:], lin("gate_heads"), lin("scale_heads"),
                self.sd[f"{p}up.{j}.weight"], self.sd[f"{p}down.{j}.weight"])

    def attn(self, i, x, pos, store, key):
        p = f"backbone.layers.{i}.mixer."
        T = x.shape[0]
        q = rope((x @ self.sd[p + "q_proj.weight"].T).view(T, self.H, self.hd), pos)
        k = rope((x @ self.sd[p + "k_proj.weight"].T).view(T, self.KV, self.hd), pos)
        v = (x @ self.sd[p + "v_proj.weight"].T).view(T, self.KV, self.hd)
        if store is not None:  # write this chunk's K/V at its positions, then read everything so far
            K, V = store.setdefault(key, ({}, {}))
            for j, t in enumerate(pos.tolist()):
                K[t], V[t] = k[j], v[j]
            upto = int(pos[-1]) + 1
            k = torch.stack([K[t] for t in range(upto)])
            v = torch.stack([V[t] for t in range(upto)])
        kpos = torch.arange(k.shape[0])
        mask = kpos[None, :] <= pos[:, None]
        rep = self.H // self.KV
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        att = torch.einsum("qhd,khd->hqk", q, k) / self.hd**0.5
        att = att.masked_fill(~mask, float("-inf")).softmax(-1)
        out = torch.einsum("hqk,khd->qhd", att, v).reshape(T, -1)
        return out @ self.sd[p + "o_proj.weight"].T

    def mlp(self, i, x):
        p = f"backbone.layers.{i}.mixer."
        return (F.silu(x @ self.sd[p + "gate_proj.weight"].T) * (x @ self.sd[p + "up_proj.weight"].T)) @ self.sd[
            p + "down_proj.weight"
        ].T

    def sub(self, i, h, pos, store, key, loop=None, k=None):
        x = rms(h, self.sd[f"backbone.layers.{i}.norm.weight"])
        if self.cond and i >= self.n_in:  # recurrent sublayers at loop `loop`, output ones at loop k
            lam, mu, g, omega, A, B = self.conditioning(loop, k, i - self.n_in)
            x = (1 + lam) * x + mu
            x = x + (g * (x @ B.T)) @ A.T
        else:
            omega = torch.zeros(())
        return h + (1 + omega) * (self.attn(i, x, pos, store, key) if i % 2 == 0 else self.mlp(i, x))

    def forward(self, ids, k, store=None, mode="per_loop", start=0):
        """Logits [T, V] of a chunk of token ids at positions start..; `store` holds K/V across calls."""
        pos = torch.arange(start, start + len(ids))
        h = self.sd["backbone.embeddings.weight"][ids]
        key = lambda i, loop: (i, loop) if mode == "per_loop" else i  # noqa: E731
        for i in range(self.n_in):
            h = self.sub(i, h, pos, store, key(i, 0))
        h_in = h
        s = h_in.clone() if self.init == "input_copy" else torch.zeros_like(h_in)
        for loop in range(k):
            x = s + h_in
            st = x
            for i in range(self.n_in, self.n_in + self.n_rec):
                x = self.sub(i, x, pos, store, key(i, loop), loop + 1, k)
            if self.rule == "replace":
                s = x
            elif self.rule == "residual":
                s = s + x
            else:  # adaptive_delta
                W, c, g = self.sd["backbone.update.W.weight"], self.sd["backbone.update.W.bias"], self.sd["backbone.update.g"]
                b = torch.sigmoid(st @ W.T + c) * F.softplus(g)
                s = s + b * (x - s)
        h = s
        for i in range(self.n_in + self.n_rec, self.n_in + self.n_rec + self.n_out):
            h = self.sub(i, h, pos, store, key(i, 0), k, k)
        h = rms(h, self.sd["backbone.final_norm.weight"])
        return h @ self.sd["lm_head.weight"].T

    def generate(self, prompt, n, k, mode):
        """Greedy decoding with an explicit cache: prompt as one chunk, then one token at a time."""
        store: dict = {}
        ids = list(prompt)
        logits = self.forward(torch.tensor(ids), k, store, mode, 0)
        lps = []
        for _ in range(n):
            lp = logits[-1].log_softmax(-1)
            nxt = int(lp.argmax())
            lps.append(float(lp[nxt]))
            ids.append(nxt)
            logits = self.forward(torch.tensor([nxt]), k, store, mode, len(ids) - 1)
        return ids, lps
