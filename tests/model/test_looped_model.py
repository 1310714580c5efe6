"""The looped model against its equations (tiny models, CPU, seconds)."""

from __future__ import annotations

import math

import pytest
import torch

from elr_rl.model import ElrConfig, LoopedForCausalLM
from elr_rl.model.loop import AdaptiveDeltaUpdate
from tests.model.reference import Ref

torch.set_num_threads(1)

VARIANTS = {
    "adaptive_delta": dict(),
    "replace": dict(update_rule="replace"),
    "residual": dict(update_rule="residual"),
    "delta": dict(update_rule="delta"),
    "ngpt": dict(backbone="ngpt", update_rule="ngpt", attention_output_gate=True),
    "conditioned_swa_gate": dict(
        loop_conditioning=True, attention_pattern="swa_interleave", swa_window_size=4,
        attention_output_gate=True, n_recurrent_layers=3,
    ),
}


def make(seed=0, **kw) -> LoopedForCausalLM:
    torch.manual_seed(seed)
    return LoopedForCausalLM(ElrConfig.tiny(**kw)).eval()


def test_adaptive_gate_starts_at_ln2_over_2_with_d2_plus_2d_params():
    d = 64
    rule = AdaptiveDeltaUpdate(d)
    assert sum(p.numel() for p in rule.parameters()) == d * d + 2 * d
    gate = rule.gate(torch.randn(3, 5, d))
    assert torch.allclose(gate, torch.full_like(gate, math.log(2) / 2))
    assert abs(math.log(2) / 2 - 0.3466) < 1e-4


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_forward_applies_L_in_plus_k_L_rec_plus_L_out_layers(k):
    model = make(n_input_layers=2, n_recurrent_layers=3, n_output_layers=1)
    calls = []
    for layer in model.backbone.layers:
        if hasattr(layer.mixer, "q_proj"):  # one attention sublayer per transformer block
            layer.register_forward_hook(lambda *a: calls.append(1))
    model(torch.randint(0, 256, (1, 6)), k=k)
    assert len(calls) == 2 + k * 3 + 1 == model.config.effective_depth(k)


def test_replace_rule_at_k1_is_a_plain_transformer():
    model = make(update_rule="replace", initial_state="zeros", n_input_layers=1, n_recurrent_layers=2, n_output_layers=1)
    ids = torch.randint(0, 256, (10,))
    ref = Ref(model)
    # The reference with k=1 and s_0 = 0 is literally: embed -> 4 pre-norm blocks -> norm -> head.
    got = model(ids[None], k=1)[0]
    assert torch.allclose(got, ref.forward(ids, 1), atol=1e-5)
    # and a plain transformer never re-runs a block: k=2 is different
    assert not torch.allclose(model(ids[None], k=2)[0], got, atol=1e-3)


@pytest.mark.parametrize("rule", ["adaptive_delta", "residual"])
def test_model_matches_reference_equations_at_every_k(rule):
    model = make(update_rule=rule, n_recurrent_layers=2)
    ids = torch.randint(0, 256, (9,))
    ref = Ref(model)
    for k in range(1, 5):
        assert torch.allclose(model(ids[None], k=k)[0], ref.forward(ids, k), atol=1e-4)


def test_loop_conditioning_at_zero_init_is_bit_identical():
    plain = make(seed=3)
    cond = LoopedForCausalLM(ElrConfig.tiny(loop_conditioning=True)).eval()
    missing, unexpected = cond.load_state_dict(plain.state_dict(), strict=False)
    assert not unexpected and all(".loop_cond." in m for m in missing)
    ids = torch.randint(0, 256, (2, 8))
    for k in range(1, 5):
        assert torch.equal(plain(ids, k=k), cond(ids, k=k))
    # perturbing a head changes the function: the conditioning is really wired in
    with torch.no_grad():
        cond.backbone.loop_cond.heads[0].bias.fill_(0.5)
    assert not torch.equal(plain(ids, k=2), cond(ids, k=2))
    cond.reset_loop_conditioning_()
    assert torch.equal(plain(ids, k=2), cond(ids, k=2))


@pytest.mark.parametrize("rule", ["adaptive_delta", "residual"])
def test_loop_conditioning_matches_reference_eq4_at_every_k(rule):
    from tests.rollout.helpers import randomize_

    model = randomize_(make(update_rule=rule, n_recurrent_layers=2, loop_conditioning=True), seed=5, scale=0.5)
    ids = torch.randint(0, 256, (9,))
    ref = Ref(model)
    for k in range(1, 5):
        assert torch.allclose(model(ids[None], k=k)[0], ref.forward(ids, k), atol=1e-4)


@pytest.mark.parametrize("head", ["heads", "gate_heads", "scale_heads"])
def test_each_eq4_term_is_wired_in_and_starts_at_zero(head):
    plain = make(seed=3)
    cond = LoopedForCausalLM(ElrConfig.tiny(loop_conditioning=True)).eval()
    cond.load_state_dict(plain.state_dict(), strict=False)
    ids = torch.randint(0, 256, (2, 8))
    with torch.no_grad():  # lambda/mu, the low-rank gate g, the output scale omega: each one alone
        getattr(cond.backbone.loop_cond, head)[1].bias.fill_(0.5)
    assert not torch.equal(plain(ids, k=2), cond(ids, k=2))
    cond.reset_loop_conditioning_()
    assert torch.equal(plain(ids, k=2), cond(ids, k=2))


def test_delta_with_a_zero_keeps_the_input_state():
    model = make(update_rule="delta")
    with torch.no_grad():
        model.backbone.update.a.zero_()
    ids = torch.randint(0, 256, (1, 7))
    states = []
    # the output block's first sublayer sees s_k: with a = 0 it is h_in (the input block's output)
    n_in, n_rec = model.spec.n_in, model.spec.n_rec
    model.backbone.layers[n_in - 1].register_forward_hook(lambda m, a, out: states.append(("h_in", out)))
    model.backbone.layers[n_in + n_rec].register_forward_pre_hook(lambda m, a: states.append(("s_k", a[0])))
    model(ids, k=3)
    (_, h_in), (_, s_k) = states
    assert torch.equal(h_in, s_k)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_per_loop_cached_generation_equals_full_recompute(variant, k):
    model = make(seed=k, **VARIANTS[variant])
    prompt = torch.randint(0, 256, (2, 6))
    gen = model.generate(prompt, 8, k=k, cache_mode="per_loop")
    out, lps = gen.tokens, gen.logprobs
    assert gen.new_tokens.shape == lps.shape == (2, 8) and not gen.finished.any()  # no stop ids: never finished
    seq = prompt
    for _ in range(8):  # greedy by full recompute
        seq = torch.cat([seq, model(seq, k=k)[:, -1].argmax(-1, keepdim=True)], 1)
    assert torch.equal(out, seq)
    assert torch.allclose(lps, model.token_logprobs(out, k=k)[:, 5:], atol=1e-5)


def test_generation_says_which_rows_stopped_and_pads_them_with_the_stop_id():
    model = make(seed=5)
    prompt = torch.randint(0, 256, (2, 6))
    free = model.generate(prompt, 5, k=2, cache_mode="per_loop")
    stop = int(free.new_tokens[0, 1])  # row 0 samples it second (greedy)
    gen = model.generate(prompt, 5, k=2, cache_mode="per_loop", eos_token_id=[stop, 999])
    assert bool(gen.finished[0]) and gen.new_tokens[0, 1:].tolist() == [stop] * (gen.new_tokens.shape[1] - 1)
    assert bool(gen.finished[1]) == (stop in free.new_tokens[1].tolist())
    assert gen.cache.length == gen.tokens.shape[1] - 1  # the last sampled token is never fed back


@pytest.mark.parametrize("variant", sorted(VARIANTS))
@pytest.mark.parametrize("mode", ["per_loop", "last_loop"])
@pytest.mark.parametrize("k", [1, 3])
def test_left_padded_batch_generates_each_row_as_it_would_alone(variant, mode, k):
    """Prompts of different lengths in one batch (left pads + attention_mask): every row's tokens and
    logprobs are those of the row generated by itself; without the mask the pads change them."""
    model = make(seed=20 + k, **{"n_recurrent_layers": 2, **VARIANTS[variant]})
    g = torch.Generator().manual_seed(k)
    prompts = [torch.randint(0, 256, (n,), generator=g) for n in (3, 9, 6)]
    width = max(len(p) for p in prompts)
    batch = torch.stack([torch.cat([torch.full((width - len(p),), 7), p]) for p in prompts])
    mask = torch.stack([torch.cat([torch.zeros(width - len(p)), torch.ones(len(p))]) for p in prompts]).long()
    gen = model.generate(batch, 6, k=k, cache_mode=mode, attention_mask=mask)
    for row, p in enumerate(prompts):
        alone = model.generate(p[None], 6, k=k, cache_mode=mode)
        assert torch.equal(gen.new_tokens[row], alone.new_tokens[0])
        assert torch.allclose(gen.logprobs[row], alone.logprobs[0], atol=1e-5)
    unmasked = model.generate(batch, 6, k=k, cache_mode=mode)
    assert not torch.allclose(unmasked.logprobs[0], gen.logprobs[0], atol=1e-3)  # row 0 has 6 pads


def test_generate_refuses_a_mask_that_is_not_left_padding():
    model = make(seed=1)
    ids = torch.randint(0, 256, (2, 4))
    with pytest.raises(ValueError, match="left padding"):
        model.generate(ids, 2, attention_mask=torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="at least one prompt token"):
        model.generate(ids, 2, attention_mask=torch.tensor([[0, 0, 0, 0], [1, 1, 1, 1]]))
    with pytest.raises(ValueError, match="one 0/1 entry per token"):
        model.generate(ids, 2, attention_mask=torch.ones(2, 3))


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_last_loop_generation_matches_reference_and_differs_from_recompute(k):
    model = make(seed=10 + k, n_recurrent_layers=2)
    prompt = torch.randint(0, 256, (1, 5))
    gen = model.generate(prompt, 10, k=k, cache_mode="last_loop")
    out, lps = gen.tokens, gen.logprobs
    ref_ids, ref_lps = Ref(model).generate(prompt[0].tolist(), 10, k, "last_loop")
    assert out[0].tolist() == ref_ids
    assert torch.allclose(lps[0], torch.tensor(ref_lps), atol=1e-4)
    teacher = model.token_logprobs(out, k=k)[0, 4:]
    gap = (lps[0] - teacher).abs().max().item()
    if k == 1:
        assert gap < 1e-5  # one loop: nothing is overwritten
    else:
        assert gap > 1e-3, "last_loop decoding must differ from the teacher-forced forward for k > 1"


@pytest.mark.parametrize("mode", ["per_loop", "last_loop"])
def test_decode_logprobs_scores_given_tokens_as_the_cached_sampler_does(mode):
    """decode_logprobs on generate's own tokens gives generate's logprobs (both cache modes)."""
    model = make(seed=3, n_recurrent_layers=2)
    prompt = torch.randint(0, 256, (1, 5))
    gen = model.generate(prompt, 9, k=3, cache_mode=mode)
    out, lps = gen.tokens, gen.logprobs
    scored = model.decode_logprobs(prompt[0].tolist(), out[0, 5:].tolist(), k=3, cache_mode=mode)
    assert torch.allclose(scored, lps[0], atol=1e-5)
    teacher = model.token_logprobs(out, k=3)[0, 4:]
    gap = (scored - teacher).abs().max().item()
    if mode == "per_loop":
        assert gap < 1e-5  # the per-loop cache reproduces teacher forcing
    else:
        assert gap > 1e-3  # last_loop at k = 3 is its own distribution


def test_kv_bytes_per_token_flat_in_last_loop_and_k_fold_in_per_loop():
    model = make(n_input_layers=1, n_recurrent_layers=2, n_output_layers=1)
    prompt = torch.randint(0, 256, (1, 6))
    per_tok = {}
    for mode in ("per_loop", "last_loop"):
        for k in (1, 4):
            per_tok[mode, k] = model.generate(prompt, 4, k=k, cache_mode=mode).cache.bytes_per_token()
    assert per_tok["last_loop", 1] == per_tok["last_loop", 4]
    # per token and attention sublayer: K and V of KV heads x head_dim floats
    unit = 2 * model.spec.num_kv_heads * model.spec.head_dim * 4
    assert per_tok["per_loop", 1] == per_tok["last_loop", 1] == unit * (1 + 2 + 1)
    assert per_tok["per_loop", 4] == unit * (1 + 4 * 2 + 1)  # the recurrent part grows k-fold


def test_truncated_backprop_drops_early_loop_gradients():
    ids = torch.randint(0, 256, (2, 8))
    full = make(seed=5, update_rule="residual")
    trunc = make(seed=5, update_rule="residual", truncated_backprop=1)
    assert torch.equal(full(ids, k=3), trunc(ids, k=3))  # same function, different gradients

    def rec_grad(model, k):
        model.zero_grad()
        model(ids, k=k).float().logsumexp(-1).mean().backward()
        return model.backbone.layers[model.spec.n_in].mixer.q_proj.weight.grad.clone()

    # truncated at n=1: the recurrent weights' gradient is what the last loop alone contributes.
    # Compute that independently: run loops 1..k-1 without grad by hand, then one tracked loop.
    g_trunc = rec_grad(trunc, 3)
    g_full = rec_grad(full, 3)
    assert not torch.allclose(g_trunc, g_full)
    detached = make(seed=5, update_rule="residual")
    bb = detached.backbone
    orig = bb.update.update
    calls = {"n": 0}

    def update_detaching(s_prev, r, s_tilde):
        calls["n"] += 1
        out = orig(s_prev, r, s_tilde)
        return out.detach() if calls["n"] % 3 != 0 else out  # loops 1, 2 of 3 carry no graph

    bb.update.update = update_detaching
    assert torch.allclose(g_trunc, rec_grad(detached, 3), atol=1e-6)


@pytest.mark.parametrize("variant", ["adaptive_delta", "ngpt", "conditioned_swa_gate"])
def test_save_load_round_trip(tmp_path, variant):
    model = make(seed=7, **VARIANTS[variant])
    model.save_pretrained(tmp_path)
    again = LoopedForCausalLM.from_pretrained(tmp_path).eval()
    ids = torch.randint(0, 256, (2, 9))
    for k in range(1, 5):
        assert torch.equal(model(ids, k=k), again(ids, k=k))


def test_ngpt_weights_live_on_the_unit_sphere():
    model = make(**VARIANTS["ngpt"])
    q = model.backbone.layers[0].mixer.q_proj.weight
    o = model.backbone.layers[0].mixer.o_proj.weight
    emb = model.backbone.embeddings.weight
    assert torch.allclose(q.norm(dim=1), torch.ones(q.shape[0]), atol=1e-3)
    assert torch.allclose(o.norm(dim=0), torch.ones(o.shape[1]), atol=1e-3)
    assert torch.allclose(emb.norm(dim=1), torch.ones(emb.shape[0]), atol=1e-3)
    with torch.no_grad():
        q.mul_(3.0)
    model.normalize_weights_()
    assert torch.allclose(q.norm(dim=1), torch.ones(q.shape[0]), atol=1e-3)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(num_loops=5, max_loops=4), "num_loops"),
        (dict(n_recurrent_layers=0), "n_recurrent_layers"),
        (dict(hidden_size=64, num_attention_heads=5), "num_attention_heads"),
        (dict(num_attention_heads=4, num_key_value_heads=3), "num_key_value_heads"),
        (dict(update_rule="lstm"), "update_rule"),
        (dict(kv_cache_mode="every_loop"), "kv_cache_mode"),
        (dict(max_loops=0, num_loops=0), "max_loops"),
    ],
)
def test_bad_config_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        ElrConfig(**kwargs)


def test_k_above_K_is_refused():
    model = make()
    with pytest.raises(ValueError, match="max_loops"):
        model(torch.randint(0, 256, (1, 4)), k=5)


def test_a_bf16_cast_keeps_the_rotary_frequencies_in_fp32():
    """model.to(bf16) (and DeepSpeed's older bf16 engine) cast every float buffer: RoPE's frequencies stay
    fp32, so angles at long positions do not drift (a bf16 frequency is off by up to 2^-9 of itself)."""
    from elr_rl.model.layers import Rotary

    model = LoopedForCausalLM(ElrConfig(hidden_size=64, intermediate_size=176, n_recurrent_layers=2))
    fp32 = [m.inv_freq.clone() for m in model.modules() if isinstance(m, Rotary)]
    model.to(torch.bfloat16)
    rotaries = [m for m in model.modules() if isinstance(m, Rotary)]
    assert rotaries and all(m.inv_freq.dtype == torch.float32 for m in rotaries)
    assert all(torch.equal(m.inv_freq, f) for m, f in zip(rotaries, fp32))
    assert all(p.dtype == torch.bfloat16 for p in model.parameters())  # the weights are cast as asked
