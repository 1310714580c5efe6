"""last_loop vLLM engine == the PyTorch model's last_loop decoding; its gap to teacher forcing is logged."""

from __future__ import annotations

import pytest
import torch

from tests.rollout.conftest import PROMPTS, elr_config, save_random
from tests.rollout.helpers import TOL, cached_decode, max_diff, teacher_forced

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory, engine_factory):
    path = tmp_path_factory.mktemp("elr_last_loop")
    model = save_random(elr_config(kv_cache_mode="last_loop"), path, seed=3)
    threads, set_threads = torch.get_num_threads(), torch.set_num_threads
    engine = engine_factory(path, k=1, mode="last_loop")
    yield {"engine": engine, "model": model}
    engine.shutdown()
    # An in-process CPU engine runs torch single-threaded and vLLM stubs torch.set_num_threads: both undone.
    assert torch.set_num_threads is set_threads and torch.get_num_threads() == threads


def test_engine_options_follow_the_mode(served):
    config = served["engine"].llm.llm_engine.vllm_config
    assert not config.scheduler_config.enable_chunked_prefill
    assert config.scheduler_config.max_num_batched_tokens >= config.model_config.max_model_len
    assert not config.cache_config.enable_prefix_caching


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_sampled_logprobs_equal_pytorch_last_loop(served, k, record_property):
    engine, model = served["engine"], served["model"]
    engine.set_k(k)
    groups = engine.generate(PROMPTS, n=2, max_tokens=12, temperature=1.0, return_prompt_logprobs=True)
    decode_gap = tf_gap = 0.0
    for g in groups:
        P = len(g.prompt_token_ids)
        for c in g.completions:
            pytorch_last_loop = cached_decode(model, g.prompt_token_ids, c.token_ids, k, "last_loop")
            decode_gap = max(decode_gap, max_diff(c.logprobs, pytorch_last_loop))
            tf = teacher_forced(model, g.prompt_token_ids + c.token_ids, k)
            # The whole prompt is prefilled in one step, so prompt logprobs are teacher-forced in both modes.
            assert max_diff(g.prompt_logprobs, tf[: P - 1]) <= TOL
            tf_gap = max(tf_gap, max_diff(c.logprobs, tf[P - 1 :]))
    record_property(f"last_loop_gap_to_teacher_forced_k{k}", tf_gap)
    print(f"\nk={k}: vLLM vs PyTorch last_loop {decode_gap:.2e}; last_loop vs teacher-forced gap {tf_gap:.3f} nats")
    assert decode_gap <= TOL, f"k={k}: vLLM last_loop differs from PyTorch last_loop by {decode_gap}"
    if k == 1:
        assert tf_gap <= TOL  # one loop: last loop == every loop
    else:
        assert tf_gap > 1e-3, "k>1 last_loop should differ from teacher forcing (the gap the learner corrects)"


def test_last_loop_kv_cache_flat_in_k(served):
    per_token = [served["engine"].kv_bytes_per_token(k) for k in (1, 2, 3, 4)]
    assert len(set(per_token)) == 1 and per_token[0] > 0, per_token
