"""Attention cores for the PyTorch model: dense (training, teacher forcing) and KV-cached (generation).

KV-cache modes:
* per_loop: one K/V cache per (sublayer, loop). Decoding at loop i sees past tokens'
  loop-i K/V: exactly what the teacher-forced forward computes.
* last_loop: one K/V cache per sublayer, overwritten by every loop; past tokens are
  seen with their last loop's K/V. Memory is flat in k, but decoding differs from
  the teacher-forced forward for k > 1.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from elr_rl.model.config import KV_CACHE_MODES


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Softmax attention with GQA. q: [B, Tq, H, hd], k/v: [B, Tk, KV, hd], allowed: [B or 1, Tq, Tk] bool."""
    H, KV = q.shape[-2], k.shape[-2]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, hd]
    if KV != H:
        kh = kh.repeat_interleave(H // KV, dim=1)
        vh = vh.repeat_interleave(H // KV, dim=1)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed.unsqueeze(1))
    return out.transpose(1, 2)  # [B, Tq, H, hd]


def _mask(q_pos: torch.Tensor, k_pos: torch.Tensor, window: int | None) -> torch.Tensor:
    """allowed[b, i, j] = k_j not after q_i and (no window or q_i - k_j < window)."""
    diff = q_pos.unsqueeze(-1) - k_pos.unsqueeze(-2)  # [B, Tq, Tk]
    allowed = diff >= 0
    if window is not None:
        allowed &= diff < window
    return allowed


class DenseCore:
    """Full-sequence causal attention, optionally over packed documents (segment_ids)."""

    def __init__(self, positions: torch.Tensor, segment_ids: torch.Tensor | None = None) -> None:
        # Causality is by index within the row; windows by position; documents never see each other.
        T = positions.shape[-1]
        idx = torch.arange(T, device=positions.device)
        self._causal = _mask(idx, idx, None).unsqueeze(0)  # [1, T, T]
        self._diff = positions.unsqueeze(-1) - positions.unsqueeze(-2)  # [B, T, T]
        self._same = None if segment_ids is None else segment_ids.unsqueeze(-1) == segment_ids.unsqueeze(-2)

    def __call__(self, q, k, v, layer_id: int, loop_idx: int, window: int | None) -> torch.Tensor:
        flat = q.dim() == 3
        if flat:  # a flat [T, H, hd] stream: add the batch dim
            q, k, v = q.unsqueeze(0), k.unsqueeze(0), v.unsqueeze(0)
        allowed = self._causal
        if window is not None:
            allowed = allowed & (self._diff < window)
        if self._same is not None:
            allowed = allowed & self._same
        out = _attend(q, k, v, allowed)
        return out.squeeze(0) if flat else out


class KVCache:
    """K/V per cache key; `length` tokens are committed, the current chunk starts there."""

    def __init__(self, mode: str, left_pad: torch.Tensor | None = None) -> None:
        if mode not in KV_CACHE_MODES:
            raise ValueError(f"kv cache mode must be one of {KV_CACHE_MODES}, got {mode!r}")
        self.mode = mode
        self.length = 0
        self.store: dict[object, tuple[torch.Tensor, torch.Tensor]] = {}
        # [B] pad tokens before each row's prompt (left padding): never attended to, positions start after them
        self.left_pad = left_pad if left_pad is not None and bool(left_pad.any()) else None

    def positions(self, T: int, device: torch.device) -> torch.Tensor:
        """Positions of the next T tokens: [1, T], or [B, T] counted from each row's first real token."""
        idx = torch.arange(self.length, self.length + T, device=device)[None]
        return idx if self.left_pad is None else (idx - self.left_pad[:, None]).clamp(min=0)

    def key(self, layer_id: int, loop_idx: int) -> object:
        return (layer_id, loop_idx) if self.mode == "per_loop" else layer_id

    def write(self, layer_id: int, loop_idx: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Write the chunk's K/V at [length, length + T) (overwriting in last_loop mode); return the visible K/V."""
        key, start, T = self.key(layer_id, loop_idx), self.length, k.shape[1]
        ck, cv = self.store.get(key, (k[:, :0], v[:, :0]))
        if ck.shape[1] < start + T:
            pad = start + T - ck.shape[1]
            ck = torch.cat([ck, k.new_zeros(k.shape[0], pad, *k.shape[2:])], dim=1)
            cv = torch.cat([cv, v.new_zeros(v.shape[0], pad, *v.shape[2:])], dim=1)
        ck[:, start : start + T] = k
        cv[:, start : start + T] = v
        self.store[key] = (ck, cv)
        return ck[:, : start + T], cv[:, : start + T]

    def advance(self, n: int) -> None:
        self.length += n

    def nbytes(self) -> int:
        return sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in self.store.values())

    def bytes_per_token(self) -> float:
        return self.nbytes() / max(self.length, 1)


class CachedCore:
    """Attention over the cache plus the current chunk (positions length .. length + T - 1)."""

    def __init__(self, cache: KVCache) -> None:
        self.cache = cache

    def __call__(self, q, k, v, layer_id: int, loop_idx: int, window: int | None) -> torch.Tensor:
        ck, cv = self.cache.write(layer_id, loop_idx, k, v)
        start, T = self.cache.length, q.shape[1]
        q_pos = torch.arange(start, start + T, device=q.device)
        k_pos = torch.arange(0, start + T, device=q.device)
        allowed = _mask(q_pos, k_pos, window).unsqueeze(0)  # a row's pads shift its positions, not the differences
        pad = self.cache.left_pad
        if pad is not None:  # no token sees a row's pads; a pad sees itself only (no empty softmax)
            real = k_pos[None, None, :] >= pad[:, None, None]
            allowed = (allowed & real) | (q_pos[:, None] == k_pos[None, :])[None]
        return _attend(q, ck, cv, allowed)
