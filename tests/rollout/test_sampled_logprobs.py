"""Reading each sampled token's logprob from vLLM's flat logprobs (the engine asks for them: no dict per token)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.logprobs import FlatLogprobs, Logprob  # noqa: E402

from elr_rl.rollout.engine import sampled_logprobs  # noqa: E402


def test_flat_and_dict_logprobs_give_the_sampled_tokens_values():
    positions = [{5: Logprob(-0.5, 1, None)}, {9: Logprob(-2.0, 3, None), 7: Logprob(-0.1, 1, None)},
                 {3: Logprob(-1.25, 2, None)}]
    flat = FlatLogprobs()
    for p in positions:
        flat.append(p)
    tokens = [5, 7, 3]  # the second position lists another token first
    assert sampled_logprobs(flat, tokens) == sampled_logprobs(positions, tokens) == [-0.5, -0.1, -1.25]
    with pytest.raises(ValueError):
        sampled_logprobs(flat, [5, 8, 3])  # a token the position does not hold is an error, not a wrong value
