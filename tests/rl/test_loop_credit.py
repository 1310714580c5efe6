"""algo.loop_credit: the shallower loops' readouts share the sampled tokens' policy gradient (RLTT-style)."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model import ElrConfig, LoopedForCausalLM
from elr_rl.rl.config import RLConfig
from elr_rl.rl.learner import make_loss_fn


def _batch(k: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, 250, (3, 12), generator=g)
    mask = torch.zeros(3, 12)
    mask[:, 5:] = 1.0
    mask[2, 9:] = 0.0  # a shorter response
    return {"input_ids": ids, "loss_mask": mask, "rollout_logp": -torch.rand(3, 12, generator=g) * 3,
            "advantages": torch.tensor([[1.0], [-0.5], [0.25]]), "global_denominator": torch.tensor(float(mask[:, 1:].sum())),
            "k": k, "accum_steps": torch.tensor(3.0)}  # the step's microbatches, which the loss multiplies back


def _grads(model, loss):
    model.zero_grad()
    loss.backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_loop_credit_adds_each_shallow_readouts_advantage_weighted_logprob(aggregation):
    torch.manual_seed(0)
    model = LoopedForCausalLM(ElrConfig.tiny())
    k, weight = 3, 0.5
    batch = _batch(k)
    cfg = RLConfig()
    cfg.algo.aggregation = aggregation
    plain_fn = make_loss_fn(cfg, None, [])
    assert not plain_fn.loop_readouts  # off by default: the engine passes the final readout only
    cfg.algo.loop_credit = weight
    stats: list[dict] = []
    credit_fn = make_loss_fn(cfg, None, stats)
    assert credit_fn.loop_readouts

    readouts = model(batch["input_ids"], k=k, loop_readouts=True)
    got = _grads(model, credit_fn(readouts, batch))

    # independently: the plain GRPO loss at k plus weight x mean over loops 1..k-1 of -A * w * log pi_i,
    # w = min(pi_k / pi_rollout, 2) (no gradient), reduced over tokens as the aggregation says
    readouts = model(batch["input_ids"], k=k, loop_readouts=True)
    ids, mask = batch["input_ids"], batch["loss_mask"][:, 1:]
    logps = [z[:, :-1].log_softmax(-1).gather(-1, ids[:, 1:, None]).squeeze(-1) for z in readouts]
    w = torch.exp(logps[-1].detach() - batch["rollout_logp"][:, 1:]).clamp(max=2.0)
    div = float(batch["accum_steps"])
    terms = []
    for lp in logps[:-1]:
        per_token = -batch["advantages"] * lp * w * mask
        if aggregation == "token":
            terms.append(per_token.sum() / mask.sum() * div)
        else:
            terms.append((per_token.sum(-1) / mask.sum(-1)).sum() / float(batch["global_denominator"]) * div)
    want = _grads(model, plain_fn(readouts[-1], batch) + weight * sum(terms) / len(terms))
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-6)
    assert stats[-1]["loop_credit_loss"] != 0.0

    # a sample drawn at k = 1 has no shallower loop: the term is the plain loss
    batch1 = _batch(1, seed=1)
    z = model(batch1["input_ids"], k=1, loop_readouts=True)
    torch.testing.assert_close(credit_fn(z, batch1), plain_fn(z[-1], batch1))


def test_loop_credit_makes_the_engine_pass_every_loops_readout(tmp_path):
    """TrainEngine.train_step runs one k-loop pass with readouts when the loss function asks for them."""
    from elr_rl.train.config import TrainConfig
    from elr_rl.train.engine import TrainEngine

    torch.manual_seed(0)
    model = LoopedForCausalLM(ElrConfig.tiny())
    cfg = TrainConfig()
    cfg.engine.accelerator, cfg.engine.zero_stage, cfg.engine.grad_accum_steps = "cpu", 0, 1
    engine = TrainEngine(model.config, cfg, 0, 1, model=model)
    seen = []

    def loss_fn(logits, batch):
        seen.append(len(logits) if isinstance(logits, list) else 0)
        return (logits[-1] if isinstance(logits, list) else logits).float().pow(2).mean()

    batch = _batch(3)
    engine.train_step([batch], [3], 1e-3, loss_fn=loss_fn)
    loss_fn.loop_readouts = True
    engine.train_step([batch], [3], 1e-3, loss_fn=loss_fn)
    assert seen == [0, 3]


def test_loop_credit_must_not_be_negative():
    cfg = RLConfig()
    cfg.algo.loop_credit = -0.1
    with pytest.raises(ValueError, match="algo.loop_credit"):
        cfg.algo.validate()
