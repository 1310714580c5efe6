"""The invariants the asynchronous driver relies on, without Ray or engines: request cutting, stale-group
eviction, the group filters, learner microbatches that add up to the whole batch's loss."""

from __future__ import annotations

import json

import pytest
import torch

from curriculum.routing import Assignment
from elr_rl.rl import grpo
from elr_rl.rl.messages import FinishReason, Group, Sample
from elr_rl.rl.samples import (RolloutBuffer, TrainSample, learner_batches, pack, select_samples, sweep_loop_count,
                               take_one_loop_count)


def _a(i: int, k: int) -> Assignment:
    return Assignment(f"p{i}", "even_odd", i, 1, k, q=0.5, score=0.5, batch=0, epoch=0)


def _group(i: int, rewards: list[float], version: int = 0, k: int = 1, finish: str = "stop") -> Group:
    samples = [Sample([5, 6], [7, 8, 9], [1, 1, 0], [-0.5, -0.25, 0.0], FinishReason(finish), text="x", reward=r)
               for r in rewards]
    return Group(_a(i, k), samples, version)


def test_a_request_holds_one_loop_count_and_the_oldest_prompt():
    queue = [_a(0, 3), _a(1, 1), _a(2, 3), _a(3, 2), _a(4, 3), _a(5, 3)]
    work, rest = take_one_loop_count(queue, 3)
    assert [a.prompt_id for a in work] == ["p0", "p2", "p4"]  # k of the oldest, in queue order, at most n
    assert [a.prompt_id for a in rest] == ["p1", "p3", "p5"]  # nothing lost, order kept
    work, rest = take_one_loop_count(rest, 3)
    assert [a.prompt_id for a in work] == ["p1"]  # the next oldest goes next, even alone
    assert take_one_loop_count([], 4) == ([], [])


def test_loop_counts_are_requested_in_a_sweep_and_every_waiting_one_within_a_sweep():
    order, last, rising = [], None, True
    for _ in range(9):  # every k has work: depth changes by one level per request
        last, rising = sweep_loop_count([4, 2, 1, 3, 2], last, rising)
        order.append(last)
    assert order == [1, 2, 3, 4, 3, 2, 1, 2, 3]
    assert sweep_loop_count([1, 4], 1, True) == (4, True) and sweep_loop_count([1, 4], 4, True) == (1, False)
    assert sweep_loop_count([3], 3, False) == (3, False) and sweep_loop_count([], 2, True) == (None, True)
    assert take_one_loop_count([_a(0, 3), _a(1, 1), _a(2, 1)], 4, k=1) == ([_a(1, 1), _a(2, 1)], [_a(0, 3)])
    # arbitrary arrivals: an assignment waits at most 2 (K - 1) requests after it arrives
    import random

    rng, queue, last, rising, worst = random.Random(0), [], None, True, 0
    for t in range(2000):
        queue += [(rng.choice([1, 2, 3, 4, 6]), t) for _ in range(rng.randint(0, 2))]
        if not queue:
            continue
        last, rising = sweep_loop_count([k for k, _ in queue], last, rising)
        served = [born for k, born in queue if k == last]
        worst = max(worst, t - min(served))
        queue = [(k, born) for k, born in queue if k != last]
    assert worst <= 2 * (5 - 1), worst


def test_stale_groups_are_evicted_and_counted_and_the_oldest_fresh_ones_go_first():
    buf = RolloutBuffer()
    for i, version in enumerate([0, 1, 2, 1, 3]):
        buf.add(_group(i, [1.0, 0.0], version))
    assert buf.pop_batch(4, version=3, max_staleness=1) is None  # versions 0 and 1 are too old: 2 fresh left
    assert buf.dropped_stale == 3 and [g.version for g in buf.groups] == [2, 3]
    assert [g.prompt_id for g in buf.pop_batch(1, version=3, max_staleness=1)] == ["p2"]  # FIFO
    assert buf.pop_batch(1, version=4, max_staleness=1)[0].version == 3  # 4 - 3 <= 1: still fresh
    assert len(buf) == 0 and buf.dropped_stale == 3
    # a checkpoint's copy (JSON) restores the same typed groups
    buf.add(_group(7, [0.5, 1.0], 5, k=2, finish="length"))
    again = RolloutBuffer()
    again.load_state_dict(json.loads(json.dumps(buf.state_dict())))
    assert list(again.groups) == list(buf.groups) and again.dropped_stale == 3
    assert again.groups[0].samples[0].finish_reason is FinishReason.LENGTH and again.groups[0].k == 2


def test_filters_drop_uninformative_groups_and_overlong_samples():
    groups = [_group(0, [1.0, 1.0]), _group(1, [1.0, 0.0]), _group(2, [0.0, 1.0], finish="length")]
    samples, stats = select_samples(groups, std_normalize=True, dynamic_sampling=True, overlong_filter=True,
                                    max_seq_len=4)
    assert stats == {"batch/uninformative_groups": 1.0, "batch/overlong_samples": 2.0, "batch/trained_samples": 2.0}
    assert [round(s.advantage, 4) for s in samples] == [1.0, -1.0]  # (r - mean) / std within the group
    assert samples[0].ids == [5, 6, 7, 8] and samples[0].loss_mask == [0, 0, 1, 1]  # cut at max_seq_len
    assert samples[0].rollout_logp == [0.0, 0.0, -0.5, -0.25]
    kept, stats = select_samples(groups, std_normalize=False, dynamic_sampling=False, overlong_filter=False,
                                 max_seq_len=64)
    assert len(kept) == 6 and stats["batch/uninformative_groups"] == 0.0
    assert [s.advantage for s in kept[:4]] == [0.0, 0.0, 0.5, -0.5]  # Dr. GRPO: no std division


def _grouped_samples() -> list[TrainSample]:
    """Groups sharing a prompt (of 2-5 tokens) at several loop counts, a lone sample, one with nothing
    trained, and one whose prompt is cut to its whole length."""
    g = torch.Generator().manual_seed(0)
    samples = []
    for i in range(11):
        group, k = i // 3, 1 + (i // 3) % 3
        p, n = 2 + group, 3 + i % 5
        mask = [0] * p + [int(x) for x in (torch.rand(n, generator=g) > 0.2).tolist()]
        if i == 4:
            mask = [0] * len(mask)  # a sample with nothing to train counts for no sequence
        ids = [100 + group] * p + torch.randint(1, 99, (n,), generator=g).tolist()
        samples.append(TrainSample(ids, mask, [0.0] * len(ids), float(i % 3 - 1), k=k, prompt_len=p, group=group))
    samples.append(TrainSample([7, 8, 9], [0, 1, 1], [0.0, -1.0, -2.0], 0.5, k=2))  # no group: alone
    samples.append(TrainSample([5, 5, 5], [0, 0, 0], [0.0] * 3, 1.0, k=1, prompt_len=3, group=9))  # prompt only
    return samples


def _per_token(s: TrainSample, t: int) -> float:
    """Any per-token loss that depends on the sample, its token and that token's context."""
    return s.advantage * (s.ids[t] + 0.1 * s.ids[t - 1]) % 7.0


@pytest.mark.parametrize("max_tokens", [None, 9])
@pytest.mark.parametrize("share", [True, False])
@pytest.mark.parametrize("aggregation", ["token", "sequence"])
def test_per_rank_microbatches_add_up_to_the_whole_batch_loss(aggregation, share, max_tokens):
    """What DeepSpeed applies (each microbatch's loss / accumulation steps, averaged over ranks) equals the
    loss of the whole batch computed sample by sample; also with rows of at most 9 tokens."""
    samples = _grouped_samples()
    ks, world = [1, 2, 3, 4], 2
    lb = learner_batches(samples, world, lambda k: 2 + k, aggregation, ks, share_prompts=share, max_tokens=max_tokens)
    n = len(lb.ks[0])
    assert lb.ks == [lb.ks[0]] * world and [len(r) for r in lb.microbatches] == [n] * world  # same rows per rank
    assert sorted(set(lb.ks[0])) == ks and lb.ks[0] == sorted(lb.ks[0])  # every k, each k's rows together
    assert all(int(mb["accum_steps"]) == n for r in lb.microbatches for mb in r) and lb.stats["batch/microbatches"] == n
    if max_tokens is None:
        assert n == len(ks)  # one row per k
    else:
        assert n > len(ks)
        for mb in (mb for r in lb.microbatches for mb in r):  # within the budget, or one sample alone
            assert mb["input_ids"].shape[1] <= max_tokens or len(set(mb["sequence_ids"][0].tolist()) - {-1}) == 1
        assert lb.stats["batch/over_budget_samples"] == sum(len(s.ids) > max_tokens for s in samples) > 0
    placed = [mb["loss_mask"].sum().item() for r in lb.microbatches for mb in r]
    assert sum(placed) == sum(sum(s.loss_mask[1:]) for s in samples)  # every trained token placed once
    total = sum(len(s.ids) for s in samples)
    shared = sum(s.prompt_len * (n - 1) for s, n in [(samples[0], 3), (samples[3], 3), (samples[6], 3),
                                                      (samples[9], 2)])
    depth_of_rows = sum((2 + k) * mb["input_ids"].shape[1] for r in lb.microbatches for mb, k in zip(r, lb.ks[0])
                        if mb["loss_mask"].sum() > 0 or mb["input_ids"].shape[1] > 2)
    assert lb.stats["batch/learner_sublayer_tokens"] == depth_of_rows  # each row's tokens x D_eff(k) = 2 + k
    if max_tokens is None:
        assert lb.stats["batch/learner_tokens"] == total - (shared if share else 0)
    else:  # a group cut in parts has its prompt once per part
        assert total - (shared if share else 0) <= lb.stats["batch/learner_tokens"] <= total
    assert sum(mb["input_ids"].shape[1] for r in lb.microbatches for mb in r) == (
        lb.stats["batch/learner_tokens"] + 2 * sum(1 for r in lb.microbatches for mb in r if mb["loss_mask"].sum() == 0
                                                   and mb["input_ids"].shape[1] == 2))

    def per_token(mb):  # the same loss on the packed row: the token and the one its logits come from
        ids = mb["input_ids"].float()
        return mb["advantages"] * (ids + 0.1 * ids[0, mb["pred_index"][0]]) % 7.0

    applied = sum(
        grpo.aggregate(per_token(mb), mb["loss_mask"], aggregation, float(mb["global_denominator"]),
                       engine_divisor=float(mb["accum_steps"]) * world, sequence_ids=mb["sequence_ids"]) / n
        for rank in lb.microbatches for mb in rank) / world
    per_sample = [(sum(_per_token(s, t) * s.loss_mask[t] for t in range(1, len(s.ids))), sum(s.loss_mask[1:]))
                  for s in samples]
    if aggregation == "token":
        expected = sum(n for n, _ in per_sample) / sum(c for _, c in per_sample)
    else:
        expected = sum(n / c for n, c in per_sample if c) / sum(1 for _, c in per_sample if c)
    assert float(applied) == pytest.approx(expected, abs=1e-5)
    with pytest.raises(ValueError, match="loop_counts"):
        learner_batches(samples, world, lambda k: k, aggregation, [1, 2])


def test_a_shared_prompt_is_packed_once_and_each_tail_continues_it():
    s = [TrainSample([1, 2, 3, 10, 11], [0, 0, 0, 1, 1], [0, 0, 0, -1.0, -2.0], 1.0, k=1, prompt_len=3, group=0),
         TrainSample([1, 2, 3, 20], [0, 0, 0, 1], [0, 0, 0, -3.0], -1.0, k=1, prompt_len=3, group=0),
         TrainSample([1, 2, 4, 30], [0, 0, 0, 1], [0, 0, 0, -4.0], 0.5, k=1, prompt_len=3, group=0)]  # other prompt
    mb = pack(s, 4.0)
    row = lambda name: mb[name][0].tolist()  # noqa: E731
    assert row("input_ids") == [1, 2, 3, 10, 11, 20, 1, 2, 4, 30]
    assert row("positions") == [0, 1, 2, 3, 4, 3, 0, 1, 2, 3]
    assert row("segment_ids") == [0, 0, 0, 1, 1, 2, 3, 3, 3, 3]
    assert row("parent_ids") == [-1, -1, -1, 0, 0, 0, -1, -1, -1, -1]
    assert row("pred_index")[3:6] == [2, 3, 2] and row("pred_index")[9] == 8  # tails continue the prompt
    assert row("loss_mask") == [0, 0, 0, 1, 1, 1, 0, 0, 0, 1]
    assert row("rollout_logp")[3:6] == [-1.0, -2.0, -3.0] and row("advantages")[5] == -1.0
    assert row("sequence_ids") == [-1, -1, -1, 0, 0, 1, 2, 2, 2, 2]
    # logits only where a trained token is predicted: the shared prompt's last token (twice), a tail's
    # own tokens, the other prompt's last; logit_index says which of them predicts each token
    assert row("logit_rows") == [2, 3, 8]
    index = row("logit_index")
    assert [index[t] for t in (3, 4, 5, 9)] == [0, 1, 0, 2]
    assert pack(s, 4.0, share_prompts=False)["input_ids"].shape[1] == 13  # every sample whole
    empty = TrainSample([], [], [], 1.0, k=1)
    assert pack(s + [empty], 4.0)["input_ids"].shape[1] == 10  # nothing to compute
    alone = pack([empty], 4.0)
    assert alone["input_ids"].shape == (1, 2) and alone["loss_mask"].sum() == 0  # the untrained pad row


def test_prompts_too_long_for_the_engine_are_counted_and_a_run_where_none_fits_stops(tmp_path):
    from elr_rl.model import ElrConfig, LoopedForCausalLM, save_tokenizer
    from elr_rl.rl.driver import Driver
    from tests.rl.helpers import make_config

    LoopedForCausalLM(ElrConfig.tiny()).save_pretrained(tmp_path / "ckpt")
    save_tokenizer(tmp_path / "ckpt")
    driver = Driver(make_config(tmp_path / "ckpt", tmp_path / "run", algo={"groups_per_step": 2}))
    driver._skip_too_long([_a(0, 1), _a(1, 1)])
    assert driver.ledger["skipped_prompt_too_long"] == 2  # counted in the run's ledger (summary.json)
    driver.ledger["scored"] = 1
    driver._skip_too_long([_a(i, 2) for i in range(20)])  # some prompts fit: the run goes on
    driver.ledger["scored"] = 0
    with pytest.raises(ValueError, match="rollout.max_model_len"):  # none fits: say what to change
        driver._skip_too_long([_a(0, 1)])


def test_a_run_config_with_save_interval_zero_is_refused(tmp_path):
    from elr_rl.model import ElrConfig, LoopedForCausalLM, save_tokenizer
    from tests.rl.helpers import make_config

    LoopedForCausalLM(ElrConfig.tiny()).save_pretrained(tmp_path / "ckpt")
    save_tokenizer(tmp_path / "ckpt")
    with pytest.raises(ValueError, match="run.save_interval"):
        make_config(tmp_path / "ckpt", tmp_path / "run", run={"save_interval": 0})


class _Worker:
    """A rollout worker handle that records the requests handed to it."""

    def __init__(self):
        self.requests = []
        self.generate = self

    def remote(self, work):
        self.requests.append(work)
        return object()  # a request ref


class _Metrics:
    def log_routing(self, step, routing):
        pass


def _scheduler(mode: str, groups_per_step: int = 4, staleness: int = 1, per_request: int = 2):
    from collections import Counter

    from elr_rl.rl.scheduler import Scheduler
    from elr_rl.rl.stats import StepWindow

    cfg = make_config_for_units(mode, groups_per_step, staleness, per_request)
    batches = iter(range(1000))

    def next_batch():  # the curriculum: one batch, every loop count
        b = next(batches)
        return [_a(100 * b + k, k) for k in cfg.curriculum.loop_counts]

    return Scheduler(cfg, next_batch, _Metrics(), Counter(), StepWindow())


def make_config_for_units(mode, groups_per_step, staleness, per_request):
    from elr_rl.rl.config import RLConfig

    cfg = RLConfig()
    cfg.async_.mode, cfg.async_.max_staleness = mode, staleness
    cfg.algo.groups_per_step, cfg.rollout.prompts_per_request = groups_per_step, per_request
    cfg.curriculum.loop_counts = [1, 2]
    return cfg


def test_sync_scheduling_sends_exactly_what_the_next_step_needs_and_nothing_while_training():
    sched = _scheduler("sync", groups_per_step=3, per_request=2)
    workers = [_Worker(), _Worker(), _Worker()]
    sched.fill(workers, learner_busy=True, downstream=0, step=0)
    assert sched.in_flight() == 0  # never while the learner trains
    sched.fill(workers, learner_busy=False, downstream=0, step=0)
    assert sched.in_flight() == 3 and [len(w.requests[0]) for w in workers[:2]] == [2, 1] and not workers[2].requests
    for w in workers[:2]:  # each request holds one loop count
        assert len({a.k for a in w.requests[0]}) == 1
    sched.fill(workers, learner_busy=False, downstream=0, step=0)
    assert sched.in_flight() == 3  # busy workers get nothing more, and the step is covered


def test_async_scheduling_runs_ahead_by_the_staleness_bound_and_requeues_a_dead_workers_prompts():
    sched = _scheduler("async", groups_per_step=2, staleness=1, per_request=2)
    workers = [_Worker() for _ in range(5)]
    # while the learner trains (V -> V + 1), what is generated now is trained from V + 1: one step's worth at S = 1
    sched.fill(workers, learner_busy=True, downstream=0, step=0)  # training does not stop async generation
    assert sched.in_flight() == 2 and sum(bool(w.requests) for w in workers) == 1
    sched.fill(workers, learner_busy=True, downstream=0, step=0)
    assert sched.in_flight() == 2  # more would be trained at staleness 2: dropped
    sched.fill(workers, learner_busy=False, downstream=1, step=0)  # waiting for data: the next step starts from V
    assert sched.in_flight() == 3 and [len(w.requests[0]) for w in workers[:2]] == [2, 1]  # capped at 2 * 2 pending
    lost = workers[0].requests[0]
    queued = list(sched.queue)
    assert sched.requeue_worker(0, []) == len(lost)  # its in-flight request goes back to the front
    assert list(sched.queue) == lost + queued and sched.in_flight() == 1 and sched.ledger["requeued"] == 2


@pytest.mark.parametrize("staleness", [0, 1, 2])
def test_async_lookahead_generates_nothing_that_must_go_stale(staleness):
    """Simulated async run, learner slower than generation: FIFO groups each tagged with the version the
    workers held; every group the scheduler lets through is trained within the staleness bound."""
    from elr_rl.rl.scheduler import async_lookahead

    need, version, pending, trained = 4, 0, [], 0
    for _ in range(30):  # one learner step per round; workers fill up to the lookahead instantly
        # the learner is idle: top up, then the next step takes the oldest `need` groups
        pending += [version] * max(0, async_lookahead(need, staleness, learner_busy=False) - len(pending))
        batch, pending = pending[:need], pending[need:]
        assert all(version - v <= staleness for v in batch)
        # while it trains (version -> version + 1), workers at `version` top up again
        pending += [version] * max(0, async_lookahead(need, staleness, learner_busy=True) - len(pending))
        version += 1
        trained += len(batch)
        assert all(version - v <= staleness for v in pending[:need * staleness]), (staleness, version, pending)
        assert len(pending) <= need * staleness  # nothing beyond what the next S steps can take
    assert trained == 30 * need


def test_a_workers_second_request_runs_at_its_first_ones_loop_count_and_joins_its_batch():
    """requests_per_worker = 2: each worker first gets one request (idle workers before busy ones), then a
    second at the loop count it is running, so the two share its engine's batch; once the queue has no
    prompts at that k, the next request follows the sweep."""
    sched = _scheduler("async", groups_per_step=8, staleness=2, per_request=1)
    sched.cfg.curriculum.loop_counts = [1, 2, 3]
    workers = [_Worker(), _Worker()]
    sched.fill(workers, learner_busy=False, downstream=0, step=0)
    assert [len(w.requests) for w in workers] == [2, 2]
    for w in workers:
        assert len({a.k for work in w.requests for a in work}) == 1  # both of a worker's requests at one k
    first = {a.k for a in workers[0].requests[0]}, {a.k for a in workers[1].requests[0]}
    assert first[0] != first[1]  # the idle workers took successive loop counts of the sweep
    # worker 0's first request finishes: the next one joins its second, at the same k
    (k0,) = first[0]
    ref = next(r for r, (i, _) in sched.inflight.items() if i == 0)
    del sched.inflight[ref]
    sched.fill(workers, learner_busy=False, downstream=0, step=0)
    assert len(workers[0].requests) == 3 and {a.k for a in workers[0].requests[2]} == {k0}
    assert len(workers[1].requests) == 2  # already holding two
    # no prompts left at k0, in the queue or the curriculum's next batches: the next request follows the sweep
    ref = next(r for r, (i, _) in sched.inflight.items() if i == 0)
    del sched.inflight[ref]
    sched.queue = type(sched.queue)(a for a in sched.queue if a.k != k0)
    every = sched.next_batch
    sched.next_batch = lambda: [a for a in every() if a.k != k0]
    sched.fill(workers, learner_busy=False, downstream=0, step=0)
    assert len(workers[0].requests) == 4 and {a.k for a in workers[0].requests[3]} != {k0}


def test_one_request_per_worker_when_configured():
    sched = _scheduler("async", groups_per_step=8, staleness=2, per_request=1)
    sched.cfg.rollout.requests_per_worker = 1
    workers = [_Worker(), _Worker()]
    sched.fill(workers, learner_busy=False, downstream=0, step=0)
    sched.fill(workers, learner_busy=False, downstream=0, step=0)
    assert [len(w.requests) for w in workers] == [1, 1]


def test_a_worker_that_dies_holding_two_requests_is_restarted_once_with_both_requeued():
    from elr_rl.rl.scheduler import merge_deaths

    a, b, c = _a(1, 1), _a(2, 1), _a(3, 2)
    died = RuntimeError("actor died")
    out = merge_deaths([(0, [a], died), (1, [c], "reply"), (0, [b], died)])
    assert out == [(0, [a, b], died), (1, [c], "reply")]
