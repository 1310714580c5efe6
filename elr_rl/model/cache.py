"""Attention cores for the PyTorch model: dense (training, teacher forcing) and KV-cached (generation).

KV-cache modes:
* per_loop: one K/V cache per (sublayer, loop). Decoding at loop i sees past tokens'
  loop-i K/V: exactly what the teacher-forced forward computes.
* last_loop: one K/V cache per sublayer, overwritten by every loop; past tokens are
  seen with their last loop's K/V. Memory is flat in k, but decoding differs from
  the teacher-forced forward for k > 1.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from elr_rl.model.config import KV_CACHE_MODES

# scaled_dot_product_attention(enable_gqa=...) exists from torch 2.5. Used on the CPU only: in a one-off
# profile of a 47M bf16 learner step (1 thread) attention and its K/V gradient sums went from 365 to
# 240 ms; outputs and gradients matched the repeated K/V to the bit in the shapes checked, though not in
# every one (a 150-step toy SFT ended 2.7e-4 apart). Which CUDA kernel takes a masked call with it was
# not measured (no GPU here), so K/V are repeated there as before.
_SDPA_GQA = tuple(int(x) for x in torch.__version__.split("+")[0].split(".")[:2]) >= (2, 5)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
            teacher_forced: bool = False) -> torch.Tensor:
    """Softmax attention with GQA. q: [B, Tq, H, hd], k/v: [B, Tk, KV, hd], allowed: [B or 1, Tq, Tk] bool.

    `teacher_forced` (the dense and segment cores: training, and the no-grad passes that must agree
    with it): half-precision inputs on the CPU attend in fp32. PyTorch's CPU attention backward runs
    bf16 2-3x slower than fp32 (measured on AVX-512 with bf16 at an RL batch's shapes), while its
    forward, all that decoding runs, is faster in bf16.
    """
    H, KV = q.shape[-2], k.shape[-2]
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, T, hd]
    gqa = {}
    if KV != H and qh.device.type == "cpu" and _SDPA_GQA:
        gqa = {"enable_gqa": True}  # CPU: the kernel shares K/V among query heads (no copies, no summed grads)
    elif KV != H:
        kh = kh.repeat_interleave(H // KV, dim=1)
        vh = vh.repeat_interleave(H // KV, dim=1)
    if teacher_forced and qh.device.type == "cpu" and qh.dtype in (torch.bfloat16, torch.float16):
        out = F.scaled_dot_product_attention(qh.float(), kh.float(), vh.float(), attn_mask=allowed.unsqueeze(1), **gqa)
        return out.to(q.dtype).transpose(1, 2)
    out = F.scaled_dot_product_attention(qh, kh, vh, attn_mask=allowed.unsqueeze(1), **gqa)
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
        out = _attend(q, k, v, allowed, teacher_forced=True)
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


@dataclass
class _Bucket:
    """One attention call of `SegmentCore`: R segments padded to Q queries, keys = parent (P) + own (Q)."""

    q_idx: torch.Tensor  # [R, Q] stream index of each query (0 on pads)
    q_valid: torch.Tensor  # [R, Q]
    k_idx: torch.Tensor  # [R, P + Q]
    parent_len: int  # P
    allowed: torch.Tensor  # [R, Q, P + Q]
    windowed: dict[int, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self) -> None:
        # Flat forms for index_select: its backward adds rows back with index_add, where advanced
        # indexing's backward (index_put with accumulate, the parent's keys repeated in every child)
        # cost about a fifth of the attention call at an RL batch's shapes (bitwise the same results).
        self.q_flat = self.q_idx.reshape(-1)
        self.k_flat = self.k_idx.reshape(-1)
        self.out_flat = self.q_valid.reshape(-1).nonzero().squeeze(1)  # the real queries of [R * Q]


def _seen(allowed: torch.Tensor, q_valid: torch.Tensor, parent_len: int) -> torch.Tensor:
    """`allowed` with each pad query seeing its segment's first token: no empty softmax (its output is dropped)."""
    allowed[:, :, parent_len] |= ~q_valid
    return allowed


class SegmentCore:
    """Attention over the segments of packed rows, computed per segment (no T x T mask).

    A token sees the earlier tokens of its own segment and every token of its segment's
    parent: a GRPO group packs its prompt once, then each completion as a segment whose
    parent is the prompt, and every completion then attends exactly as it would after its
    own copy of the prompt (positions continue from the prompt's). A segment with parent
    -1 is a sequence on its own. Segments are contiguous runs of one id in a row; a parent
    is an earlier segment of the same row. Each segment is one attention row over its
    parent's keys and its own, so the cost is sum(len x (parent + len)), not (row length)^2.
    Rows of similar length go into one call (`BUCKET_RATIO`), so a short completion is not
    padded to its prompt's length.
    """

    BUCKET_RATIO = 1.5
    """A call's longest segment is at most this many times its shortest (sorted by length)."""

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
        starts_t = change.nonzero().squeeze(1)
        starts = starts_t.tolist()
        lens = torch.diff(starts_t, append=torch.tensor([B * T], device=dev)).tolist()
        # The parent of each run, found on the host (a batch holds tens to thousands of segments).
        runs: dict[tuple[int, int], int] = {}
        parent_of: list[int] = []
        for r, (b, s, p) in enumerate(zip(row[starts_t].tolist(), seg[starts_t].tolist(), par[starts_t].tolist())):
            if (b, s) in runs:
                raise ValueError(f"segment {s} of row {b} is not contiguous: pack each segment as one run")
            runs[(b, s)] = r
            if p == s:
                raise ValueError(f"segment {s} of row {b} is its own parent: use parent -1 for a whole sequence")
            if p >= 0 and (b, p) not in runs:
                raise ValueError(f"segment {s} of row {b} names parent {p}, which is not an earlier segment of "
                                 "that row: put the parent (the shared prompt) before its children")
            parent_of.append(runs[(b, p)] if p >= 0 else -1)
        self.flat_pos = positions.reshape(-1) if positions.numel() == B * T else positions.expand(B, T).reshape(-1)
        self.buckets: list[_Bucket] = []
        bucket: list[int] = []
        for r in sorted(range(len(starts)), key=lens.__getitem__):
            if bucket and lens[r] > self.BUCKET_RATIO * lens[bucket[0]]:
                self.buckets.append(self._bucket(bucket, starts, lens, parent_of, dev))
                bucket = []
            bucket.append(r)
        self.buckets.append(self._bucket(bucket, starts, lens, parent_of, dev))
        order = torch.cat([b.q_idx[b.q_valid] for b in self.buckets])  # stream index of each output
        self.inverse = None if len(self.buckets) == 1 else torch.empty_like(order).scatter_(
            0, order, torch.arange(order.numel(), device=dev))

    @staticmethod
    def _bucket(members: list[int], starts: list[int], lens: list[int], parent_of: list[int],
                dev: torch.device) -> _Bucket:
        """Index tensors of one attention call over the runs `members` (in stream order)."""
        members = sorted(members)
        st = torch.tensor([starts[r] for r in members], device=dev)
        ln = torch.tensor([lens[r] for r in members], device=dev)
        pst = torch.tensor([starts[parent_of[r]] if parent_of[r] >= 0 else 0 for r in members], device=dev)
        pln = torch.tensor([lens[parent_of[r]] if parent_of[r] >= 0 else 0 for r in members], device=dev)
        Q, P = int(ln.max()), int(pln.max())
        ar_q, ar_p = torch.arange(Q, device=dev), torch.arange(P, device=dev)
        q_valid = ar_q[None] < ln[:, None]  # [R, Q]
        q_idx = torch.where(q_valid, st[:, None] + ar_q[None], 0)
        p_valid = ar_p[None] < pln[:, None]
        k_idx = torch.cat([torch.where(p_valid, pst[:, None] + ar_p[None], 0), q_idx], dim=1)  # [R, P + Q]
        k_valid = torch.cat([p_valid, q_valid], dim=1)
        key_order = torch.cat([torch.full((P,), -1, device=dev), ar_q])  # the parent comes before every own token
        allowed = k_valid[:, None, :] & (key_order[None, None, :] <= ar_q[None, :, None])
        return _Bucket(q_idx, q_valid, k_idx, P, _seen(allowed, q_valid, P))

    def _allowed(self, b: _Bucket, window: int | None) -> torch.Tensor:
        if window is None:
            return b.allowed
        if window not in b.windowed:  # by position, as DenseCore: q_pos - k_pos < window
            diff = self.flat_pos[b.q_idx][:, :, None] - self.flat_pos[b.k_idx][:, None, :]
            b.windowed[window] = _seen(b.allowed & (diff < window), b.q_valid, b.parent_len)
        return b.windowed[window]

    def __call__(self, q, k, v, layer_id: int, loop_idx: int, window: int | None) -> torch.Tensor:
        shape = q.shape
        qf, kf, vf = q.reshape(-1, *q.shape[-2:]), k.reshape(-1, *k.shape[-2:]), v.reshape(-1, *v.shape[-2:])
        outs = []
        for b in self.buckets:
            R, Q = b.q_idx.shape
            qb = qf.index_select(0, b.q_flat).view(R, Q, *qf.shape[1:])
            kb = kf.index_select(0, b.k_flat).view(R, -1, *kf.shape[1:])
            vb = vf.index_select(0, b.k_flat).view(R, -1, *vf.shape[1:])
            o = _attend(qb, kb, vb, self._allowed(b, window), teacher_forced=True)
            outs.append(o.reshape(R * Q, *o.shape[2:]).index_select(0, b.out_flat))
        out = outs[0] if self.inverse is None else torch.cat(outs).index_select(0, self.inverse)
        return out.reshape(shape)
