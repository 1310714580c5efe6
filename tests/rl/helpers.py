"""Helpers of the RL and cluster tests."""

from __future__ import annotations

from elr_rl.rl.config import RLConfig


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
    cfg.learner.optim.lr = 5e-4
    cfg.algo.groups_per_step = 8
    for section, values in sections.items():
        for key, value in values.items():
            setattr(getattr(cfg, section), key, value)
    cfg.validate()
    return cfg
