"""GRPO as small pure functions on tensors.

Shapes: per-token tensors are [B, T] over response tokens, with `mask` [B, T]
(1 for tokens the policy produced, 0 for padding and environment text). In the
learner's packed rows several sequences share a row: `sequence_ids` [B, T] says
which, and `pred_index` [B, T] which position's logits predict each token.
"""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, std_normalize: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """A_i = (r_i - mean_g(r)) / (std_g(r) + eps); without std normalisation (Dr. GRPO) A_i = r_i - mean_g(r).

    `rewards` is [num_groups, G]; the result has the same shape.
    """
    centred = rewards - rewards.mean(dim=-1, keepdim=True)
    if not std_normalize:
        return centred
    return centred / (rewards.std(dim=-1, keepdim=True, unbiased=False) + eps)


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """Dynamic sampling: a group whose rewards are all equal has zero advantage and carries no signal."""
    return (rewards.max(dim=-1).values - rewards.min(dim=-1).values) > 0


def _predictor_rows(pred_index: torch.Tensor | None, B: int, T: int, device: torch.device) -> torch.Tensor:
    """Flat [B * T] indices into a [B * T, ...] view: the row position whose logits predict each token
    (`pred_index`, or t - 1: one sequence per row, position 0 mapped to itself and left to the mask)."""
    if pred_index is None:
        pred_index = (torch.arange(T, device=device) - 1).clamp_min(0).expand(B, T)
    return (pred_index + torch.arange(B, device=device)[:, None] * T).reshape(-1)


def at_predictors(per_position: torch.Tensor, pred_index: torch.Tensor | None = None) -> torch.Tensor:
    """A per-position quantity of the logits [B, T] (an entropy), taken where each token is predicted.
    Logits of selected positions only ([1, N], `logit_rows`): `pred_index` indexes those N, and the
    result has pred_index's shape."""
    B, T = per_position.shape
    out = per_position.reshape(-1)[_predictor_rows(pred_index, B, T, per_position.device)]
    return out.reshape(pred_index.shape if pred_index is not None else (B, T))


def token_logprobs(logits: torch.Tensor, input_ids: torch.Tensor, pred_index: torch.Tensor | None = None
                   ) -> torch.Tensor:
    """log pi(x_t | context) for every position t: [B, T].

    The logits at row position `pred_index[b, t]` predict token t (default t - 1: one sequence per
    row; position 0 then gets a meaningless value and must be masked). Logits of selected positions
    only ([1, N, V], the model's `logit_rows`): `pred_index` then indexes those N rows. Uses
    logsumexp on the logits rather than a [B, T, V] log_softmax; the result has input_ids' shape.
    """
    B, T, V = logits.shape
    rows = _predictor_rows(pred_index, B, T, logits.device)
    flat = logits.reshape(B * T, V)
    picked = flat[rows, input_ids.reshape(-1)]
    return (picked - flat.logsumexp(-1)[rows]).reshape(input_ids.shape)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token", global_denominator: float | None = None,
    engine_divisor: float = 1.0, sequence_ids: torch.Tensor | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss.

    token:    sum_{i,t} l_it m_it / sum_{i,t} m_it  (every token weighs the same; DAPO)
    sequence: mean_i [ sum_t l_it m_it / sum_t m_it ]  (every sequence weighs the same; GRPO)

    A batch split over microbatches and ranks: `global_denominator` is the whole batch's
    count (its trained tokens for "token", its sequences with a trained token for "sequence"),
    so each piece's share sum_piece(...) / global_denominator adds up to the whole batch's
    loss. DeepSpeed then divides each microbatch's loss by its gradient-accumulation steps
    before backward and averages gradients over the data-parallel ranks: a piece returns
    its share times `engine_divisor` = accumulation steps x ranks, which undoes both, so the
    optimizer sees the gradient of the whole batch's loss.

    The sequences are the rows, or with `sequence_ids` [B, T] (packed rows) the ids' groups of
    tokens (untrained tokens may carry any id >= -1).
    """
    mask = mask.to(per_token.dtype)
    if mode == "token":
        denom = mask.sum().clamp_min(1.0) if global_denominator is None else global_denominator
        return (per_token * mask).sum() / denom * engine_divisor
    if mode == "sequence":
        if sequence_ids is None:
            num, count = (per_token * mask).sum(-1), mask.sum(-1)
        else:
            ids = sequence_ids.reshape(-1).clamp_min(0)
            n = int(ids.max()) + 1 if ids.numel() else 1
            num = per_token.new_zeros(n).index_add(0, ids, (per_token * mask).reshape(-1))
            count = mask.new_zeros(n).index_add(0, ids, mask.reshape(-1))
        per_seq = num / count.clamp_min(1.0)
        denom = (count > 0).sum().clamp_min(1) if global_denominator is None else global_denominator
        return per_seq.sum() / denom * engine_divisor
    raise ValueError(f"loss aggregation must be 'token' or 'sequence', got {mode!r}")


def clipped_surrogate(
    logp: torch.Tensor, old_logp: torch.Tensor, advantages: torch.Tensor, clip_low: float, clip_high: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token PPO loss with separate clip ranges (clip-higher):

        rho = exp(logp - old_logp)
        l   = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A)

    `advantages` broadcasts over tokens ([B, 1] or [B, T]). Returns (loss [B, T], clipped [B, T] bool).
    """
    ratio = torch.exp(logp - old_logp)
    unclipped = ratio * advantages
    clipped = ratio.clamp(1.0 - clip_low, 1.0 + clip_high) * advantages
    loss = -torch.minimum(unclipped, clipped)
    return loss, clipped < unclipped


def truncated_is_weights(
    learner_logp: torch.Tensor, rollout_logp: torch.Tensor, cap: float = 2.0, log_clamp: float = 20.0
) -> torch.Tensor:
    """Off-policy correction for stale or last_loop-cache rollouts (truncated importance sampling):

        w = min(exp(clamp(logp_learner - logp_rollout, -c, c)), cap)     (no gradient)

    The log-ratio is clamped before exp so a wild mismatch cannot overflow.
    """
    log_ratio = (learner_logp - rollout_logp).detach().clamp(-log_clamp, log_clamp)
    return torch.exp(log_ratio).clamp(max=cap)


def kl_k3(logp: torch.Tensor, ref_logp: torch.Tensor) -> torch.Tensor:
    """Schulman's k3 estimator of KL(pi || ref): exp(ref - logp) - (ref - logp) - 1 >= 0."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def entropy_from_logits(logits: torch.Tensor, chunk: int = 1024) -> torch.Tensor:
    """H = -sum_v p_v log p_v per position.

    Without autograd (entropy only logged) it runs `chunk` positions at a time: its temporaries are
    then [chunk, V], not three more [positions, V] tensors (4.3 GB each for 8,192 positions at a
    131,072-token vocabulary in fp32)."""
    def entropy(x: torch.Tensor) -> torch.Tensor:
        logp = x.float().log_softmax(-1)
        return -(logp.exp() * logp).sum(-1)

    if torch.is_grad_enabled() and logits.requires_grad:
        return entropy(logits)
    flat = logits.reshape(-1, logits.shape[-1])
    parts = [entropy(flat[i : i + chunk]) for i in range(0, flat.shape[0], chunk)]
    out = torch.cat(parts) if parts else flat.new_zeros(0, dtype=torch.float32)
    return out.reshape(logits.shape[:-1])


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    rollout_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    aggregation: str = "token",
    tis_cap: float | None = 2.0,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | None = None,
    entropy_coef: float = 0.0,
    global_denominator: float | None = None,
    engine_divisor: float = 1.0,
    sequence_ids: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The whole per-batch objective: TIS-weighted clipped surrogate + kl_coef * k3 - entropy_coef * H,
    aggregated over tokens or sequences (`aggregate`: the batch's `global_denominator` and DeepSpeed's
    `engine_divisor`)."""
    per_token, clipped = clipped_surrogate(logp, old_logp, advantages, clip_low, clip_high)
    stats: dict[str, float] = {}
    m = mask.bool()
    if tis_cap is not None:
        w = truncated_is_weights(old_logp, rollout_logp, cap=tis_cap)
        per_token = per_token * w
        stats["is_weight_mean"] = float(w[m].mean()) if m.any() else 1.0
    if ref_logp is not None and kl_coef > 0:
        kl = kl_k3(logp, ref_logp)
        per_token = per_token + kl_coef * kl
        stats["kl"] = float(kl.detach()[m].mean()) if m.any() else 0.0
    if entropy is not None:
        if entropy_coef:
            per_token = per_token - entropy_coef * entropy
        stats["entropy"] = float(entropy.detach()[m].mean()) if m.any() else 0.0
    loss = aggregate(per_token, mask, aggregation, global_denominator, engine_divisor, sequence_ids)
    if m.any():
        stats["clip_frac"] = float(clipped[m].float().mean())
        stats["ratio_mean"] = float(torch.exp(logp - old_logp).detach()[m].mean())
    return loss, stats
