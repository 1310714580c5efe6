"""Self-speculative decoding (k=1 drafts, k=K verifies) samples exactly plain k=K decoding."""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from elr_rl.model import ElrConfig, LoopedForCausalLM
from elr_rl.model.speculative import SelfSpeculativeDecoder, accept_or_resample

torch.set_num_threads(1)

V = 6  # a small vocabulary, so every completion can be counted
PROMPT = [1, 2, 3]


def chi2_upper(df: int, z: float = 3.09) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile (z = 3.09: p = 0.001)."""
    a = 2.0 / (9.0 * df)
    return df * (1 - a + z * math.sqrt(a)) ** 3


def chi2(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic with the cells of expected count < 5 pooled into one; (stat, df)."""
    expected = probs * counts.sum()
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum()[None]])
    exp = torch.cat([expected[big], expected[~big].sum()[None]])
    keep = exp > 0
    return float(((obs - exp)[keep] ** 2 / exp[keep]).sum()), int(keep.sum()) - 1


def make(conditioning: bool = False) -> LoopedForCausalLM:
    """A random tiny model whose k=1 and k=4 distributions differ clearly (large init)."""
    torch.manual_seed(0)
    cfg = ElrConfig.tiny(vocab_size=V, hidden_size=16, intermediate_size=32, num_attention_heads=2,
                         num_key_value_heads=1, init_std=0.3, update_rule="residual", loop_conditioning=conditioning,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    model = LoopedForCausalLM(cfg).eval()
    if conditioning:  # conditioning heads start at zero: give them weight so c_i really depends on k
        for head in model.backbone.loop_cond.heads:
            torch.nn.init.normal_(head.weight, 0.0, 0.3)
    return model


@pytest.fixture(scope="module")
def model() -> LoopedForCausalLM:
    return make()


def test_rejection_step_emits_the_target_distribution():
    """The accept/resample step alone, many times: first emitted token ~ p_1 (not q_1)."""
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([[0.5, 0.3, 0.1, 0.1], [0.1, 0.2, 0.3, 0.4]])
    q = torch.tensor([[0.1, 0.1, 0.4, 0.4]])
    counts = torch.zeros(4)
    second = torch.zeros(4)  # the bonus token, when the draft was accepted
    for _ in range(3000):
        d = torch.multinomial(q[0], 1, generator=g)
        n, nxt = accept_or_resample(p, q, d, g)
        counts[int(d) if n == 1 else nxt] += 1
        if n == 1:
            second[nxt] += 1
    stat, df = chi2(counts, p[0])
    assert stat < chi2_upper(df), (counts, stat)
    assert chi2(counts, q[0])[0] > 10 * chi2_upper(df)  # the draft's own distribution is rejected
    assert chi2(second, p[1])[0] < chi2_upper(3)


@pytest.mark.parametrize("conditioning", [False, True], ids=["shared_loop1", "separate_draft"])
@pytest.mark.parametrize("k", [2, 4])
def test_greedy_equals_plain_k_decoding(conditioning, k):
    model = make(conditioning)
    dec = SelfSpeculativeDecoder(model, k, gamma=3)
    assert dec.share is not conditioning  # loop-1 work is shared only when c_i does not depend on k
    plain = model.generate(torch.tensor([PROMPT]), 12, k=k, cache_mode="per_loop").new_tokens[0].tolist()
    spec, stats = dec.generate(PROMPT, 12, temperature=0.0)
    assert spec == plain
    assert stats.rounds < 12  # some drafts were accepted: rounds emit more than one token


@pytest.mark.slow
def test_sampled_completions_follow_plain_k4_decoding(model):
    """Counts of all V^2 two-token completions against their exact k=4 probabilities.

    gamma = 1 covers the three ways a token is emitted: an accepted draft, a resample after a
    rejection, and the bonus token after an accepted draft. The same counts must reject k=1's
    distribution (else the test could not tell the draft from the target)."""
    seqs = torch.tensor([PROMPT + list(t) for t in itertools.product(range(V), repeat=2)])
    with torch.no_grad():
        p4 = model.token_logprobs(seqs, k=4)[:, len(PROMPT) - 1 :].sum(-1).exp()
        p1 = model.token_logprobs(seqs, k=1)[:, len(PROMPT) - 1 :].sum(-1).exp()
    assert 0.5 * float((p4 - p1).abs().sum()) > 0.15  # the draft really differs from the target
    dec = SelfSpeculativeDecoder(model, 4, gamma=1)
    g = torch.Generator().manual_seed(1)
    counts, accepted, drafted = torch.zeros(V * V), 0, 0
    for _ in range(300):
        out, stats = dec.generate(PROMPT, 2, temperature=1.0, generator=g)
        counts[out[0] * V + out[1]] += 1
        accepted, drafted = accepted + stats.accepted, drafted + stats.drafted
    stat, df = chi2(counts, p4)
    assert stat < chi2_upper(df), (stat, df)
    assert chi2(counts, p1)[0] > chi2_upper(df)
    assert 0 < accepted < drafted  # both branches (accept, reject) were taken


def test_stop_tokens_and_length(model):
    out, _ = SelfSpeculativeDecoder(model, 4, gamma=4).generate(PROMPT, 7, temperature=1.0,
                                                                generator=torch.Generator().manual_seed(0))
    assert len(out) == 7
    first = out[0]
    out2, _ = SelfSpeculativeDecoder(model, 4, gamma=4).generate(
        PROMPT, 7, temperature=1.0, stop_token_ids=[first], generator=torch.Generator().manual_seed(0))
    assert out2 == [first]  # the same draw, cut at the stop token


def test_bad_settings_say_what_to_change(model):
    with pytest.raises(ValueError, match="k >= 2"):
        SelfSpeculativeDecoder(model, 1)
    with pytest.raises(ValueError, match="gamma"):
        SelfSpeculativeDecoder(model, 4, gamma=0)
    with pytest.raises(ValueError, match="loop conditioning"):
        SelfSpeculativeDecoder(make(conditioning=True), 4, share_loop1=True)
    last = LoopedForCausalLM(ElrConfig.tiny(kv_cache_mode="last_loop")).eval()
    with pytest.raises(ValueError, match="per_loop"):
        SelfSpeculativeDecoder(last, 4)
