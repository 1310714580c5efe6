"""The backbone is an object picked once from the config; its parts are what the config promises."""

import pytest
import torch

from elr_rl.model.backbones import VARIANTS, make_backbone_variant
from elr_rl.model.config import BACKBONES, UPDATE_RULES, ElrConfig
from elr_rl.model.modeling import LoopedForCausalLM

TINY = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_attention_heads=2, num_key_value_heads=1,
            n_input_layers=1, n_recurrent_layers=1, n_output_layers=1, max_loops=3, num_loops=2)


def test_every_config_backbone_has_a_class_and_every_update_rule_a_backbone():
    assert set(BACKBONES) == set(VARIANTS)
    assert sorted(r for rules in BACKBONES.values() for r in rules) == sorted(UPDATE_RULES)
    with pytest.raises(ValueError, match="unknown backbone 'postnorm'"):
        make_backbone_variant("postnorm")


def test_ngpt_puts_weights_back_on_the_sphere_and_prenorm_leaves_them():
    for backbone, rule, unit in (("ngpt", "ngpt", True), ("prenorm", "adaptive_delta", False)):
        model = LoopedForCausalLM(ElrConfig(**TINY, backbone=backbone, update_rule=rule))
        assert model.backbone.variant.unit_norm_weights is unit
        assert (model.backbone.final_norm is None) is unit
        with torch.no_grad():
            for p in model.parameters():
                p.mul_(3.0)
        before = {n: p.clone() for n, p in model.named_parameters()}
        model.normalize_weights_()
        q = model.backbone.layers[0].mixer.q_proj.weight
        if unit:
            torch.testing.assert_close(q.norm(dim=1), torch.ones(q.shape[0]))
            torch.testing.assert_close(model.lm_head.weight.norm(dim=1), torch.ones(model.lm_head.weight.shape[0]))
        else:
            assert all(torch.equal(before[n], p) for n, p in model.named_parameters())
