"""Engine fixtures: each test module builds its one engine once and shuts it down at the end."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model import DoryConfig, ElrConfig, LoopedForCausalLM
from tests.rollout.helpers import randomize_

# Two prompts longer than the sliding window (16) so windowed attention is exercised.
PROMPTS = [list(range(3, 40)), [257, 5, 9, 77, 1, 200, 13, 13, 42, 8, 99, 150, 3, 64, 31, 7, 18, 2, 11, 250]]


def elr_config(**overrides) -> ElrConfig:
    """Every ELR feature at once: adaptive delta, pre-norm, conditioning, SWA/full interleave, output gate."""
    base = dict(
        n_input_layers=1, n_recurrent_layers=2, n_output_layers=1, max_loops=4, num_loops=4,
        update_rule="adaptive_delta", backbone="prenorm", loop_conditioning=True,
        attention_pattern="swa_interleave", swa_window_size=16, attention_output_gate=True,
    )
    base.update(overrides)
    return ElrConfig.tiny(**base)


def dory_config(**overrides) -> DoryConfig:
    """Dory1.0 format (nGPT, gates, S-S-S-*- pattern) with a window shorter than the prompts."""
    return DoryConfig.tiny(swa_window_size=16, **overrides)


def save_random(config, path, seed: int) -> LoopedForCausalLM:
    torch.manual_seed(seed)
    model = randomize_(LoopedForCausalLM(config), seed)
    model.save_pretrained(path)
    return model


@pytest.fixture(scope="session")
def engine_factory():
    """Build RolloutEngines; every engine built is shut down when its module ends (see `module_engine`)."""
    from elr_rl.rollout import EngineOptions, RolloutEngine

    def build(path, k, mode, **opts):
        return RolloutEngine(path, k=k, cache_mode=mode, dtype="float32", seed=0,
                             options=EngineOptions(**{"max_model_len": 128, "max_num_seqs": 8, **opts}))

    return build
