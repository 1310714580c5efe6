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


class SegmentCore:
    """Attention over the segments of packed rows, computed per segment (no T x T mask).

    A token sees the earlier tokens of its own segment and every token of its segment's
    parent: a GRPO group packs its prompt once, then each completion as a segment whose
    parent is the prompt, and every completion then attends exactly as it would after its
    own copy of the prompt (positions continue from the prompt's). A segment with parent
    -1 is a sequence on its own. Segments are contiguous runs of one id in a row; a parent
    is an earlier segment of the same row. Each segment is one attention row over its
    parent's keys and its own, so the cost is sum(len x (parent + len)), not (row length)^2,
    and the outputs come back in stream order with no scatter.
    """

    def __init__(self, positions: torch.Tensor, segment_ids: torch.Tensor, parent_ids: torch.Tensor) -> None:
        if segment_ids.shape != parent_ids.shape or segment_ids.dim() != 2:
            raise ValueError(f"segment_ids {tuple(segment_ids.shape)} and parent_ids {tuple(parent_ids.shape)} "
                             "must both be [B, T]")
        B, T = segment_ids.shape
        dev = segment_ids.device
        seg, par = segment_ids.reshape(-1), parent_ids.reshape(-1)
        row = torch.arange(B, device=dev).repeat_interleave(T)
        change = torch.ones(B * T, dtype=torch.bool, device=dev)
        change[1:] = (seg[1:] != seg[:-1]) | (row[1:] != row[:-1])
        starts = change.nonzero().squeeze(1)
        lens = torch.diff(starts, append=torch.tensor([B * T], device=dev))
        # The parent of each run, found on the host (a batch holds tens to thousands of segments).
        runs: dict[tuple[int, int], int] = {}
        p_start, p_len = [], []
        for r, (b, s, p, st) in enumerate(zip(row[starts].tolist(), seg[starts].tolist(), par[starts].tolist(),
                                              starts.tolist())):
            if (b, s) in runs:
                raise ValueError(f"segment {s} of row {b} is not contiguous: pack each segment as one run")
            runs[(b, s)] = r
            if p < 0:
                p_start.append(0), p_len.append(0)
                continue
            if (b, p) not in runs:
                raise ValueError(f"segment {s} of row {b} names parent {p}, which is not an earlier segment of "
                                 "that row: put the parent (the shared prompt) before its children")
            if p == s:
                raise ValueError(f"segment {s} of row {b} is its own parent: use parent -1 for a whole sequence")
            q = runs[(b, p)]
            p_start.append(int(starts[q])), p_len.append(int(lens[q]))
        pst = torch.tensor(p_start, device=dev)
        pln = torch.tensor(p_len, device=dev)
        Q, P = int(lens.max()), int(pln.max()) if len(p_len) else 0
        ar_q, ar_p = torch.arange(Q, device=dev), torch.arange(P, device=dev)
        self.q_valid = ar_q[None] < lens[:, None]  # [R, Q]
        self.q_idx = torch.where(self.q_valid, starts[:, None] + ar_q[None], 0)
        p_valid = ar_p[None] < pln[:, None]
        self.k_idx = torch.cat([torch.where(p_valid, pst[:, None] + ar_p[None], 0), self.q_idx], dim=1)  # [R, P + Q]
        k_valid = torch.cat([p_valid, self.q_valid], dim=1)
        order = torch.cat([torch.full((P,), -1, device=dev), ar_q])  # the parent comes before every own token
        allowed = k_valid[:, None, :] & (order[None, None, :] <= ar_q[None, :, None])
        # a pad query row sees its segment's first token: no empty softmax, and its output is dropped
        allowed[:, :, P] |= ~self.q_valid
        self._allowed = allowed
        flat_pos = positions.reshape(-1) if positions.numel() == B * T else positions.expand(B, T).reshape(-1)
        self._diff = flat_pos[self.q_idx][:, :, None] - flat_pos[self.k_idx][:, None, :]
        self._windowed: dict[int, torch.Tensor] = {}

    def __call__(self, q, k, v, layer_id: int, loop_idx: int, window: int | None) -> torch.Tensor:
        shape = q.shape
        qf, kf, vf = q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:]), v.reshape(-1, *v.shape[-2:])
        allowed = self._allowed
        if window is not None:
            if window not in self._windowed:
                w = self._allowed & (self._diff < window)
                w[:, :, self._allowed.shape[-1] - self._allowed.shape[1]] |= ~self.q_valid
                self._windowed[window] = w
            allowed = self._windowed[window]
        out = _attend(qf[self.q_idx], kf[self.k_idx], vf[self.k_idx], allowed)  # [R, Q, H, hd]
        return out[self.q_valid].reshape(shape)  # runs tile the stream in order
