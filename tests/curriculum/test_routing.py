"""Routing math and the router's epoch/slot/state behaviour (plain Python, no Ray)."""

from __future__ import annotations

from dataclasses import asdict

from collections import Counter

import numpy as np
import pytest

from curriculum.passrates import PROFILE_COLUMNS, RolloutResult
from curriculum.routing import (
    CurriculumConfig,
    LoopRouter,
    Prompt,
    assign_slots,
    build_pool,
    midpoint_quantiles,
    routing_scores,
    slot_plan,
)


def _rows(pass_rates: dict[Prompt, float], samples: int = 8) -> list[dict]:
    rows = []
    for p, rate in pass_rates.items():
        succ = round(rate * samples)
        rows.append(
            dict(prompt_id=p.prompt_id, env=p.env, difficulty=p.difficulty, seed=p.seed, k=1,
                 samples=samples, successes=succ, pass_rate=succ / samples, mean_response_tokens=10.0)
        )
    return rows


def _router(n: int = 40, batch: int = 8, alpha: float = 0.3, seed: int = 0, rates=None, **kw) -> LoopRouter:
    pool = build_pool(["env_a"], [1], range(n))
    rates = rates if rates is not None else [i / (n - 1) for i in range(n)]
    cfg = CurriculumConfig(alpha=alpha, batch_size=batch, seed=seed, **kw)
    return LoopRouter(cfg, pool, _rows(dict(zip(pool, rates))))


# -- midpoint quantiles ----------------------------------------------------------------------
def test_midpoint_quantiles_all_equal_give_half():
    assert midpoint_quantiles([0.0] * 5).tolist() == [0.5] * 5
    assert midpoint_quantiles([1.0] * 4).tolist() == [0.5] * 4
    assert midpoint_quantiles([0.3]).tolist() == [0.5]


def test_midpoint_quantiles_mixed_hand_computed():
    # p = [0, 0, 0, 0.5, 1, 1], N = 6
    # 0   : (0 + 0.5*3)/6 = 0.25
    # 0.5 : (3 + 0.5*1)/6 = 7/12
    # 1   : (4 + 0.5*2)/6 = 5/6
    q = midpoint_quantiles([0.0, 1.0, 0.0, 0.5, 0.0, 1.0])
    np.testing.assert_allclose(q, [0.25, 5 / 6, 0.25, 7 / 12, 0.25, 5 / 6])
    # distinct values: (rank + 0.5) / N
    np.testing.assert_allclose(midpoint_quantiles([0.9, 0.1, 0.5, 0.3]), [3.5 / 4, 0.5 / 4, 2.5 / 4, 1.5 / 4])


def test_routing_scores_formula_and_alpha_check():
    np.testing.assert_allclose(routing_scores([0.2, 0.8], [0.5, 0.0], 0.3), [0.3 * 0.2 + 0.7 * 0.5, 0.3 * 0.8])
    for bad in (-0.1, 1.5):
        with pytest.raises(ValueError, match="alpha"):
            routing_scores([0.5], [0.5], bad)
        with pytest.raises(ValueError, match="alpha"):
            CurriculumConfig(alpha=bad).validate()


def test_slot_plan_and_errors():
    assert slot_plan(8, [1, 2, 3, 4], None) == {1: 2, 2: 2, 3: 2, 4: 2}
    assert slot_plan(7, [1, 4], [3, 4]) == {1: 3, 4: 4}
    with pytest.raises(ValueError, match="sum to 6, not batch_size 7"):
        slot_plan(7, [1, 4], [3, 3])
    with pytest.raises(ValueError, match="equal shares"):
        slot_plan(6, [1, 2, 3, 4], None)
    with pytest.raises(ValueError, match="one count"):
        slot_plan(6, [1, 2], [6])
    with pytest.raises(ValueError, match="slot_counts"):
        _router(slot_counts=[2, 2, 2, 1])


def test_assign_slots_lowest_scores_go_deepest():
    ks = assign_slots(np.array([0.9, 0.1, 0.5, 0.3]), {1: 2, 4: 1, 2: 1})
    assert ks == [1, 4, 1, 2]


# -- router ---------------------------------------------------------------------------------
def test_alpha_one_hardest_prompts_fill_deepest_slots_exactly():
    r = _router(n=40, batch=8, alpha=1.0)
    est = dict(zip(r.tracker.prompt_ids, r.tracker.estimates()))
    for _ in range(10):
        batch = r.next_batch()
        by_rate = sorted(batch, key=lambda a: est[a.prompt_id])
        assert [a.k for a in by_rate] == [4, 4, 3, 3, 2, 2, 1, 1]


def test_alpha_zero_routing_independent_of_pass_rate():
    r = _router(n=64, batch=8, alpha=0.0, seed=3)
    q_by_k: dict[int, list[float]] = {k: [] for k in (1, 2, 3, 4)}
    for _ in range(400):
        for a in r.next_batch():
            q_by_k[a.k].append(a.q)
    # Under independence each k's slots see q ~ the pool's distribution: mean 0.5,
    # sd of the mean = sqrt(1/12 / 800) ~ 0.010. Allow 4 sd.
    for k, qs in q_by_k.items():
        assert abs(np.mean(qs) - 0.5) < 0.041, (k, np.mean(qs))
    # and no trend: rank correlation between q and k near zero
    qs = np.concatenate([q_by_k[k] for k in q_by_k])
    ks = np.concatenate([[k] * len(q_by_k[k]) for k in q_by_k])
    assert abs(np.corrcoef(qs, ks)[0, 1]) < 0.05


def test_alpha_default_deeper_slots_get_harder_prompts():
    r = _router(n=64, batch=8, alpha=0.3, seed=1)
    q_by_k: dict[int, list[float]] = {k: [] for k in (1, 2, 3, 4)}
    for _ in range(200):
        for a in r.next_batch():
            q_by_k[a.k].append(a.q)
    means = [np.mean(q_by_k[k]) for k in (1, 2, 3, 4)]
    assert means[3] < means[0] - 0.05, means
    assert means == sorted(means, reverse=True), means


def test_slot_counts_exact_and_each_prompt_once_per_epoch():
    r = _router(n=30, batch=7, slot_counts=[1, 2, 2, 2])  # 30 % 7 != 0: batches straddle epochs
    served: dict[int, Counter] = {}
    for _ in range(30):
        batch = r.next_batch()
        assert Counter(a.k for a in batch) == Counter({1: 1, 2: 2, 3: 2, 4: 2})
        assert len({a.prompt_id for a in batch}) == 7
        for a in batch:
            served.setdefault(a.epoch, Counter())[a.prompt_id] += 1
    complete = [e for e in served if e < r.epoch]
    assert len(complete) >= 5
    for e in complete:
        assert sorted(served[e]) == sorted(r.tracker.prompt_ids) and set(served[e].values()) == {1}


def test_unprofiled_prompts_get_prior():
    pool = build_pool(["env_a"], [1, 2], range(4))
    rows = _rows({p: 0.0 for p in pool[:4]})
    r = LoopRouter(CurriculumConfig(batch_size=4, prior_pass_rate=0.25), pool, rows)
    est = dict(zip(r.tracker.prompt_ids, r.tracker.estimates()))
    assert [est[p.prompt_id] for p in pool] == [0.0] * 4 + [0.25] * 4
    assert r.stats()["unprofiled"] == 4


def test_unprofiled_prompts_start_at_their_groups_profiled_rate():
    """A profile samples a few seeds per (environment, difficulty): the rest of a big pool starts at that
    group's pooled pass rate (hard groups stay hard), and only groups nobody profiled at prior_pass_rate."""
    pool = build_pool(["env_a", "env_b"], [1, 2], range(6))
    a1 = [p for p in pool if p.env == "env_a" and p.difficulty == 1]
    a2 = [p for p in pool if p.env == "env_a" and p.difficulty == 2]
    rows = _rows({a1[0]: 1.0, a1[1]: 0.75, a2[0]: 0.0, a2[1]: 0.25})
    r = LoopRouter(CurriculumConfig(batch_size=4, prior_pass_rate=0.5, prior_weight=8.0), pool, rows)
    est = dict(zip(r.tracker.prompt_ids, r.tracker.estimates()))
    assert [est[p.prompt_id] for p in a1] == pytest.approx([1.0, 0.75] + [0.875] * 4)
    assert [est[p.prompt_id] for p in a2] == pytest.approx([0.0, 0.25] + [0.125] * 4)
    assert {est[p.prompt_id] for p in pool if p.env == "env_b"} == {0.5}
    assert r.stats()["unprofiled"] == 20  # still counted as never profiled
    assert r.tracker.evidence()[r.tracker.index[a2[3].prompt_id]] == 8.0  # weighs as the plain prior does


def test_live_refresh_estimator_and_per_k_counts():
    pool = build_pool(["env_a"], [1], range(4))
    cfg = CurriculumConfig(batch_size=4, prior_weight=4.0, live_decay=0.5)
    r = LoopRouter(cfg, pool, _rows({p: 0.5 for p in pool}, samples=8))
    pid = pool[0].prompt_id
    r.report([RolloutResult(pid, 4, samples=4, successes=4)])
    # S = 0.5*(0.5*4) + 4 = 5, N = 0.5*4 + 4 = 6
    assert r.tracker.estimates()[0] == pytest.approx(5 / 6)
    r.report([RolloutResult(pid, 2, samples=4, successes=0, reward_mean=0.0, response_tokens_mean=12.0)])
    # S = 0.5*5 + 0 = 2.5, N = 0.5*6 + 4 = 7
    assert r.tracker.estimates()[0] == pytest.approx(2.5 / 7)
    assert r.tracker.per_k == {f"{pid}|4": [4, 4], f"{pid}|2": [4, 0]}
    assert r.quantiles()[0] < 0.5  # now the hardest of the four
    stats = r.stats()
    assert stats["per_k"]["2"]["mean_response_tokens"] == 12.0 and stats["per_k"]["4"]["pass_rate"] == 1.0
    with pytest.raises(ValueError, match="not in the curriculum's pool"):
        r.report([RolloutResult(pid, 1, 1, 1), RolloutResult("nope/d1/s0", 1, 1, 1)])
    assert r.tracker.per_k[f"{pid}|4"] == [4, 4] and f"{pid}|1" not in r.tracker.per_k  # nothing applied
    with pytest.raises(ValueError, match="successes"):
        RolloutResult(pid, 1, samples=2, successes=3)


def test_drop_solved_prompts():
    n = 12
    rates = [1.0] * 4 + [0.5] * 8
    r = _router(n=n, batch=4, rates=rates, drop_solved=True, min_solved_samples=4.0, solved_threshold=0.95)
    solved = set(r.tracker.prompt_ids[:4])
    for _ in range(10):
        assert not solved & {a.prompt_id for a in r.next_batch()}
    assert r.stats()["dropped"] == 4
    # solving more prompts live drops them too; too few left is a clear error
    # (prior 0.5 x 8 decayed by 0.7, then 64/64: (2.8 + 64) / (5.6 + 64) = 0.96 >= 0.95)
    r.report([RolloutResult(pid, 1, 64, 64) for pid in r.tracker.prompt_ids[4:10]])
    assert r.stats()["dropped"] == 10
    with pytest.raises(RuntimeError, match="drop_solved"):
        for _ in range(5):
            r.next_batch()


def test_state_dict_round_trip_continues_same_sequence():
    import json

    a = _router(n=30, batch=8, seed=7)
    for _ in range(5):
        a.next_batch()
    a.report([RolloutResult(a.tracker.prompt_ids[0], 1, 8, 8)])
    state = json.loads(json.dumps(a.state_dict()))  # must survive JSON
    b = _router(n=30, batch=8, seed=7)
    b.load_state_dict(state)
    for _ in range(8):
        assert [asdict(x) for x in a.next_batch()] == [asdict(x) for x in b.next_batch()]
    other = LoopRouter(CurriculumConfig(batch_size=8), build_pool(["other"], [1], range(30)))
    with pytest.raises(ValueError, match="different prompt pool"):
        other.load_state_dict(state)


def test_bad_pool_and_profile_rows():
    pool = build_pool(["env_a"], [1], range(4))
    with pytest.raises(ValueError, match="fewer than batch_size"):
        LoopRouter(CurriculumConfig(batch_size=8), pool)
    with pytest.raises(ValueError, match="duplicate"):
        LoopRouter(CurriculumConfig(batch_size=4), pool + pool[:1])
    rows = _rows({p: 0.5 for p in pool})
    del rows[2]["pass_rate"]
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['pass_rate'\]"):
        LoopRouter(CurriculumConfig(batch_size=4), pool, rows)
    assert "pass_rate" in PROFILE_COLUMNS

