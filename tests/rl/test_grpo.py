"""GRPO's pure functions on hand-computed tensors."""

import math

import pytest
import torch

from elr_rl.rl import grpo


def test_group_advantages_with_and_without_std():
    r = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    a = grpo.group_advantages(r, std_normalize=False)
    assert torch.allclose(a, torch.tensor([[0.5, -0.5, -0.5, 0.5], [0.25, 0.25, 0.25, -0.75]]))
    a = grpo.group_advantages(r, std_normalize=True, eps=0.0)
    # group 2: mean .75, population std sqrt(3)/4
    s = math.sqrt(3) / 4
    assert torch.allclose(a, torch.tensor([[1.0, -1.0, -1.0, 1.0], [0.25 / s, 0.25 / s, 0.25 / s, -0.75 / s]]))
    same = grpo.group_advantages(torch.ones(1, 4))
    assert torch.equal(same, torch.zeros(1, 4))  # no signal, no NaN


def test_informative_groups():
    r = torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]])
    assert grpo.informative_groups(r).tolist() == [False, True, False]


def test_clipping_on_both_sides():
    old = torch.zeros(1, 4)
    logp = torch.log(torch.tensor([[0.5, 1.1, 1.5, 2.0]]))  # ratios 0.5, 1.1, 1.5, 2.0
    pos = torch.ones(1, 1)
    loss, clipped = grpo.clipped_surrogate(logp, old, pos, clip_low=0.2, clip_high=0.28)
    # A > 0: min(rho, clip(rho)) -> 0.5 (unclipped below), 1.1, 1.28, 1.28
    assert torch.allclose(loss, -torch.tensor([[0.5, 1.1, 1.28, 1.28]]))
    assert clipped.tolist() == [[False, False, True, True]]
    loss, clipped = grpo.clipped_surrogate(logp, old, -pos, clip_low=0.2, clip_high=0.28)
    # A < 0: min(-rho, -clip(rho)) -> -0.8 (clipped at 1-0.2), -1.1, -1.5, -2.0
    assert torch.allclose(loss, torch.tensor([[0.8, 1.1, 1.5, 2.0]]))
    assert clipped.tolist() == [[True, False, False, False]]


def test_clipped_tokens_carry_no_gradient():
    logp = torch.log(torch.tensor([[1.5, 1.0]])).requires_grad_()
    loss, _ = grpo.clipped_surrogate(logp, torch.zeros(1, 2), torch.ones(1, 1), 0.2, 0.2)
    loss.sum().backward()
    assert logp.grad[0, 0] == 0 and logp.grad[0, 1] != 0


def test_aggregation_modes():
    per_tok = torch.tensor([[1.0, 1.0, 1.0, 1.0], [4.0, 0.0, 0.0, 0.0]])
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    assert grpo.aggregate(per_tok, mask, "token").item() == pytest.approx(8 / 5)
    assert grpo.aggregate(per_tok, mask, "sequence").item() == pytest.approx((1 + 4) / 2)
    with pytest.raises(ValueError, match="aggregation"):
        grpo.aggregate(per_tok, mask, "group")


def test_truncated_importance_weights():
    learner = torch.tensor([0.0, 0.0, 0.0, 50.0])
    rollout = torch.tensor([0.0, math.log(2.0), -math.log(1.5), -50.0])
    w = grpo.truncated_is_weights(learner, rollout, cap=2.0, log_clamp=20.0)
    assert torch.allclose(w, torch.tensor([1.0, 0.5, 1.5, 2.0]))
    assert torch.isfinite(grpo.truncated_is_weights(torch.tensor([1e4]), torch.tensor([-1e4]), cap=1e30)).all()


def test_kl_k3_is_zero_at_equality_and_positive_elsewhere():
    lp = torch.tensor([-1.0, -2.0])
    assert torch.equal(grpo.kl_k3(lp, lp), torch.zeros(2))
    assert (grpo.kl_k3(lp, lp + torch.tensor([0.3, -0.3])) > 0).all()
    # hand value: d = 0.5 -> e^0.5 - 0.5 - 1
    assert grpo.kl_k3(torch.tensor([0.0]), torch.tensor([0.5])).item() == pytest.approx(math.exp(0.5) - 1.5)


def test_entropy_uniform():
    assert grpo.entropy_from_logits(torch.zeros(2, 8)).allclose(torch.full((2,), math.log(8)))
    # logged only (no autograd): computed a few positions at a time, same values, any shape
    logits = torch.randn(2, 7, 11) * 3
    whole = grpo.entropy_from_logits(logits.requires_grad_())
    assert whole.requires_grad and whole.shape == (2, 7)
    with torch.no_grad():
        torch.testing.assert_close(grpo.entropy_from_logits(logits, chunk=3), whole.detach())
        assert grpo.entropy_from_logits(torch.zeros(0, 5, 11)).shape == (0, 5)


def test_grpo_loss_on_policy_equals_minus_mean_advantage():
    logp = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]])
    adv = torch.tensor([[1.0], [-0.5]])
    mask = torch.ones(2, 2)
    loss, stats = grpo.grpo_loss(logp, logp, logp, adv, mask)
    assert loss.item() == pytest.approx(-(1.0 * 2 - 0.5 * 2) / 4)
    assert stats["clip_frac"] == 0.0 and stats["ratio_mean"] == 1.0 and stats["is_weight_mean"] == 1.0


def test_split_batches_add_up_to_the_whole_with_a_global_denominator():
    torch.manual_seed(0)
    per_tok = torch.randn(6, 5)
    mask = (torch.rand(6, 5) > 0.3).int()
    mask[:, 0] = 1
    for mode in ("token", "sequence"):
        whole = grpo.aggregate(per_tok, mask, mode)
        n = mask.sum() if mode == "token" else 6
        parts = grpo.aggregate(per_tok[:2], mask[:2], mode, n) + grpo.aggregate(per_tok[2:], mask[2:], mode, n)
        assert torch.allclose(whole, parts)
        # two accumulation steps on each of two ranks: DeepSpeed divides by 2 and averages over 2
        engine = [grpo.aggregate(per_tok[i:i + 2], mask[i:i + 2], mode, n, engine_divisor=4) / 2 for i in (0, 2, 4)]
        assert torch.allclose(whole, sum(engine) / 2)
