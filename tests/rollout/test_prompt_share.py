"""The prompt-tail sharing connector's decisions, one scheduler step at a time (stand-in requests and
scheduler outputs: its engine behaviour is tested in test_per_loop_parity.py on a real vLLM engine)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("vllm")

from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorRole  # noqa: E402
from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec  # noqa: E402
from vllm.v1.request import RequestStatus  # noqa: E402

from elr_rl.rollout.prompt_share import PromptTailShareConnector  # noqa: E402

BLOCK = 32


def spec(window: int | None = None, block: int = BLOCK):
    shape = {"block_size": block, "num_kv_heads": 1, "head_size": 8, "dtype": torch.float32}
    return SlidingWindowSpec(**shape, sliding_window=window) if window else FullAttentionSpec(**shape)


def connector(*specs) -> PromptTailShareConnector:
    config = SimpleNamespace(cache_config=SimpleNamespace(block_size=BLOCK), kv_transfer_config=object())
    groups = [SimpleNamespace(kv_cache_spec=s) for s in specs or [spec()]]
    return PromptTailShareConnector(config, KVConnectorRole.SCHEDULER, SimpleNamespace(kv_cache_groups=groups))


def request(rid: str, prompt: list[int]) -> SimpleNamespace:
    return SimpleNamespace(request_id=rid, prompt_token_ids=prompt, num_prompt_tokens=len(prompt),
                           num_tokens=len(prompt), num_computed_tokens=0, status=RequestStatus.WAITING,
                           num_preemptions=0, cache_salt=None, lora_request=None)


def step(conn, scheduled: list, blocks: dict) -> list[tuple[int, int]]:
    """One scheduler output: `scheduled` [(request, tokens)], `blocks` {request id: block ids}; the step
    then 'runs' (computed tokens advance, requests run). Returns the block copies it carries."""
    def tables(ids):  # one table per group: a list, or a tuple of lists
        return tuple(ids) if isinstance(ids, tuple) else (ids,)

    new = [SimpleNamespace(req_id=r.request_id, prompt_token_ids=r.prompt_token_ids,
                           block_ids=tables(blocks[r.request_id]), num_computed_tokens=r.num_computed_tokens)
           for r, _ in scheduled]
    out = SimpleNamespace(scheduled_new_reqs=new, num_scheduled_tokens={r.request_id: n for r, n in scheduled},
                          kv_cache_block_copies=None)
    conn.build_connector_meta(out)
    for r, n in scheduled:
        r.num_computed_tokens += n
        r.status = RequestStatus.RUNNING
    return [tuple(c) for c in out.kv_cache_block_copies or []]


PROMPT = list(range(70))  # two whole blocks, then a tail of 5 tokens before the last one


def test_siblings_wait_one_step_then_copy_the_sources_tail_block():
    conn = connector()
    a, b, c = (request(x, PROMPT) for x in "abc")
    assert conn.get_num_new_matched_tokens(a, 0) == (0, False)  # the source computes everything
    assert conn.get_num_new_matched_tokens(b, 64) == (None, False)  # its source runs in this step
    assert conn.get_num_new_matched_tokens(c, 64) == (None, False)
    assert step(conn, [(a, 70)], {"a": [1, 2, 3]}) == []
    for r in (b, c):
        assert conn.get_num_new_matched_tokens(r, 64) == (5, False)
        r.num_computed_tokens = 69
    assert step(conn, [(b, 1), (c, 1)], {"b": [1, 2, 7], "c": [1, 2, 8]}) == [(3, 7), (3, 8)]
    assert conn.counts == {"prompt_tokens": 210, "prefix_cache": 128, "copied": 10, "computed": 72, "deferred": 2}


def test_no_copy_from_a_source_that_stopped_running_or_was_preempted():
    for fate in ("finished", "preempted"):
        conn = connector()
        a, b = request("a", PROMPT), request("b", PROMPT)
        conn.get_num_new_matched_tokens(a, 0)
        step(conn, [(a, 70)], {"a": [1, 2, 3]})
        if fate == "finished":
            a.status = RequestStatus.FINISHED_STOPPED
        else:
            a.num_preemptions += 1
        assert conn.get_num_new_matched_tokens(b, 64) == (0, False), fate  # computes its tail; now the source
        b.num_computed_tokens = 64
        assert step(conn, [(b, 6)], {"b": [1, 2, 9]}) == []
        c = request("c", PROMPT)
        assert conn.get_num_new_matched_tokens(c, 64) == (5, False)
        c.num_computed_tokens = 69
        assert step(conn, [(c, 1)], {"c": [1, 2, 4]}) == [(9, 4)]


def test_a_source_not_scheduled_or_chunked_gives_way():
    conn = connector()
    a, b = request("a", PROMPT), request("b", PROMPT)
    conn.get_num_new_matched_tokens(a, 0)
    step(conn, [], {})  # no room for `a` in this step: it is no longer the source
    assert conn.get_num_new_matched_tokens(b, 0) == (0, False)
    step(conn, [(b, 40)], {"b": [5, 6]})  # a chunked prefill stops short of the tail
    assert conn.get_num_new_matched_tokens(a, 0) == (0, False)  # so `a` leads now


def test_nothing_to_share():
    conn = connector()
    one_past = request("x", list(range(65)))  # the last token starts a block: no tail before it
    assert conn.get_num_new_matched_tokens(one_past, 64) == (0, False)
    resumed = request("y", PROMPT)
    resumed.num_tokens = 75  # preempted with output tokens: vLLM recomputes them, no sharing
    assert conn.get_num_new_matched_tokens(resumed, 0) == (0, False)
    other = request("z", PROMPT)
    other.cache_salt = "salted"
    conn.get_num_new_matched_tokens(request("a", PROMPT), 0)
    assert conn.get_num_new_matched_tokens(other, 64) == (0, False)  # another key: its own source
    other_blocks = connector(spec(), spec(block=64))  # a block index would be other tokens in one group
    assert not other_blocks.enabled
    assert other_blocks.get_num_new_matched_tokens(request("h", PROMPT), 0) == (0, False)


def test_every_group_copies_its_own_block_and_a_window_must_still_hold_it():
    conn = connector(spec(window=40), spec())  # vLLM's hybrid allocator: sliding-window and full groups
    a, b, c = (request(x, PROMPT) for x in "abc")
    conn.get_num_new_matched_tokens(a, 0)
    step(conn, [(a, 70)], {"a": ([0, 2, 3], [4, 5, 6])})
    assert conn.get_num_new_matched_tokens(b, 64) == (5, False)
    b.num_computed_tokens = 69
    assert step(conn, [(b, 1)], {"b": ([0, 2, 7], [4, 5, 8])}) == [(3, 7), (6, 8)]
    a.num_computed_tokens = 105  # its window (40 tokens) now starts past the tail block (64): may be freed
    assert conn.get_num_new_matched_tokens(c, 64) == (0, False)


def test_reset_cache_forgets_every_source():
    conn = connector()
    a, b = request("a", PROMPT), request("b", PROMPT)
    conn.get_num_new_matched_tokens(a, 0)
    step(conn, [(a, 70)], {"a": [1, 2, 3]})
    assert conn.reset_cache() is True  # new weights or another k: the source's KV is stale
    assert conn.get_num_new_matched_tokens(b, 64) == (0, False)
