"""A bf16 CPU engine runs RMSNorm and rotary on the one-pass kernels, with PyTorch's results."""

from __future__ import annotations

import pytest
import torch

from tests.rollout.conftest import PROMPTS, elr_config, save_random

pytestmark = pytest.mark.slow


def _fused(worker) -> int:
    return worker.model_runner.get_model().fused_elementwise


def _unfuse(worker) -> int:
    from elr_rl.model import cpu_elementwise

    model = worker.model_runner.get_model()
    model.fused_elementwise = 0
    return cpu_elementwise.unfuse(model.backbone)


def test_fused_elementwise_keeps_the_engines_logprobs(tmp_path):
    from elr_rl.model import cpu_attention
    from elr_rl.rollout import EngineOptions, RolloutEngine

    save_random(elr_config(kv_cache_mode="per_loop"), tmp_path, seed=3)
    engine = RolloutEngine(tmp_path, k=2, cache_mode="per_loop", dtype="bfloat16", seed=0,
                           options=EngineOptions(max_model_len=128, max_num_seqs=8))
    try:
        fused = engine.llm.collective_rpc(_fused)[0]
        kernels = cpu_attention.load()
        if engine.platform != "cpu" or kernels is None or not kernels.vectorised_bf16():
            assert fused == 0  # the kernels run where they are built with AVX-512 only
            return
        assert fused > 0
        (p_fused, g_fused) = _run(engine)
        assert engine.llm.collective_rpc(_unfuse)[0] == fused  # PyTorch's modules from here on, same engine
        (p_plain, g_plain) = _run(engine)
        flat = [(a, b) for x, y in zip(p_fused, p_plain) for a, b in zip(x, y)]
        assert len(flat) == sum(len(p) - 1 for p in PROMPTS)
        assert max(abs(a - b) for a, b in flat) < 0.05  # RMSNorm's sum order may move a bf16 value by one unit
        assert sum(a == b for a, b in flat) >= 0.9 * len(flat)
        assert [t for t, _ in g_fused] == [t for t, _ in g_plain]
    finally:
        engine.shutdown()



def _run(engine):
    """Teacher-forced prompt logprobs and greedy completions, from a cold prefix cache."""
    engine.drop_cached_prefixes()
    prompt = engine.prompt_logprobs(PROMPTS)
    groups = engine.generate(PROMPTS, n=1, max_tokens=8, temperature=0.0)
    return prompt, [(g.completions[0].token_ids, g.completions[0].logprobs) for g in groups]
