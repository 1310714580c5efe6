"""Shared pieces of the rollout tests: random checkpoints and the PyTorch reference logprobs."""

from __future__ import annotations

import torch

from elr_rl.model import LoopedForCausalLM

TOL = 1e-4  # max abs logprob difference allowed between vLLM and PyTorch (float32)


@torch.no_grad()
def randomize_(model: LoopedForCausalLM, seed: int, scale: float = 1.0) -> LoopedForCausalLM:
    """Random weights far from init, so logprobs vary by several nats and every parameter matters.

    At init the loop-conditioning heads and update gates are zero and nGPT scalars
    are uniform: a parity test on such weights would not see a wrong loop index.
    """
    g = torch.Generator().manual_seed(seed)

    def rand(p, mean, std):
        p.copy_(mean + std * torch.randn(p.shape, generator=g))

    std = model.spec.init_std
    for name, p in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        if p.dim() == 2:
            rand(p, 0.0, 0.15 * scale)
        elif leaf in ("attn_alpha", "mlp_alpha"):
            rand(p, 4 * std, std)  # nGPT step |alpha * 0.05/std| around 0.2
        elif leaf == "logit_scale":
            rand(p, 8 * std, std)  # logits = cos * ~8
        elif leaf in ("sqk", "s_gate"):
            rand(p, std, 0.2 * std)
        elif leaf in ("suv_gate", "suv_up"):
            rand(p, 1.0, 0.2)
        elif leaf in ("weight",) and "norm" in name:
            rand(p, 1.0, 0.2)
        else:  # biases and gates of update rules / conditioning
            rand(p, 0.0, 0.3)
    model.normalize_weights_()
    return model.eval()


@torch.no_grad()
def teacher_forced(model: LoopedForCausalLM, tokens: list[int], k: int) -> torch.Tensor:
    """log p(x_t | x_<t) for t = 1..T-1 from one full forward (the learner's logprobs)."""
    return model.token_logprobs(torch.tensor([tokens]), k=k)[0]


def cached_decode(model: LoopedForCausalLM, prompt: list[int], completion: list[int], k: int, mode: str):
    """Logprobs of `completion` when the PyTorch model decodes it token by token with its KV cache
    in cache mode `mode` (forced to vLLM's tokens)."""
    return model.decode_logprobs(prompt, completion, k=k, cache_mode=mode)


def max_diff(a, b) -> float:
    a, b = torch.as_tensor(a, dtype=torch.float32), torch.as_tensor(b, dtype=torch.float32)
    assert a.shape == b.shape, (a.shape, b.shape)
    return float((a - b).abs().max()) if a.numel() else 0.0


def sampled_vs_teacher_forced(model, groups, k: int) -> tuple[float, float]:
    """Max |vLLM - PyTorch teacher-forced| over (prompt logprobs, sampled-token logprobs) of all groups."""
    prompt_gap = sampled_gap = 0.0
    for g in groups:
        P = len(g.prompt_token_ids)
        for c in g.completions:
            ref = teacher_forced(model, g.prompt_token_ids + c.token_ids, k)
            if g.prompt_logprobs is not None:
                prompt_gap = max(prompt_gap, max_diff(g.prompt_logprobs, ref[: P - 1]))
            sampled_gap = max(sampled_gap, max_diff(c.logprobs, ref[P - 1 :]))
    return prompt_gap, sampled_gap
