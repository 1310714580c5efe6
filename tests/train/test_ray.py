"""Training ranks as Ray actors with a torch.distributed rendezvous (gloo), on the nGPT (Dory) format."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

pytestmark = pytest.mark.slow

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "pretrain_tiny_dory.yaml"


def test_two_ray_actor_ranks_train_dory_format_and_keep_ngpt_weights_normalised(tmp_path):
    from elr_rl.config import load_config
    from elr_rl.model import LoopedForCausalLM
    from elr_rl.train.config import TrainConfig
    from elr_rl.train.launch import launch

    cfg = load_config(TrainConfig, CONFIG, [
        "dist.launcher=ray", "dist.world_size=2",
        "engine.zero_stage=1", "engine.micro_batch_size=2", "engine.grad_accum_steps=1", "data.seq_len=32",
        "run.total_steps=3", "run.eval_interval=0", "run.eval_batches=1", "run.progress=false",
        f"run.output_dir={tmp_path}",
    ])
    summary = launch(cfg)
    assert summary["step"] == 3
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    steps = [m for m in lines if "loss/mean" in m]
    assert len(steps) == 3 and all(len(m["loops/ks"]) == 2 for m in steps)  # both actors trained every step
    model = LoopedForCausalLM.from_pretrained(summary["checkpoint"])
    q = dict(model.named_parameters())["backbone.layers.0.mixer.q_proj.weight"]
    torch.testing.assert_close(q.norm(dim=1), torch.ones(q.shape[0]), atol=1e-4, rtol=0)
