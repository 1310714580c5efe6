"""The KL reference model sits where the policy does, in the policy's dtype (elr_rl/rl/learner.py)."""

from __future__ import annotations

import copy

import torch

from elr_rl.model import ElrConfig, LoopedForCausalLM
from elr_rl.rl.learner import place_like


def test_reference_takes_the_policys_dtype_and_keeps_its_float_buffers():
    torch.manual_seed(0)
    ref = LoopedForCausalLM(ElrConfig(hidden_size=64, intermediate_size=176, n_recurrent_layers=2)).eval()
    policy = copy.deepcopy(ref)
    for p in policy.parameters():  # as DeepSpeed's bf16 engine holds its module's weights
        p.data = p.data.to(torch.bfloat16)
    place_like(ref, policy, "cpu")
    assert all(p.dtype == torch.bfloat16 for p in ref.parameters())
    assert all(b.dtype == torch.float32 for name, b in ref.named_buffers() if "inv_freq" in name)
    ids = torch.randint(0, 256, (2, 12))
    with torch.no_grad():  # same weights, same dtype: the KL to the reference is 0 before the first update
        assert torch.equal(ref(ids, k=2), policy(ids, k=2))
