"""Mixed-depth loop sampling: the p1 / k_bar formulas, rotation of forced ranks, delayed switch."""

from __future__ import annotations

import math
import os

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from elr_rl.train.config import LoopConfig
from elr_rl.train.sampler import LoopSampler, expected_k_bar, expected_p1, forced_ranks, switch_step

K, F, STEPS, ACCUM = 4, 0.5, 1500, 2


def _gloo_rank(rank: int, world: int, port: int, out_path: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sampler = LoopSampler(LoopConfig(max_loops=K, force_one_fraction=F), K, seed=3, rank=rank, world_size=world,
                          total_steps=STEPS)
    mine = torch.tensor([[sampler.k(s, i) for i in range(ACCUM)] for s in range(STEPS)])  # [steps, accum]
    everyone = [torch.zeros_like(mine) for _ in range(world)]
    dist.all_gather(everyone, mine)
    if rank == 0:
        torch.save(torch.stack(everyone), out_path)  # [world, steps, accum]
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_draws(tmp_path_factory) -> torch.Tensor:
    from elr_rl.train.rank import free_port

    out = str(tmp_path_factory.mktemp("draws") / "ks.pt")
    mp.start_processes(_gloo_rank, args=(2, free_port(), out), nprocs=2, join=True, start_method="spawn")
    return torch.load(out)


def test_formulas():
    assert expected_p1(4, 0.0) == pytest.approx(0.25)
    assert expected_p1(4, 1.0) == pytest.approx(1.0)
    assert expected_k_bar(4, 0.0) == pytest.approx(2.5)
    assert expected_k_bar(4, 0.5) == pytest.approx(1.75)


def test_world2_fraction_of_k1_and_mean_k_match_formulas(gloo_draws):
    ks = gloo_draws.double()
    n = ks.numel()
    p1, k_bar = expected_p1(K, F), expected_k_bar(K, F)
    frac1 = (ks == 1).double().mean().item()
    # Forced ranks are deterministic (exactly f of all draws); only the free draws are random.
    free = (1 - F) * n
    sd_p1 = math.sqrt((1 / K) * (1 - 1 / K) / free) * (1 - F)
    sd_k = math.sqrt((K * K - 1) / 12 / free) * (1 - F)
    assert abs(frac1 - p1) < 4 * sd_p1, (frac1, p1)
    assert abs(ks.mean().item() - k_bar) < 4 * sd_k, (ks.mean().item(), k_bar)
    assert set(ks.unique().tolist()) == {1.0, 2.0, 3.0, 4.0}


def test_world2_forced_ranks_rotate(gloo_draws):
    world, steps, _ = gloo_draws.shape
    all_one = (gloo_draws == 1).all(dim=2)  # [world, steps]: every microbatch of the step at k = 1
    for s in range(steps):
        for r in forced_ranks(s, world, F):
            assert all_one[r, s], "a forced rank trained a microbatch at k > 1"
    forced = torch.tensor([[r in forced_ranks(s, world, F) for s in range(steps)] for r in range(world)])
    # f = 0.5 over 2 ranks: exactly one rank per step, alternating, each forced half of the time.
    assert forced.sum(0).eq(1).all()
    assert forced[0, :-1].ne(forced[0, 1:]).all()
    assert forced.double().mean(1).tolist() == pytest.approx([F, F])


@pytest.mark.parametrize("world,f", [(2, 0.3), (3, 0.5), (8, 0.25), (1, 0.25)])
def test_forced_fraction_per_rank_is_f_for_fractional_windows(world, f):
    steps = 400
    counts = [0] * world
    for s in range(steps):
        window = forced_ranks(s, world, f)
        assert math.floor(f * world) <= len(window) <= math.ceil(f * world)
        for r in window:
            counts[r] += 1
    for c in counts:
        assert abs(c / steps - f) <= 1.0 / steps + 1e-9


def test_synchronized_mode_shares_k_across_ranks_and_independent_does_not():
    cfg = LoopConfig(max_loops=4, mode="synchronized", force_one_fraction=0.0)
    a, b = (LoopSampler(cfg, 4, 0, r, 2, 100) for r in (0, 1))
    assert [a.k(s, 0) for s in range(50)] == [b.k(s, 0) for s in range(50)]
    cfg = LoopConfig(max_loops=4, mode="independent", force_one_fraction=0.0)
    a, b = (LoopSampler(cfg, 4, 0, r, 2, 100) for r in (0, 1))
    assert [a.k(s, 0) for s in range(50)] != [b.k(s, 0) for s in range(50)]


def test_delayed_mixed_depth_switches_at_rho():
    cfg = LoopConfig(max_loops=4, force_one_fraction=0.0, delay_fraction=0.3)
    s = LoopSampler(cfg, 4, 0, 0, 1, total_steps=20)
    assert switch_step(0.3, 20) == 6
    assert all(s.k(step, i) == 1 for step in range(6) for i in range(4))
    assert not s.should_switch(5) and s.should_switch(6)
    s.mark_switched()
    assert not s.should_switch(7)
    assert len({s.k(step, 0) for step in range(6, 20)}) > 1
    restored = LoopSampler(cfg, 4, 0, 0, 1, total_steps=20)
    restored.load_state_dict(s.state_dict())
    assert restored.switched and [restored.k(t, 1) for t in range(20)] == [s.k(t, 1) for t in range(20)]
