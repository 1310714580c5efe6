"""Model config, model and tokenizer from a `ModelSpec` (preset or checkpoint, plus overrides)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from elr_rl.train.config import LoopConfig, ModelSpec


def _loop_overrides(spec: ModelSpec, loops: LoopConfig) -> dict[str, Any]:
    """Model fields the loop config sets: K (under each format's own name) and truncated backprop."""
    over = dict(spec.overrides)
    if loops.max_loops is not None:
        over["max_loops" if spec.family == "elr" else "max_recurrent_loops"] = loops.max_loops
    if loops.truncated_backprop is not None:
        over["truncated_backprop"] = loops.truncated_backprop
    return over


def _check_override_names(cls: type, over: dict[str, Any]) -> None:
    from elr_rl.model.config import check_overrides

    check_overrides(cls, over, "model.overrides.")


def build_model_config(spec: ModelSpec, loops: LoopConfig):
    """ElrConfig / DoryConfig from a preset (or a checkpoint's config.json) with overrides applied."""
    from elr_rl.model import DoryConfig, ElrConfig, config_from_dict

    over = _loop_overrides(spec, loops)
    if spec.init_from is not None:
        d = json.loads((Path(spec.init_from) / "config.json").read_text())
        _check_override_names(type(config_from_dict(dict(d))), over)
        d.update(over)
        return config_from_dict(d)
    cls = ElrConfig if spec.family == "elr" else DoryConfig
    _check_override_names(cls, over)
    if spec.preset == "default":
        return cls(**over)
    preset = getattr(cls, spec.preset, None)
    if not callable(preset):
        raise ValueError(f"config field `model.preset`: {cls.__name__} has no preset {spec.preset!r}; use 'tiny' or 'default'")
    return preset(**over)


def build_model(spec: ModelSpec, model_cfg: Any, seed: int) -> torch.nn.Module:
    """A fresh model (seeded, identical on every rank) or one loaded from `spec.init_from`."""
    from elr_rl.model import LoopedForCausalLM
    from elr_rl.model.safetensors_check import load_checkpoint_weights

    torch.manual_seed(seed)
    model = LoopedForCausalLM(model_cfg)
    if spec.init_from is not None:
        state = load_checkpoint_weights(spec.init_from)
        missing, unexpected = model.load_state_dict(state, strict=False)
        if missing or unexpected:
            raise ValueError(
                f"config field `model.init_from`: checkpoint does not match the model (missing {missing[:5]}, "
                f"unexpected {unexpected[:5]}); do not override shape fields when starting from a checkpoint"
            )
    return model


def build_codec_for(spec: ModelSpec, chat: Any, vocab_size: int):
    """The text codec of the run: `model.tokenizer`, else init_from's, else the byte-level tokenizer."""
    from elr_rl.text import TextCodec

    folder = spec.tokenizer or spec.init_from
    codec = TextCodec.byte_level(chat) if folder is None else TextCodec.load(folder, chat)
    if codec.vocab_size > vocab_size:
        raise ValueError(f"config field `model.overrides.vocab_size`: the tokenizer of {codec.source} has "
                         f"{codec.vocab_size} tokens but the model only {vocab_size}; raise vocab_size")
    return codec
