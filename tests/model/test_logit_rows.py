"""`logit_rows`: the model computes logits only for the positions a loss needs, and they are the full
forward's values there (the sublayers after the output block's last attention, the final norm and the
head run on those rows alone), with the same gradients."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model import ElrConfig, LoopedForCausalLM
from elr_rl.model.config import DoryConfig

torch.set_num_threads(1)

CONFIGS = {
    "elr": lambda: ElrConfig.tiny(),
    "elr_no_output_block": lambda: ElrConfig.tiny(n_output_layers=0),
    "ngpt_conditioned": lambda: ElrConfig.tiny(backbone="ngpt", update_rule="ngpt", loop_conditioning=True),
    "dory_ends_in_mlp": lambda: DoryConfig.tiny(),  # S-S-S-*- : the last MLP runs on the rows alone
    "dory_ends_in_attention": lambda: DoryConfig.tiny(hybrid_layer_pattern="S-S-S-*-" * 2 + "S-S-S--*"),
    "dory_output_all_mlp": lambda: DoryConfig.tiny(hybrid_layer_pattern="S-S-S-*-" * 2 + "--------"),
}


def _packed(vocab: int):
    """Two groups with shared prompts and a lone sample in one row: positions, segments, parents."""
    g = torch.Generator().manual_seed(0)
    positions = [0, 1, 2, 3, 4, 5, 6, 3, 4, 5, 0, 1, 2, 3, 0, 1, 2, 3, 4]
    segments = [0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 3, 3, 3, 3, 4, 4, 4, 4, 4]
    parents = [-1, -1, -1, 0, 0, 0, 0, 0, 0, 0, -1, -1, -1, -1, -1, -1, -1, -1, -1]
    ids = torch.randint(1, vocab, (1, len(positions)), generator=g)
    as_row = lambda x: torch.tensor([x])  # noqa: E731
    return ids, dict(positions=as_row(positions), segment_ids=as_row(segments), parent_ids=as_row(parents))


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("readouts", [False, True])
def test_selected_rows_have_the_full_forwards_logits_and_gradients(name, readouts):
    torch.manual_seed(0)
    model = LoopedForCausalLM(CONFIGS[name]())
    ids, extra = _packed(model.config.vocab_size)
    rows = torch.tensor([2, 3, 5, 9, 13, 17, 18, 5])  # any order, a repeat: the caller's
    k = 3
    w = torch.randn(len(rows), model.config.vocab_size)

    def run(**kw):
        model.zero_grad()
        out = model(ids, k=k, loop_readouts=readouts, **extra, **kw)
        outs = out if readouts else [out]
        picked = [o if kw else o.reshape(-1, o.shape[-1])[rows].unsqueeze(0) for o in outs]
        sum((p[0] * w).sum() for p in picked).backward()
        return picked, torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])

    full, g_full = run()
    sel, g_sel = run(logit_rows=rows)
    assert all(s.shape == (1, len(rows), model.config.vocab_size) for s in sel)
    for a, b in zip(sel, full):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert float((g_sel - g_full).norm() / g_full.norm()) < 1e-5  # float32 summation order only


@pytest.mark.parametrize("rows", [torch.tensor([], dtype=torch.long), torch.tensor([0, 19]), torch.tensor([-1])])
def test_logit_rows_outside_the_input_are_refused(rows):
    model = LoopedForCausalLM(ElrConfig.tiny())
    ids, extra = _packed(model.config.vocab_size)
    with pytest.raises(ValueError, match="logit_rows must be one or more indices into the 19 positions"):
        model(ids, k=2, logit_rows=rows, **extra)


@pytest.mark.parametrize("name", ["elr", "dory_ends_in_attention", "ngpt_conditioned"])
def test_rows_of_a_padded_batch_index_its_flattened_positions(name):
    """A [B, T] batch of packed documents (the pretraining and SFT layout, dense attention within each
    segment): rows index the flattened B * T positions, across rows of the batch."""
    torch.manual_seed(0)
    model = LoopedForCausalLM(CONFIGS[name]())
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, model.config.vocab_size, (3, 8), generator=g)
    segments = torch.tensor([[0] * 5 + [1] * 3, [0] * 8, [0] * 2 + [1] * 6])
    positions = torch.tensor([[0, 1, 2, 3, 4, 0, 1, 2], list(range(8)), [0, 1, 0, 1, 2, 3, 4, 5]])
    rows = torch.tensor([4, 6, 7, 8, 15, 17, 23])
    model.zero_grad()
    full = model(ids, k=2, positions=positions, segment_ids=segments)
    full.reshape(-1, full.shape[-1])[rows].square().sum().backward()
    g_full = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    model.zero_grad()
    sel = model(ids, k=2, positions=positions, segment_ids=segments, logit_rows=rows)
    sel.square().sum().backward()
    g_sel = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    assert sel.shape == (1, len(rows), model.config.vocab_size)
    torch.testing.assert_close(sel[0], full.reshape(-1, full.shape[-1])[rows], rtol=1e-5, atol=1e-5)
    assert float((g_sel - g_full).norm() / g_full.norm()) < 1e-5
