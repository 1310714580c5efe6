"""Configs: bad values fail at start-up naming the field; the shipped YAML files load; lr schedules."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from elr_rl.config import load_config
from elr_rl.train.cli import main as train_main
from elr_rl.train.config import ScheduleConfig, TrainConfig
from elr_rl.train.schedule import lr_at

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.mark.parametrize(
    "override,field",
    [
        ("engine.zero_stage=4", "engine.zero_stage"),
        ("loops.force_one_fraction=1.5", "loops.force_one_fraction"),
        ("loops.force_one_fraction=-0.1", "loops.force_one_fraction"),
        ("loops.max_loops=0", "loops.max_loops"),
        ("loops.delay_fraction=2", "loops.delay_fraction"),
        ("data.files=[/nonexistent/corpus.jsonl]", "data.files[0]"),
        ("engine.precision=fp16", "engine.precision"),
        ("dist.launcher=slurm", "dist.launcher"),
        ("schedule.name=step", "schedule.name"),
        ("engine.zero_stage=3 dist.world_size=2", "loops.mode"),
        ("loops.truncated_backprop=0", "loops.truncated_backprop"),
    ],
)
def test_bad_config_names_the_field(override, field):
    with pytest.raises(ValueError, match=re.escape(f"`{field}`")):
        load_config(TrainConfig, CONFIGS / "pretrain_tiny.yaml", override.split())


def test_cli_rejects_bad_config_before_starting(capsys):
    assert train_main(["pretrain", str(CONFIGS / "pretrain_tiny.yaml"), "engine.zero_stage=4"]) == 2
    assert "engine.zero_stage" in capsys.readouterr().err


def test_unknown_key_is_rejected():
    with pytest.raises(ValueError, match="zero_stag"):
        load_config(TrainConfig, CONFIGS / "pretrain_tiny.yaml", ["engine.zero_stag=1"])


@pytest.mark.parametrize("name", sorted(p.name for p in CONFIGS.glob("*.yaml") if p.name.startswith(("pretrain", "sft"))))
def test_shipped_configs_load(name):
    cfg = load_config(TrainConfig, CONFIGS / name, [])
    assert cfg.stage in name


def test_dory_4b_config_has_the_released_shape():
    from elr_rl.train.build import build_model_config

    cfg = load_config(TrainConfig, CONFIGS / "pretrain_dory4b.yaml", [])
    mc = build_model_config(cfg.model, cfg.loops)
    assert (mc.n_input_layers, mc.n_recurrent_layers, mc.n_output_layers) == (16, 40, 16)
    assert mc.hybrid_layer_pattern == "S-S-S-*-" * 9
    assert (mc.num_attention_heads, mc.num_key_value_heads) == (16, 4)
    # what a GPU cluster run needs: activations recomputed, and the cluster's Ray, not a new local one
    assert cfg.engine.activation_checkpointing and cfg.dist.ray_address == "auto"


def test_schedules():
    warm = ScheduleConfig(name="constant", warmup_steps=4)
    assert [lr_at(s, 100, 1.0, warm) for s in range(5)] == [0.25, 0.5, 0.75, 1.0, 1.0]
    cos = ScheduleConfig(name="cosine", warmup_steps=0, min_lr_ratio=0.1)
    assert lr_at(0, 100, 1.0, cos) == pytest.approx(1.0)
    assert lr_at(50, 100, 1.0, cos) == pytest.approx(0.55, abs=0.02)
    assert lr_at(100, 100, 1.0, cos) == pytest.approx(0.1)
    ms = ScheduleConfig(name="minus_sqrt", warmup_steps=0, decay_fraction=0.2, min_lr_ratio=0.0)
    assert lr_at(79, 100, 1.0, ms) == 1.0  # stable phase
    assert lr_at(84, 100, 1.0, ms) == pytest.approx(1 - (5 / 20) ** 0.5)  # 1 - sqrt cooldown
    assert lr_at(99, 100, 1.0, ms) == pytest.approx(0.0)
    lin = ScheduleConfig(name="linear", warmup_steps=0, min_lr_ratio=0.0)
    assert lr_at(25, 100, 2.0, lin) == pytest.approx(1.5)


def test_model_override_typo_names_the_field():
    from elr_rl.train.build import build_model_config

    cfg = load_config(TrainConfig, CONFIGS / "pretrain_tiny.yaml", ["model.overrides.hiden_size=32"])
    with pytest.raises(ValueError, match=re.escape("`model.overrides.hiden_size`")):
        build_model_config(cfg.model, cfg.loops)
    dory = load_config(TrainConfig, CONFIGS / "pretrain_tiny_dory.yaml", [])
    assert build_model_config(dory.model, dory.loops).loop_spec().backbone == "ngpt"


def test_ray_ranks_get_absolute_paths(tmp_path, monkeypatch):
    """A rank actor's working directory is its own: the launcher hands it absolute paths (its own config untouched)."""
    from elr_rl.train.ray_ranks import with_absolute_paths

    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs.txt").write_text("a document\n")
    cfg = load_config(TrainConfig, CONFIGS / "pretrain_tiny.yaml", ["run.output_dir=runs/x", "data.files=[docs.txt]"])
    out = with_absolute_paths(cfg)
    assert out.run.output_dir == str(tmp_path / "runs" / "x") and out.data.files == [str(tmp_path / "docs.txt")]
    assert cfg.run.output_dir == "runs/x" and cfg.data.files == ["docs.txt"]
