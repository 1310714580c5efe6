"""scripts/bench_rollout.py's arithmetic: what its MFU columns divide by what (the figures in the README)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "scripts"))
import bench_rollout  # noqa: E402


@pytest.fixture(scope="module")
def model():
    from elr_rl.model import ElrConfig, LoopedForCausalLM

    return LoopedForCausalLM(ElrConfig(hidden_size=64, intermediate_size=176, n_recurrent_layers=2))


def test_decode_time_mfu_takes_the_prefill_time_and_first_tokens_out(model):
    prompts = [[1] * 30, [1] * 50]  # mean prompt 40
    lengths = [10, 30, 64, 64]  # two rows stopped at the cap
    # microseconds, so that the rounded GFLOP/s figures of a tiny model keep their digits
    run = {"seconds": 10e-6, "tokens": 168, "computed": 168, "lengths": lengths, "prompt_tokens_computed": 120,
           "prefill_seconds": 2e-6, "prefill_one_seconds": 1e-6, "cap": 64}
    ceiling = 1e4
    s = bench_rollout.summarise(run, model, 2, prompts, ceiling=ceiling)
    per_token = bench_rollout.decode_flops(model, 2, 40 + 0.5 * 42)
    assert s["gflops"] == pytest.approx(per_token * 168 / 10e-6 / 1e9, rel=1e-3)
    assert s["mfu"] == pytest.approx(s["gflops"] / ceiling, abs=1e-3)
    # every sequence's first token is sampled by the prefill: 168 - 4 tokens in 10 - 2 microseconds
    assert s["decode_gflops"] == pytest.approx(per_token * 164 / 8e-6 / 1e9, rel=1e-3)
    assert s["decode_time_mfu"] == pytest.approx(s["decode_gflops"] / ceiling, abs=1e-3)
    assert s["decode_time_mfu"] > s["mfu"]
    prefill = bench_rollout.decode_flops(model, 2, 20) * 120
    assert s["total_gflops"] == pytest.approx((per_token * 168 + prefill) / 10e-6 / 1e9, rel=1e-3)
    assert s["capped"] == 2 and s["max_len"] == 64 and s["waste"] == 0.0
    # the prefill's recompute: prompt tokens computed against the distinct ones, and its one-sample time
    assert (s["prefill_tokens"], s["prompt_tokens"], s["prefill_one_seconds"]) == (120, 80, 0.0)
    assert (s["prefill_copied"], s["prefill_timed_tokens"]) == (0, 1)
    # with prompt-tail sharing the prefill is timed to each sequence's second token: both leave the decode FLOPs
    shared = bench_rollout.summarise({**run, "first_tokens": 2, "prompt_tokens_copied": 30}, model, 2, prompts,
                                     ceiling=ceiling)
    assert shared["decode_gflops"] == pytest.approx(per_token * 160 / 8e-6 / 1e9, rel=1e-3)
    assert (shared["prefill_copied"], shared["prefill_timed_tokens"]) == (30, 2)


def test_prefilled_counts_each_other_sample_s_partial_last_block():
    from types import SimpleNamespace

    def engine(block: int, caching: bool = True):
        cache = SimpleNamespace(block_size=block, enable_prefix_caching=caching)
        return SimpleNamespace(llm=SimpleNamespace(llm_engine=SimpleNamespace(
            vllm_config=SimpleNamespace(cache_config=cache))))

    # 70 tokens, blocks of 32: the other samples read 64 from the cache and compute 6
    assert bench_rollout.prefilled(70, 16, engine(32)) == 70 + 15 * 6
    # a prompt of whole blocks: a hit stops short of the last token, so the last block is computed again
    assert bench_rollout.prefilled(64, 4, engine(32)) == 64 + 3 * 32
    assert bench_rollout.prefilled(70, 1, engine(32)) == 70
    assert bench_rollout.prefilled(70, 16, engine(32, caching=False)) == 16 * 70

    # with the engine's counters (prompt-tail sharing): what it counted over the request, not the formula
    counting = engine(32)
    counting.prefill_counts = lambda: {"computed": 175, "copied": 85}
    assert bench_rollout.prompt_work(counting, {"computed": 100, "copied": 10}, [[1] * 70], 16) == {
        "prompt_tokens_computed": 75, "prompt_tokens_copied": 75}
    counting.prefill_counts = lambda: None  # sharing off: the formula, nothing copied
    assert bench_rollout.prompt_work(counting, None, [[1] * 70], 16) == {
        "prompt_tokens_computed": 70 + 15 * 6, "prompt_tokens_copied": 0}


def test_a_run_without_its_prefill_timed_has_no_decode_time_column(model):
    run = {"seconds": 4.0, "tokens": 60, "computed": 200, "lengths": [20, 40], "prompt_tokens_computed": 50}
    s = bench_rollout.summarise(run, model, 1, [[1] * 8], ceiling=1.0)
    assert "decode_time_mfu" not in s
    assert s["waste"] == pytest.approx(0.7)  # the plain decoder computed 200 tokens for 60 useful ones
    assert s["tokens_per_s"] == 15.0


def test_compared_prompts_must_be_part_of_the_request():
    with pytest.raises(SystemExit):
        bench_rollout.parse_args(["--batch", "4", "--compare-prompts", "5"])
    assert bench_rollout.parse_args([]).batch * bench_rollout.parse_args([]).samples == 512


def test_useful_tokens_stop_at_the_first_stop_id():
    assert bench_rollout.useful_tokens([[5, 6, 9, 9], [5, 6, 7, 8], [9]], {9}) == [3, 4, 1]


def test_a_stream_holds_two_requests_or_none():
    with pytest.raises(SystemExit):
        bench_rollout.parse_args(["--stream", "1"])
    assert bench_rollout.parse_args(["--stream", "0"]).stream == 0
    assert bench_rollout.parse_args([]).stream == 3


def test_matched_rows_ignore_the_stop_token_and_run_their_own_length():
    params = bench_rollout.matched_params([5, 1, 40])
    assert [p.max_tokens for p in params] == [5, 1, 40]
    assert all(p.ignore_eos and not p.stop_token_ids and p.n == 1 and p.temperature == 1.0 for p in params)
    with pytest.raises(ValueError, match="at least 1"):
        bench_rollout.matched_params([3, 0])


def test_compare_only_turns_the_stream_off():
    args = bench_rollout.parse_args(["--compare-only"])
    assert args.compare_only and args.stream == 0
