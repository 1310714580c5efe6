"""The RL learner with two data-parallel DeepSpeed ranks (real Ray actors, gloo all-reduce).

Splitting a batch over ranks (by cost) and over one microbatch per loop count must not
change the update: one step with two ranks lands on the same weights as one step with
one rank on the same samples, and the ranks agree with each other.
"""

from __future__ import annotations

import random

import pytest
import torch
from safetensors.torch import load

from elr_rl.rl.cores import visible_cores
from elr_rl.rl.learner import LearnerGroup
from elr_rl.rl.messages import StepResult
from elr_rl.rl.samples import TrainSample, learner_batches
from tests.rl.helpers import make_config

pytestmark = pytest.mark.slow


def _samples(n: int, seed: int = 0) -> list[TrainSample]:
    """n samples at k = 1..4; samples 3j..3j+2 at one k share a prompt (a group the learner packs once)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        group, k = i // 3, 1 + (i // 3) % 4
        if i % 3 == 0:
            p_len = rng.randint(4, 12)
            prompt = [257] + [rng.randrange(256) for _ in range(p_len - 1)]
        response = rng.randint(3, 20)
        ids = prompt + [rng.randrange(256) for _ in range(response)]
        mask = [0] * p_len + [1] * response
        logp = [0.0] * p_len + [-rng.uniform(0.5, 3.0) for _ in range(response)]
        out.append(TrainSample(ids, mask, logp, advantage=rng.choice([-1.0, 1.0]) * rng.uniform(0.2, 1.5),
                               k=k, prompt_len=p_len, group=group))
    return out


def _step(cfg, samples, depth, budgets=(None,)) -> tuple[dict[str, torch.Tensor], list[StepResult], list[float]]:
    """One learner step per entry of `budgets` (max_tokens of the rows) on the same samples: the last
    step's weights and results, and the ranks' parameter checksums."""
    import ray

    group = LearnerGroup(cfg)
    try:
        for max_tokens in budgets:
            lb = learner_batches(samples, cfg.learner.world_size, depth, cfg.algo.aggregation,
                                 cfg.curriculum.loop_counts, max_tokens=max_tokens)
            results = ray.get(group.train_step(lb.microbatches, lb.ks, lr=1e-2))
        weights = load(ray.get(results[0].weights_ref[0]))  # rank 0 published the new weights
        checksums = ray.get([r.param_checksum.remote() for r in group.ranks])
    finally:
        group.shutdown()
    return weights, results, checksums


@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_two_ranks_make_the_same_update_as_one(toy_checkpoint, ray_cluster, tmp_path, aggregation):
    from elr_rl.model import LoopedForCausalLM

    depth = LoopedForCausalLM.from_pretrained(toy_checkpoint).spec.effective_depth
    samples = _samples(13)
    one, one_results, _ = _step(make_config(toy_checkpoint, tmp_path / "one", algo={"aggregation": aggregation}), samples, depth)
    two, results, checksums = _step(make_config(toy_checkpoint, tmp_path / "two", learner={"world_size": 2},
                                                algo={"aggregation": aggregation}), samples, depth)
    assert len(results) == 2 and all(len(r.losses) == 4 for r in results)  # one microbatch per k on each rank
    # the cost-balanced split gave both ranks real work
    assert all(sum(s["tokens"] for s in r.microbatch_stats) > 0 for r in results)
    assert checksums[0] == pytest.approx(checksums[1], rel=0, abs=1e-9)  # data-parallel ranks stay identical
    start = load((toy_checkpoint / "model.safetensors").read_bytes())
    moved = max((one[n] - start[n]).abs().max().item() for n in one)
    assert moved > 1e-3  # the step did change the weights
    # the same gradient, not just the same direction (Adam's first step would hide a uniform scale error)
    assert results[0].grad_norm == pytest.approx(one_results[0].grad_norm, rel=1e-5)
    worst = max((one[n] - two[n]).abs().max().item() for n in one)
    print(f"grad norm {one_results[0].grad_norm:.6g} vs {results[0].grad_norm:.6g}; max |w1 - w2| {worst:.3g}")
    # Adam moves every weight by about lr = 1e-2 on a first step; reduction-order noise stays far below
    assert worst < 5e-5, f"2-rank update differs from 1-rank update by {worst}"


@pytest.mark.parametrize("zero_stage", [0, 2])
def test_a_token_budget_splits_the_step_without_changing_the_update(toy_checkpoint, ray_cluster, tmp_path,
                                                                     zero_stage):
    """Rows of at most 30 tokens: groups cut in parts, more microbatches on one rank than the other (the
    other runs empty rows); then a step of 45-token rows, so DeepSpeed accumulates over a count that
    changes from step to step. Two steps land where one rank with one row per k lands."""
    from elr_rl.model import LoopedForCausalLM

    depth = LoopedForCausalLM.from_pretrained(toy_checkpoint).spec.effective_depth
    samples = _samples(13)
    configs = [make_config(toy_checkpoint, tmp_path / "one"),
               make_config(toy_checkpoint, tmp_path / "cut", learner={"world_size": 2})]
    for cfg in configs:
        cfg.learner.engine.zero_stage = zero_stage
    counts = [len(learner_batches(samples, 2, depth, "token", [1, 2, 3, 4], max_tokens=m).ks[0]) for m in (30, 45)]
    assert counts[0] != counts[1] and counts[0] % counts[1] and counts[1] % counts[0]  # no lucky realignment
    one, one_results, _ = _step(configs[0], samples, depth, budgets=(None, None))
    cut, results, checksums = _step(configs[1], samples, depth, budgets=(30, 45))
    assert len(one_results[0].losses) == 4
    assert all(len(r.losses) == counts[1] > 4 for r in results)  # more than one row per k
    assert checksums[0] == pytest.approx(checksums[1], rel=0, abs=1e-9)
    # fp32 sums in another order (rows cut, two ranks averaged): 1.3e-5 relative was seen on one toy
    # checkpoint; a lost or double-counted microbatch moves the norm by percents
    assert results[0].grad_norm == pytest.approx(one_results[0].grad_norm, rel=5e-5)
    worst = max((one[n] - cut[n]).abs().max().item() for n in one)
    assert worst < 5e-5, f"the update with 30-token rows differs from one row per k by {worst}"


@pytest.mark.skipif(len(visible_cores()) < 2, reason="the rank and the lent core need 2 cores")
def test_the_learner_runs_on_a_lent_core_only_while_it_is_free(toy_checkpoint, ray_cluster, tmp_path):
    """learner.borrow_idle_cores on a real rank: with a core lent on its node (what an idle rollout worker
    marks) the step runs on it too and makes the same update; while the lender holds the core, it does not."""
    import ray

    from elr_rl.model import LoopedForCausalLM
    from elr_rl.rl.cores import CoreLender, run_lend_dir

    cores = visible_cores()
    depth = LoopedForCausalLM.from_pretrained(toy_checkpoint).spec.effective_depth
    samples = _samples(13)
    own, own_results, _ = _step(make_config(toy_checkpoint, tmp_path / "own"), samples, depth)
    assert own_results[0].borrowed_core_s == 0.0  # lending off: nothing borrowed
    cfg = make_config(toy_checkpoint, tmp_path / "lent", learner={"borrow_idle_cores": True})
    lb = learner_batches(samples, 1, depth, cfg.algo.aggregation, cfg.curriculum.loop_counts)
    # the rank is pinned to the first core (layout offset 0); the test lends the second, as a worker would
    lender = CoreLender(run_lend_dir(cfg.run.output_dir), [cores[1]])
    group = LearnerGroup(cfg)
    try:
        (lent,) = ray.get(group.train_step(lb.microbatches, lb.ks, lr=1e-2))
        weights = load(ray.get(lent.weights_ref[0]))
        with lender:  # the core's owner is working: the next step stays on the rank's own core
            (held,) = ray.get(group.train_step(lb.microbatches, lb.ks, lr=1e-2))
    finally:
        group.shutdown()
        lender.close()
    print(f"borrowed {lent.borrowed_core_s:.3f} core-s of a {lent.compute_s:.3f} s step; then {held.borrowed_core_s}")
    assert lent.borrowed_core_s > 0.5 * lent.compute_s
    assert held.borrowed_core_s == 0.0
    assert lent.grad_norm == pytest.approx(own_results[0].grad_norm, rel=1e-5)
    worst = max((own[n] - weights[n]).abs().max().item() for n in own)
    assert worst < 5e-5, f"the update on two threads differs from one thread by {worst}"


@pytest.mark.skipif(len(visible_cores()) < 2, reason="the rank and the lent core need 2 cores")
def test_a_borrowing_learner_gives_a_core_back_within_a_sublayer(toy_checkpoint, tmp_path):
    """In a child process (affinity is per process): the worker takes its core back while the learner is
    in the middle of an MLP (after the gate projection): the learner is back on one thread before the up
    projection runs, in the forward and in the backward pass, not only at the next sublayer."""
    import json
    import subprocess
    import sys

    own, lent = sorted(visible_cores())[:2]
    code = f"""
import json, torch
from pathlib import Path
from elr_rl.model import LoopedForCausalLM
from elr_rl.model.layers import MLP
from elr_rl.rl.cores import CoreBorrower, CoreLender, apply_core_budget
from elr_rl.rl.learner import lending_checkpoints
apply_core_budget(1.0, {own})
model = LoopedForCausalLM.from_pretrained({str(toy_checkpoint)!r})
d = Path({str(tmp_path / 'lend')!r})
lender = CoreLender(d, [{lent}])  # idle: lent
b = CoreBorrower(d, ({own},))
b.install(model, lending_checkpoints())
mlp = next(m for m in model.modules() if isinstance(m, MLP))
seen, busy = [], []
def worker(start):  # the rollout worker starts (True) or ends (False) its engine call
    if start and not busy:
        lender.__enter__()
        busy.append(1)
    elif not start and busy:
        lender.__exit__(None, None, None)
        busy.clear()
def note(name):
    seen.append((name, torch.get_num_threads()))
mlp.gate_proj.register_forward_pre_hook(lambda *a: note("gate"))
mlp.gate_proj.register_forward_hook(lambda *a: worker(True))  # the worker starts work mid-sublayer
mlp.up_proj.register_forward_pre_hook(lambda *a: note("up"))
def down_grad(module, grad_output):
    note("down backward")
    worker(True)
mlp.down_proj.register_full_backward_pre_hook(down_grad)
mlp.gate_proj.register_full_backward_pre_hook(lambda *a: note("gate backward"))
ids = torch.randint(4, 60, (2, 12))
with b.borrowing():
    logits = model(ids)
    worker(False)  # idle again for the backward pass
    logits.float().sum().backward()
print(json.dumps(seen))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    first = {name: threads for name, threads in reversed(seen)}  # each hook's first call
    assert first["gate"] == 2  # borrowing while the core is lent
    assert first["up"] == 1  # given back before the next projection of the same sublayer
    assert first["down backward"] == 2 and first["gate backward"] == 1, seen
