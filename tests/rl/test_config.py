"""RL configs fail at start-up with a message naming the field."""

import pytest

from elr_rl.config import load_config
from elr_rl.rl.config import RLConfig


@pytest.fixture
def ckpt(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    return str(tmp_path)


@pytest.mark.parametrize("override, field", [
    ("learner.engine.zero_stage=3", "learner.engine.zero_stage"),
    ("rollout.group_size=1", "rollout.group_size"),
    ("rollout.gpu_memory_utilization=0", "rollout.gpu_memory_utilization"),
    ("rollout.cpu_attention=fast", "rollout.cpu_attention"),
    ("algo.aggregation=group", "algo.aggregation"),
    ("async_.mode=eventually", "async_.mode"),
    ("curriculum.alpha=1.5", "curriculum.alpha"),
    ("learner.max_microbatch_tokens=256", "learner.max_microbatch_tokens"),  # below max_seq_len (512)
    ("learner.borrow_idle_cores=true", "learner.borrow_idle_cores"),  # one CPU rank only (here: 2)
])
def test_bad_values_name_the_field(ckpt, override, field):
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        load_config(RLConfig, None, [f"model_path={ckpt}", "learner.world_size=2", override])


def test_missing_checkpoint_is_refused(tmp_path):
    with pytest.raises(ValueError, match="model_path"):
        load_config(RLConfig, None, [f"model_path={tmp_path / 'nope'}"])


def test_shipped_configs_load(ckpt):
    for path in ("configs/rl_tiny.yaml", "configs/rl_dory4b.yaml"):
        cfg = load_config(RLConfig, path, [f"model_path={ckpt}"])
        assert cfg.learner.world_size >= 1
        if "dory4b" in path:  # 8,192-token rows through up to 192 sublayers: activations are recomputed
            assert cfg.learner.engine.activation_checkpointing
