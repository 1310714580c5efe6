"""The looped (elastic-depth) language model: configs, PyTorch model, tokenizer."""

from elr_rl.model.config import DoryConfig, ElrConfig, LoopSpec, config_from_dict
from elr_rl.model.modeling import LoopedForCausalLM
from elr_rl.model.tokenizer import VOCAB_SIZE, build_tokenizer, load_tokenizer, save_tokenizer

__all__ = [
    "DoryConfig", "ElrConfig", "LoopSpec", "LoopedForCausalLM", "config_from_dict",
    "build_tokenizer", "load_tokenizer", "save_tokenizer", "VOCAB_SIZE",
]


def _register_auto_classes() -> None:
    """Let transformers' AutoConfig read our config.json files (vLLM loads configs through it)."""
    from transformers import AutoConfig

    for cfg in (ElrConfig, DoryConfig):
        try:
            AutoConfig.register(cfg.model_type, cfg)
        except ValueError:
            pass  # already registered (or transformers ships its own class for this model_type)


_register_auto_classes()


def _register_auto_model() -> None:
    """AutoModelForCausalLM.from_pretrained(ckpt) returns the looped model (elr_rl.model.hf)."""
    from elr_rl.model.hf import register_auto_model

    register_auto_model()


_register_auto_model()
