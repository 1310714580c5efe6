"""Activation checkpointing (Backbone.checkpoint_sublayers): the same gradients, far fewer saved activations."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model import ElrConfig, LoopedForCausalLM


def _saved_bytes_and_grads(model, ids, k):
    saved = []

    def pack(t):
        saved.append(t.numel() * t.element_size())
        return t

    model.zero_grad()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(ids, k=k)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1).float(), ids[:, 1:].flatten())
    loss.backward()
    return sum(saved), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("k", [1, 3])
def test_checkpointed_sublayers_give_the_same_gradients_and_save_less(k):
    torch.manual_seed(0)
    cfg = ElrConfig(vocab_size=64, hidden_size=64, intermediate_size=176, num_attention_heads=4, num_key_value_heads=2,
                    n_input_layers=1, n_recurrent_layers=2, n_output_layers=1, max_loops=3, num_loops=3,
                    loop_conditioning=True)
    model = LoopedForCausalLM(cfg).train()
    ids = torch.randint(0, 64, (2, 24))
    plain_bytes, plain = _saved_bytes_and_grads(model, ids, k)
    model.backbone.checkpoint_sublayers = True
    ckpt_bytes, ckpt = _saved_bytes_and_grads(model, ids, k)
    assert plain.keys() == ckpt.keys() and len(plain) == len(list(model.parameters()))
    for name, g in plain.items():
        torch.testing.assert_close(ckpt[name], g, rtol=1e-5, atol=1e-7, msg=name)
    assert ckpt_bytes < 0.5 * plain_bytes, (ckpt_bytes, plain_bytes)
    with torch.no_grad():  # without gradients nothing is checkpointed: the plain forward
        on = model(ids, k=k)
        model.backbone.checkpoint_sublayers = False
        assert torch.equal(on, model(ids, k=k))
