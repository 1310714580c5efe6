"""A Dory1.0-format checkpoint (nGPT backbone) served by vLLM equals the PyTorch model, k = 1..4."""

from __future__ import annotations

import pytest

from tests.rollout.conftest import PROMPTS, dory_config, save_random
from tests.rollout.helpers import TOL, sampled_vs_teacher_forced

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory, engine_factory):
    path = tmp_path_factory.mktemp("dory_per_loop")
    # heads of 32 at hidden 64 (4 heads): as in the released model (16 x 256 at 2560), head size != hidden / heads
    model = save_random(dory_config(recurrent_kv_cache_mode="per_loop", attention_head_dim=32), path, seed=2)
    engine = engine_factory(path, k=4, mode="per_loop")
    yield {"engine": engine, "model": model}
    engine.shutdown()


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_dory_logprobs_equal_teacher_forced(served, k):
    served["engine"].set_k(k)
    groups = served["engine"].generate(PROMPTS, n=2, max_tokens=12, temperature=1.0, return_prompt_logprobs=True)
    prompt_gap, sampled_gap = sampled_vs_teacher_forced(served["model"], groups, k)
    assert prompt_gap <= TOL and sampled_gap <= TOL, f"k={k}: gaps {prompt_gap}, {sampled_gap}"


def test_dory_kv_cache_grows_with_k(served):
    per_token = [served["engine"].kv_bytes_per_token(k) for k in (1, 2, 3, 4)]
    steps = {b - a for a, b in zip(per_token, per_token[1:])}
    assert len(steps) == 1 and steps.pop() > 0, f"per_loop KV bytes/token should grow linearly in k: {per_token}"


def test_vllm_reads_the_dory_head_size(served):
    """vLLM's model-level head size (attention backends, KV page sizes) is attention_head_dim, not hidden / heads."""
    assert served["engine"].llm.llm_engine.vllm_config.model_config.get_head_size() == 32
