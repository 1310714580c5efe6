"""Self-speculative decoding: the same weights draft at k = 1 and verify at k = K (Dory's scheme).

One round, for a committed sequence x_<L whose last token x_{L-1} is not yet in the cache:

    draft   d_j ~ q_j = p_k1(. | x_<L, d_<j)           j = 1..gamma, one k=1 step each
    verify  p_j = p_kK(. | x_<L, d_<j)                 j = 1..gamma+1, ONE k=K step over gamma+1 tokens
    accept  d_j while u_j < p_j(d_j) / q_j(d_j)        u_j ~ U(0, 1)
    then    at the first rejection j: x ~ norm(max(0, p_j - q_j)); if all accepted: x ~ p_{gamma+1}

The emitted tokens are distributed exactly as plain k = K sampling (Leviathan et al. 2023,
Chen et al. 2023): for each position, P(emit x) = q(x) min(1, p/q) + (1 - sum_y min(p, q)) *
max(0, p - q)(x) / sum_y max(0, p - q)(y) = min(p, q)(x) + max(0, p - q)(x) = p(x).

Sharing the loop-1 work (per_loop KV cache, no loop conditioning): the input block and the first
recurrent loop compute the same states and the same K/V whatever k is, so the verifier starts from
the draft's loop-1 states (s_1, h_in) and runs only loops 2..K and the output block; the draft
only keeps its own K/V for the output block (it reads s_1, not s_K). With loop conditioning
(c_i depends on k) nothing is shared: the draft keeps a full k = 1 cache of its own.

Per_loop mode only: in last_loop mode a verification chunk sees its own tokens at loop i instead
of their last loop, so chunked verification is not the distribution that token-by-token k = K
decoding samples (the same reason chunked prefill changes last_loop results).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from elr_rl.model.cache import CachedCore, KVCache

DRAFT = "draft"  # cache-key prefix of the draft's own sublayers


@dataclass
class SpecStats:
    """What one `speculative_generate` call did."""

    drafted: int = 0  # draft tokens proposed
    accepted: int = 0  # draft tokens accepted
    rounds: int = 0  # verification forwards (one per round)
    emitted: list[int] = field(default_factory=list)  # tokens emitted per round

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / max(self.drafted, 1)


def accept_or_resample(
    p: torch.Tensor,  # [gamma + 1, V] target probabilities at the drafted positions (+ the bonus one)
    q: torch.Tensor,  # [gamma, V] draft probabilities the drafts were sampled from
    drafts: torch.Tensor,  # [gamma] drafted tokens
    generator: torch.Generator | None = None,
) -> tuple[int, int]:
    """(number of drafts accepted n, the token emitted after them): the rejection step above.

    Accept d_j with probability min(1, p_j(d_j) / q_j(d_j)); at the first rejection sample
    from norm(max(0, p_j - q_j)); if every draft is accepted, sample the bonus from p_{gamma+1}.
    """
    gamma = drafts.shape[0]
    idx = torch.arange(gamma)
    ratio = p[idx, drafts] / q[idx, drafts]  # q(d) > 0: d was sampled from q
    u = torch.rand(gamma, generator=generator, dtype=ratio.dtype)
    rejected = (u >= ratio).nonzero()
    if rejected.numel() == 0:
        return gamma, int(torch.multinomial(p[gamma], 1, generator=generator))
    n = int(rejected[0, 0])
    residual = (p[n] - q[n]).clamp_min(0)
    if float(residual.sum()) <= 0:  # p == q to rounding: then u >= ratio had probability ~0; fall back to p
        residual = p[n]
    return n, int(torch.multinomial(residual / residual.sum(), 1, generator=generator))


def _probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """Sampling distribution of float logits [..., V]; temperature 0 gives a one-hot argmax."""
    if temperature > 0:
        return torch.softmax(logits.float() / temperature, dim=-1)
    return torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()


class _Stages:
    """The backbone cut at loop boundaries: front (input block + loop 1), more loops, back (output block + head).

    The equations are those of `Backbone.forward` / `run_loops`:
    s~_i = inject(s_{i-1}, h_in), r_i = R(s~_i), s_i = update(s_{i-1}, r_i, s~_i).
    """

    def __init__(self, model) -> None:
        self.model, self.bb, self.spec = model, model.backbone, model.spec

    def front(self, ids: torch.Tensor, pos: torch.Tensor, core, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_in, s_1) of a chunk [1, T]."""
        h = self.bb.embeddings(ids)
        for layer in self.bb.layers[: self.spec.n_in]:
            h = layer(h, pos, core, 0)
        s0 = h if self.spec.initial_state == "input_copy" else torch.zeros_like(h)
        return h, self.loop(s0, h, 1, k, pos, core)

    def loop(self, s: torch.Tensor, h_in: torch.Tensor, i: int, k: int, pos: torch.Tensor, core) -> torch.Tensor:
        """s_i from s_{i-1}: loop i (1-based) of k."""
        n_in, n_rec = self.spec.n_in, self.spec.n_rec
        mods = self.bb._mods(i, k, range(0, n_rec))
        s_tilde = self.bb.update.inject(s, h_in)  # s~_i = s_{i-1} + h_in
        x = s_tilde
        for j, layer in enumerate(self.bb.layers[n_in : n_in + n_rec]):
            x = layer(x, pos, core, i - 1, mods[j])  # r_i = R(s~_i)
        return self.bb.update.update(s, x, s_tilde)  # s_i = Update(s_{i-1}, r_i, s~_i)

    def back(self, s: torch.Tensor, k: int, pos: torch.Tensor, core) -> torch.Tensor:
        """Float logits [1, T, V] from s_k."""
        s_ = self.spec
        mods = self.bb._mods(k, k, range(s_.n_rec, s_.n_rec + s_.n_out))
        h = s
        for j, layer in enumerate(self.bb.layers[s_.n_in + s_.n_rec :]):
            h = layer(h, pos, core, 0, mods[j])
        if self.bb.final_norm is not None:
            h = self.bb.final_norm(h)
        return self.model.lm_head(h)


class _DraftCore:
    """Routes the draft's own sublayers to their own cache entries (prefix DRAFT)."""

    def __init__(self, core: CachedCore) -> None:
        self.core = core

    def __call__(self, q, k, v, layer_id, loop_idx, window):
        return self.core(q, k, v, (DRAFT, layer_id), loop_idx, window)


class SelfSpeculativeDecoder:
    """Draft at k = 1, verify at k = K with one model's weights; batch size 1 (a latency technique)."""

    def __init__(self, model, k: int, gamma: int = 4, share_loop1: bool | None = None) -> None:
        if model.spec.kv_cache_mode != "per_loop":
            raise ValueError(
                "self-speculative decoding needs kv_cache_mode 'per_loop': in last_loop mode a verified chunk "
                "sees its own tokens at loop i, not their last loop, so it is not the k=K decoder's distribution")
        self.model, self.k, self.gamma = model, model._check_k(k), int(gamma)
        if self.gamma < 1:
            raise ValueError(f"gamma={gamma}: draft at least one token per round")
        if self.k < 2:
            raise ValueError(f"k={k}: self-speculation verifies at a deeper loop count than the k=1 draft; use k >= 2")
        can_share = not model.spec.loop_conditioning
        if share_loop1 and not can_share:
            raise ValueError("share_loop1=True needs a model without loop conditioning (c_i depends on k)")
        self.share = can_share if share_loop1 is None else bool(share_loop1)
        self.stages = _Stages(model)

    # ---------------------------------------------------------------- forwards
    def _positions(self, cache: KVCache, T: int, device) -> torch.Tensor:
        return torch.arange(cache.length, cache.length + T, device=device)[None]

    def _draft_front(self, ids: torch.Tensor, cache: KVCache) -> tuple[torch.Tensor, torch.Tensor]:
        """(h_in, s_1) of a chunk at cache.length: the shared entries, or the draft's own ones."""
        core = CachedCore(cache) if self.share else _DraftCore(CachedCore(cache))
        return self.stages.front(ids, self._positions(cache, ids.shape[1], ids.device), core, 1)

    def _draft_back(self, s1: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """Draft logits [1, T, V] from s_1 (the draft's output block has its own entries)."""
        pos = self._positions(cache, s1.shape[1], s1.device)
        return self.stages.back(s1, 1, pos, _DraftCore(CachedCore(cache)))

    def _target(self, ids: torch.Tensor, cache: KVCache, front: tuple | None) -> torch.Tensor:
        """Target logits [1, T, V] at k = K; starts from the draft's (h_in, s_1) when shared."""
        pos = self._positions(cache, ids.shape[1], ids.device)
        core = CachedCore(cache)
        h_in, s = front if front is not None else self.stages.front(ids, pos, core, self.k)
        for i in range(2, self.k + 1):
            s = self.stages.loop(s, h_in, i, self.k, pos, core)
        return self.stages.back(s, self.k, pos, core)

    def _prefill(self, prompt: torch.Tensor, cache: KVCache) -> None:
        """Draft and target entries for the prompt except its last token (fed by the first round)."""
        if prompt.shape[1] == 0:
            return
        front = self._draft_front(prompt, cache)
        self._draft_back(front[1], cache)
        self._target(prompt, cache, front if self.share else None)
        cache.advance(prompt.shape[1])

    def _draft(self, pending: int, gamma: int, cache: KVCache, temperature: float, generator):
        """gamma k=1 steps from the pending token: (drafts, q [gamma, V], fronts of pending + drafts).

        Leaves cache.length at the position of the last draft, whose front is computed (the
        verifier needs it when shared) but whose draft output block is not (needed only if accepted).
        """
        device = self.model.lm_head.weight.device
        tok, q, drafts, fronts = pending, [], [], []
        for _ in range(gamma):
            front = self._draft_front(torch.tensor([[tok]], device=device), cache)
            probs = _probs(self._draft_back(front[1], cache)[0, -1], temperature)
            cache.advance(1)
            tok = int(torch.multinomial(probs, 1, generator=generator))
            q.append(probs)
            drafts.append(tok)
            fronts.append(front)
        if self.share:
            fronts.append(self._draft_front(torch.tensor([[tok]], device=device), cache))
        return drafts, torch.stack(q), fronts

    # ---------------------------------------------------------------- decoding
    @torch.no_grad()
    def generate(
        self,
        prompt: list[int],
        max_new_tokens: int,
        temperature: float = 1.0,
        stop_token_ids: tuple[int, ...] | list[int] = (),
        generator: torch.Generator | None = None,
    ) -> tuple[list[int], SpecStats]:
        """(completion tokens, stats), sampled as plain k = K decoding would (greedy at temperature 0),
        ending at the first stop token or after max_new_tokens."""
        if not prompt:
            raise ValueError("speculative decoding needs a non-empty prompt")
        device = self.model.lm_head.weight.device
        cache = KVCache("per_loop")  # target and draft entries share one cache (draft keys prefixed)
        self._prefill(torch.tensor([prompt[:-1]], device=device), cache)
        pending, out, stats, stops = prompt[-1], [], SpecStats(), set(stop_token_ids)
        while len(out) < max_new_tokens:
            gamma = min(self.gamma, max_new_tokens - len(out))
            start = cache.length  # position of the pending token
            drafts, q, fronts = self._draft(pending, gamma, cache, temperature, generator)
            joined = tuple(torch.cat([f[j] for f in fronts], dim=1) for j in (0, 1)) if self.share else None
            cache.length = start  # the verifier writes the target's entries at the same positions
            chunk = torch.tensor([[pending, *drafts]], device=device)
            p = _probs(self._target(chunk, cache, joined)[0], temperature)  # [gamma + 1, V]
            # At temperature 0 p and q are one-hot: this accepts while the drafts are the target's argmax.
            n, nxt = accept_or_resample(p, q, torch.tensor(drafts), generator)
            if n == gamma:  # the last draft is committed: give the draft cache its entries too
                cache.length = start + gamma
                s1 = fronts[-1][1] if self.share else self._draft_front(chunk[:, -1:], cache)[1]
                self._draft_back(s1, cache)
            cache.length = start + n + 1  # the pending token and n accepted drafts are committed
            emitted = [*drafts[:n], nxt]
            stats.rounds += 1
            stats.drafted += gamma
            stats.accepted += n
            stats.emitted.append(len(emitted))
            for t in emitted:
                out.append(t)
                if t in stops or len(out) >= max_new_tokens:
                    return out, stats
            pending = nxt
        return out, stats
