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
