"""Shared fixtures of the RL integration tests: one toy checkpoint and one Ray cluster per session."""

from __future__ import annotations

import os

import pytest

from elr_rl.rl.config import RLConfig


@pytest.fixture(scope="session")
def toy_checkpoint(tmp_path_factory):
    """A tiny model that learned even_odd's answer format, and its answers a little better than chance."""
    import torch

    from elr_rl.rl.toy import format_sft_checkpoint

    torch.set_num_threads(1)
    return format_sft_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt", steps=150, warm_steps=30)


@pytest.fixture(scope="session")
def ray_cluster():
    import ray

    os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()


def make_config(ckpt, run_dir, **sections) -> RLConfig:
    cfg = RLConfig(model_path=str(ckpt))
    cfg.run.output_dir = str(run_dir)
    cfg.run.progress = False
    cfg.run.save_interval = 1000
    cfg.envs.names = ["even_odd"]
    cfg.envs.num_seeds = 64
    cfg.rollout.group_size = 8
    cfg.rollout.max_new_tokens = 24
    cfg.rollout.max_model_len = 128
    cfg.learner.engine.accelerator = "cpu"
    cfg.learner.optim.lr = 7e-4
    cfg.algo.groups_per_step = 8
    for section, values in sections.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    cfg.validate()
    return cfg
