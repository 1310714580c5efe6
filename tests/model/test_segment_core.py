"""Shared-prompt packing (`SegmentCore`): a completion packed after its group's one copy of the
prompt gets the logits, and the gradients, it gets in its own unpacked sequence."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model import DoryConfig, ElrConfig, LoopedForCausalLM
from elr_rl.model.cache import SegmentCore

torch.set_num_threads(1)

CONFIGS = {
    "elr": lambda: ElrConfig.tiny(),
    "elr_swa_conditioned": lambda: ElrConfig.tiny(loop_conditioning=True, attention_pattern="swa_interleave",
                                                  swa_window_size=5, attention_output_gate=True),
    "ngpt": lambda: ElrConfig.tiny(backbone="ngpt", update_rule="ngpt"),
    "dory": lambda: DoryConfig.tiny(swa_window_size=6),
}


def _pack(groups: list[tuple[list[int], list[list[int]]]]):
    """(prompt, completions) groups as one stream: ids, positions, segment and parent ids, and for each
    completion the stream indices whose logits predict its tokens."""
    ids, pos, seg, par, preds = [], [], [], [], []
    s = 0
    for prompt, completions in groups:
        p_seg, last = s, len(ids) + len(prompt) - 1
        ids += prompt
        pos += range(len(prompt))
        seg += [p_seg] * len(prompt)
        par += [-1] * len(prompt)
        for c in completions:
            s += 1
            start = len(ids)
            preds.append([last] + list(range(start, start + len(c) - 1)))
            ids += c
            pos += range(len(prompt), len(prompt) + len(c))
            seg += [s] * len(c)
            par += [p_seg] * len(c)
        s += 1
    t = lambda x: torch.tensor([x])  # noqa: E731
    return t(ids), t(pos), t(seg), t(par), preds


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("k", [1, 3])
def test_packed_completions_get_their_unpacked_logits_and_gradients(name, k):
    torch.manual_seed(0)
    model = LoopedForCausalLM(CONFIGS[name]())
    V = model.config.vocab_size
    g = torch.Generator().manual_seed(1)
    rnd = lambda n: torch.randint(1, V, (n,), generator=g).tolist()  # noqa: E731
    # two groups, prompts of 9 and 4 tokens (longer than the 5/6-token windows), completions of 1..11 tokens
    groups = [(rnd(9), [rnd(7), rnd(1), rnd(11)]), (rnd(4), [rnd(3), rnd(8)])]
    ids, pos, seg, par, preds = _pack(groups)
    weights = [torch.randn(len(c), generator=g) for _, cs in groups for c in cs]

    def loss_of(logits_per_completion):
        return sum((lp * w).sum() for lp, w in zip(logits_per_completion, weights))

    logits = model(ids, k=k, positions=pos, segment_ids=seg, parent_ids=par)[0]
    packed = []
    for (_, cs), c, pr in zip([(p, c) for p, cs in groups for c in cs], [c for _, cs in groups for c in cs], preds):
        packed.append(logits[pr].log_softmax(-1)[torch.arange(len(c)), torch.tensor(c)])
    loss_of(packed).backward()
    grads_packed = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()

    alone = []
    for prompt, cs in groups:
        for c in cs:
            full = model(torch.tensor([prompt + c]), k=k)[0]
            alone.append(full[len(prompt) - 1 : -1].log_softmax(-1)[torch.arange(len(c)), torch.tensor(c)])
    loss_of(alone).backward()
    for a, b in zip(packed, alone):
        torch.testing.assert_close(a, b, atol=2e-5, rtol=1e-5)
    assert grads_packed.keys() == {n for n, p in model.named_parameters() if p.grad is not None}
    for n, p in model.named_parameters():
        if p.grad is not None:
            torch.testing.assert_close(grads_packed[n], p.grad, atol=2e-5, rtol=1e-4, msg=n)


def test_a_sequence_without_parent_is_plain_causal_attention_and_bad_layouts_say_what_to_change():
    torch.manual_seed(0)
    model = LoopedForCausalLM(ElrConfig.tiny()).eval()
    a, b = torch.randint(1, 200, (1, 6)), torch.randint(1, 200, (1, 9))
    stream = torch.cat([a, b], 1)
    pos = torch.tensor([list(range(6)) + list(range(9))])
    seg = torch.tensor([[0] * 6 + [1] * 9])
    out = model(stream, k=2, positions=pos, segment_ids=seg, parent_ids=torch.full_like(seg, -1))
    with torch.no_grad():
        torch.testing.assert_close(out[0, :6], model(a, k=2)[0], atol=2e-5, rtol=1e-5)
        torch.testing.assert_close(out[0, 6:], model(b, k=2)[0], atol=2e-5, rtol=1e-5)
    p = torch.zeros(1, 4, dtype=torch.long)
    with pytest.raises(ValueError, match="not contiguous"):
        SegmentCore(p, torch.tensor([[0, 1, 0, 0]]), torch.tensor([[-1, -1, -1, -1]]))
    with pytest.raises(ValueError, match="not an earlier segment"):
        SegmentCore(p, torch.tensor([[0, 0, 1, 1]]), torch.tensor([[1, 1, -1, -1]]))
    with pytest.raises(ValueError, match="needs segment_ids"):
        model(stream, parent_ids=torch.full_like(seg, -1))


def test_rows_of_a_batch_keep_their_segments_apart():
    """Segment ids repeat across rows; a batch of two packed rows gives each row's own logits."""
    torch.manual_seed(0)
    model = LoopedForCausalLM(CONFIGS["elr_swa_conditioned"]()).eval()
    g = torch.Generator().manual_seed(2)
    rnd = lambda n: torch.randint(1, 200, (n,), generator=g).tolist()  # noqa: E731
    rows = [_pack([(rnd(6), [rnd(2), rnd(9)]), (rnd(3), [rnd(4)])]) for _ in range(2)]
    batch = [torch.cat([r[i] for r in rows]) for i in range(4)]
    with torch.no_grad():
        both = model(batch[0], k=2, positions=batch[1], segment_ids=batch[2], parent_ids=batch[3])
        for b, r in enumerate(rows):
            alone = model(r[0], k=2, positions=r[1], segment_ids=r[2], parent_ids=r[3])
            torch.testing.assert_close(both[b], alone[0], atol=2e-5, rtol=1e-5)
