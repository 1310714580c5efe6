"""The learner's packed rows (`samples.pack`) change the cost, not the objective: the whole GRPO loss
(clipped surrogate, truncated IS, KL to a reference, entropy, loop credit) and its gradients equal
those of the same samples each in a row of its own."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model import ElrConfig, LoopedForCausalLM
from elr_rl.rl.config import RLConfig
from elr_rl.rl.learner import make_loss_fn, model_inputs
from elr_rl.rl.samples import TrainSample, pack

torch.set_num_threads(1)


def _samples(k: int) -> list[TrainSample]:
    g = torch.Generator().manual_seed(k)
    out = []
    for group, (p, lengths) in enumerate([(7, [5, 1, 9]), (3, [4, 6])]):
        prompt = torch.randint(1, 250, (p,), generator=g).tolist()
        for i, n in enumerate(lengths):
            mask = [0] * p + [1] * n
            if i == 1 and n > 2:
                mask[-1] = 0  # environment text inside a response: not trained
            logp = [0.0] * p + (-torch.rand(n, generator=g) * 3).tolist()
            adv = float(torch.randn((), generator=g))
            out.append(TrainSample(prompt + torch.randint(1, 250, (n,), generator=g).tolist(), mask, logp, adv, k,
                                   prompt_len=p, group=group))
    out.append(TrainSample(torch.randint(1, 250, (6,), generator=g).tolist(), [0, 0, 1, 1, 1, 1],
                           [0.0, 0.0, -1.0, -0.5, -2.0, -0.1], 0.7, k))  # a sample with no group
    return out


def _rows(samples: list[TrainSample], denominator: float) -> dict[str, torch.Tensor]:
    """The samples right-padded, one per row (the layout without packing)."""
    T = max(len(s.ids) for s in samples)
    ids, mask, logp = (torch.zeros(len(samples), T, dtype=dt) for dt in (torch.long, torch.float32, torch.float32))
    for i, s in enumerate(samples):
        ids[i, : len(s.ids)] = torch.tensor(s.ids)
        mask[i, : len(s.ids)] = torch.tensor(s.loss_mask, dtype=torch.float32)
        logp[i, : len(s.ids)] = torch.tensor(s.rollout_logp)
    return {"input_ids": ids, "loss_mask": mask, "rollout_logp": logp,
            "advantages": torch.tensor([[s.advantage] for s in samples]), "global_denominator": torch.tensor(denominator)}


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_a_packed_batch_has_the_loss_and_gradients_of_one_row_per_sample(aggregation):
    torch.manual_seed(0)
    model = LoopedForCausalLM(ElrConfig.tiny())
    ref = LoopedForCausalLM(ElrConfig.tiny()).requires_grad_(False)  # another init: the KL term is non-zero
    cfg = RLConfig()
    cfg.algo.aggregation, cfg.algo.kl_coef, cfg.algo.entropy_coef, cfg.algo.loop_credit = aggregation, 0.1, 0.01, 0.3
    k = 3
    samples = _samples(k)
    trained = [sum(s.loss_mask[1:]) for s in samples]
    denominator = float(sum(trained)) if aggregation == "token" else float(sum(1 for t in trained if t))
    results = []
    step = {"k": k, "accum_steps": torch.tensor(2.0)}
    for mb in (pack(samples, denominator) | step, _rows(samples, denominator) | step):
        stats: list[dict] = []
        loss_fn = make_loss_fn(cfg, ref, stats)
        model.zero_grad()
        loss = loss_fn(model(mb["input_ids"], k=k, loop_readouts=True, **model_inputs(mb)), mb)
        loss.backward()
        grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
        results.append((loss.detach(), grads, stats[-1], mb["input_ids"].numel()))
    (packed, g_packed, s_packed, n_packed), (rows, g_rows, s_rows, n_rows) = results
    assert n_packed == sum(len(s.ids) for s in samples) - 7 * 2 - 3 * 1  # each prompt computed once
    assert n_rows == len(samples) * max(len(s.ids) for s in samples)
    torch.testing.assert_close(packed, rows, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(g_packed, g_rows, rtol=1e-4, atol=1e-6)
    for key in ("kl", "entropy", "loop_credit_loss", "is_weight_mean", "tokens"):
        assert s_packed[key] == pytest.approx(s_rows[key], rel=1e-5, abs=1e-7), key
    assert s_packed["kl"] > 0 and s_packed["tokens"] == sum(trained)
