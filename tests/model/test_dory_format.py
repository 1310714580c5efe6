"""Dory1.0-4B's released checkpoint format is read and written exactly (the config fields and weight names of upstream vLLM's Dory model)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file, save_file

from elr_rl.model import DoryConfig, LoopedForCausalLM

ATTN = ["mixer.q_proj.weight", "mixer.k_proj.weight", "mixer.v_proj.weight", "mixer.g_proj.weight",
        "mixer.o_proj.weight", "mixer.sqk", "mixer.s_gate", "attn_alpha"]
MLP = ["mixer.gate_proj.weight", "mixer.up_proj.weight", "mixer.down_proj.weight", "mixer.suv_gate",
       "mixer.suv_up", "mlp_alpha"]


def released_names(pattern: str) -> set[str]:
    names = {"backbone.embeddings.weight", "lm_head.weight", "lm_head.logit_scale"}
    for i, c in enumerate(pattern):
        names |= {f"backbone.layers.{i}.{n}" for n in (ATTN if c in "S*" else MLP)}
    return names


def dory_shapes(c: DoryConfig) -> dict[str, tuple[int, ...]]:
    """Tensor shapes written from the format's description, independently of the model code."""
    d, V, ff = c.hidden_size, c.vocab_size, c.intermediate_size
    q, kv = c.num_attention_heads * c.attention_head_dim, c.num_key_value_heads * c.attention_head_dim
    shapes = {"backbone.embeddings.weight": (V, d), "lm_head.weight": (V, d), "lm_head.logit_scale": (V,)}
    for i, ch in enumerate(c.hybrid_layer_pattern):
        p = f"backbone.layers.{i}."
        if ch in "S*":
            shapes |= {p + "mixer.q_proj.weight": (q, d), p + "mixer.k_proj.weight": (kv, d),
                       p + "mixer.v_proj.weight": (kv, d), p + "mixer.g_proj.weight": (q, d),
                       p + "mixer.o_proj.weight": (d, q), p + "mixer.sqk": (q,), p + "mixer.s_gate": (q,),
                       p + "attn_alpha": (d,)}
        else:
            shapes |= {p + "mixer.gate_proj.weight": (ff, d), p + "mixer.up_proj.weight": (ff, d),
                       p + "mixer.down_proj.weight": (d, ff), p + "mixer.suv_gate": (ff,),
                       p + "mixer.suv_up": (ff,), p + "mlp_alpha": (d,)}
    return shapes


def test_released_shape_on_meta_has_the_507_released_tensors():
    cfg = DoryConfig()  # defaults are the released model's shape
    with torch.device("meta"):
        model = LoopedForCausalLM(cfg)
    state = model.state_dict()
    assert len(state) == 507
    assert set(state) == released_names(cfg.hybrid_layer_pattern)
    assert {n: tuple(t.shape) for n, t in state.items()} == dory_shapes(cfg)
    n_params = sum(t.numel() for t in state.values())
    assert 3.8e9 < n_params < 4.2e9, n_params
    assert (cfg.n_input_layers, cfg.n_recurrent_layers, cfg.n_output_layers) == (16, 40, 16)


def test_tiny_dory_checkpoint_written_by_hand_loads_runs_and_saves_back(tmp_path):
    cfg = DoryConfig.tiny()
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    cfg.save_pretrained(src)
    g = torch.Generator().manual_seed(0)
    tensors = {}
    for name, shape in dory_shapes(cfg).items():
        t = torch.randn(*shape, generator=g)
        if len(shape) == 2:  # nGPT weights live on the unit sphere
            t = t / t.norm(dim=0 if ("o_proj" in name or "down_proj" in name) else 1, keepdim=True)
        else:
            t = 0.02 + 0.005 * t.abs() if "suv" not in name else 1 + 0.1 * t
        tensors[name] = t.contiguous()
    save_file(tensors, str(src / "model.safetensors"))
    assert json.loads((src / "config.json").read_text())["model_type"] == "dory"

    model = LoopedForCausalLM.from_pretrained(src).eval()
    ids = torch.randint(0, 260, (2, 10))
    outs = [model(ids, k=k) for k in range(1, 5)]
    for k, out in enumerate(outs, start=1):
        assert out.shape == (2, 10, 260) and torch.isfinite(out).all(), k
    assert not torch.allclose(outs[0], outs[3])  # the loop count reaches the model

    model.save_pretrained(dst)
    saved = load_file(str(dst / "model.safetensors"))
    assert {n: tuple(t.shape) for n, t in saved.items()} == dory_shapes(cfg)
    assert all(torch.equal(saved[n], tensors[n]) for n in tensors)
    reloaded_cfg = json.loads((dst / "config.json").read_text())
    original_cfg = json.loads((src / "config.json").read_text())
    reloaded_cfg.pop("transformers_version", None), original_cfg.pop("transformers_version", None)
    assert reloaded_cfg == original_cfg


def test_dory_math_one_sublayer_by_hand():
    """h' = N(N(h) + |alpha * a0/std| * (N(f(h)) - N(h))) for an MLP sublayer, written out."""
    cfg = DoryConfig.tiny()
    torch.manual_seed(1)
    model = LoopedForCausalLM(cfg)
    layer = model.backbone.layers[1]  # pattern "S-S-..." -> index 1 is an MLP
    h = torch.randn(3, cfg.hidden_size)
    N = lambda x: x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)  # noqa: E731
    m = layer.mixer
    d = cfg.hidden_size
    g = (h @ m.gate_proj.weight.T) * m.suv_gate * d**0.5
    u = (h @ m.up_proj.weight.T) * m.suv_up * d**0.5
    f = N(torch.nn.functional.silu(g) * u) @ m.down_proj.weight.T
    lr = (layer.mlp_alpha * cfg.ngpt_alpha_init / cfg.init_method_std).abs()
    want = N(N(h) + lr * (N(f) - N(h)))
    got = layer(h, torch.arange(3), None)
    assert torch.allclose(got, want, atol=1e-5)


def test_a_checkpoint_sharded_by_save_pretrained_loads_as_one(tmp_path):
    """Hugging Face's save_pretrained shards above max_shard_size (5 GB by default: an 8 GB bf16 4B model
    comes as model-0000x-of-0000n.safetensors and an index); the learner, SFT and the RL checks read it."""
    import pytest

    from elr_rl.model.hf import DoryForCausalLM
    from elr_rl.model.safetensors_check import checkpoint_weight_files

    cfg = DoryConfig(vocab_size=64, hidden_size=32, num_hidden_layers=8, intermediate_size=64, num_attention_heads=2,
                     num_key_value_heads=1, attention_head_dim=16, hybrid_layer_pattern="S-*-S-*-", swa_window_size=8,
                     n_input_layers=2, n_recurrent_layers=4, n_output_layers=2, n_recurrent_loops=2)
    torch.manual_seed(0)
    LoopedForCausalLM(cfg).save_pretrained(tmp_path / "one")
    DoryForCausalLM.from_pretrained(tmp_path / "one").save_pretrained(tmp_path / "sharded", max_shard_size="20KB")
    files = checkpoint_weight_files(tmp_path / "sharded")
    assert len(files) > 2 and not (tmp_path / "sharded" / "model.safetensors").exists()
    want = LoopedForCausalLM.from_pretrained(tmp_path / "one").state_dict()
    got = LoopedForCausalLM.from_pretrained(tmp_path / "sharded").state_dict()
    assert want.keys() == got.keys() and all(torch.equal(want[n], got[n]) for n in want)
    (tmp_path / "sharded" / "model.safetensors.index.json").unlink()
    with pytest.raises(ValueError, match="no model.safetensors and no model.safetensors.index.json"):
        LoopedForCausalLM.from_pretrained(tmp_path / "sharded")


def test_head_dim_is_the_released_attention_head_dim_and_adds_no_field():
    cfg = DoryConfig()
    assert cfg.head_dim == cfg.attention_head_dim == 256 and cfg.hidden_size // cfg.num_attention_heads == 160
    assert "head_dim" not in cfg.to_dict()  # config.json keeps the released fields
