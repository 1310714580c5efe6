"""How the driver cuts the curriculum's queue into rollout requests."""

from __future__ import annotations

from elr_rl.rl.samples import take_one_loop_count


def _a(i: int, k: int) -> dict:
    return {"prompt_id": f"p{i}", "k": k}


def test_a_request_holds_one_loop_count_and_the_oldest_prompt():
    queue = [_a(0, 3), _a(1, 1), _a(2, 3), _a(3, 2), _a(4, 3), _a(5, 3)]
    work, rest = take_one_loop_count(queue, 3)
    assert [a["prompt_id"] for a in work] == ["p0", "p2", "p4"]  # k of the oldest, in queue order, at most n
    assert [a["prompt_id"] for a in rest] == ["p1", "p3", "p5"]  # nothing lost, order kept
    work, rest = take_one_loop_count(rest, 3)
    assert [a["prompt_id"] for a in work] == ["p1"]  # the next oldest goes next, even alone
    assert take_one_loop_count([], 4) == ([], [])


def test_prompts_too_long_for_the_engine_are_counted_and_a_run_where_none_fits_stops(tmp_path):
    import pytest

    from elr_rl.rl.driver import Driver
    from tests.rl.helpers import make_config

    from elr_rl.model import ElrConfig, LoopedForCausalLM, save_tokenizer

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
