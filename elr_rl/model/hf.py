"""transformers interop: `AutoModelForCausalLM.from_pretrained(ckpt)` returns the looped model.

After `import elr_rl.model`, both checkpoint formats are registered with transformers'
Auto classes (`elr_looped` -> `ElrForCausalLM`, `dory` -> `DoryForCausalLM`), so HF
tools (pipelines, `generate()`, lm-evaluation-harness's `hf` model) can evaluate a
checkpoint at any loop count:

    import elr_rl.model
    from transformers import AutoModelForCausalLM, AutoTokenizer
    model = AutoModelForCausalLM.from_pretrained(ckpt, num_loops=3)   # Dory: n_recurrent_loops=3
    model.set_num_loops(4)                                             # or per call: model(ids, k=4)

The HF classes hold the very modules of `LoopedForCausalLM` under the same names
(`backbone.*`, `lm_head.*`), so logits are the project's. Generation recomputes the
whole prefix every step (no HF KV cache): exact for every k, slower than the
project's cached `generate()` or vLLM.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, GenerationMixin, PreTrainedModel
from transformers.modeling_outputs import CausalLMOutput

from elr_rl.model.config import DoryConfig, ElrConfig
from elr_rl.model.modeling import LoopedForCausalLM


class _LoopedHF(PreTrainedModel, GenerationMixin):
    base_model_prefix = "backbone"
    main_input_name = "input_ids"
    _supports_cache_class = False

    def __init__(self, config) -> None:
        super().__init__(config)
        core = LoopedForCausalLM(config)  # the project's module tree and initialisation
        self.backbone, self.lm_head, self.spec = core.backbone, core.lm_head, core.spec
        self.generation_config = GenerationConfig(use_cache=False)

    def _init_weights(self, module: torch.nn.Module) -> None:
        """Weights come from LoopedForCausalLM's own initialisation or the checkpoint: nothing to do."""

    # ------------------------------------------------------------------ loops
    @property
    def num_loops(self) -> int:
        return int(self.config.num_loops)

    def set_num_loops(self, k: int) -> None:
        """Default loop count of later calls (checked against max_loops)."""
        k = LoopedForCausalLM._check_k(self, k)
        setattr(self.config, "num_loops" if isinstance(self.config, ElrConfig) else "n_recurrent_loops", k)
        self.spec = self.config.loop_spec()

    def _check_k(self, k: int | None) -> int:
        return LoopedForCausalLM._check_k(self, k)

    # ------------------------------------------------------------------ forward
    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, k: int | None = None, **_: Any) -> CausalLMOutput:
        """Logits [B, T, V] at loop count k (default: the config's). Left padding is handled by
        positions that start at each row's first real token and a padding segment nobody attends to."""
        k = self._check_k(k if k is not None else self.num_loops)
        positions = segments = None
        if attention_mask is not None and not bool(attention_mask.all()):
            mask = attention_mask.long()
            positions = (mask.cumsum(-1) - 1).clamp(min=0)
            segments = mask  # 0: padding, 1: the row's tokens (attention never crosses segments)
        logits = LoopedForCausalLM.forward(self, input_ids, k=k, positions=positions, segment_ids=segments)
        loss = None
        if labels is not None:
            loss = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(),
                                                     ignore_index=-100)
        return CausalLMOutput(loss=loss, logits=logits)

    def prepare_inputs_for_generation(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                                      **kwargs: Any) -> dict[str, Any]:
        return {"input_ids": input_ids, "attention_mask": attention_mask}

    def get_input_embeddings(self) -> torch.nn.Module:
        return self.backbone.embeddings

    # ------------------------------------------------------------------ loading
    @classmethod
    def from_pretrained(cls, path: str | Path, *args: Any, config: Any = None, dtype: Any = None,
                        torch_dtype: Any = None, **kwargs: Any) -> "_LoopedHF":
        """Load a checkpoint folder (config.json + model.safetensors); config fields in kwargs
        (e.g. num_loops=3) override the saved ones, as with any HF model."""
        from elr_rl.model.config import config_from_dict

        path = Path(path)
        if config is None:
            d = json.loads((path / "config.json").read_text())
            d.update({key: kwargs.pop(key) for key in list(kwargs) if key in d or key in _LOOP_KEYS})
            config = config_from_dict(d)
        looped = LoopedForCausalLM.from_pretrained(path)
        with torch.device("meta"):
            model = cls(config)
        model.backbone, model.lm_head = looped.backbone, looped.lm_head
        model.spec = config.loop_spec()
        if (path / "generation_config.json").is_file():
            model.generation_config = GenerationConfig.from_pretrained(str(path))
            model.generation_config.use_cache = False
        dtype = dtype or torch_dtype
        if isinstance(dtype, str) and dtype != "auto":
            dtype = getattr(torch, dtype)
        return model.to(dtype) if isinstance(dtype, torch.dtype) else model


_LOOP_KEYS = ("num_loops", "n_recurrent_loops", "kv_cache_mode", "recurrent_kv_cache_mode")


class ElrForCausalLM(_LoopedHF):
    config_class = ElrConfig


class DoryForCausalLM(_LoopedHF):
    config_class = DoryConfig

    @property
    def num_loops(self) -> int:
        return int(self.config.n_recurrent_loops)


def register_auto_model() -> None:
    """AutoModelForCausalLM learns both formats (idempotent)."""
    from transformers import AutoModelForCausalLM

    for cfg, cls in ((ElrConfig, ElrForCausalLM), (DoryConfig, DoryForCausalLM)):
        try:
            AutoModelForCausalLM.register(cfg, cls)
        except ValueError:
            pass  # already registered
