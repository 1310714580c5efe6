"""The two backbones, one small class each (like the update rules), picked once from `spec.backbone`.

| backbone | sublayer | after the output block | head | after every optimizer step |
| --- | --- | --- | --- | --- |
| `prenorm` (ELR) | `h + f(RMSNorm(h))` | RMSNorm | `h W^T` | nothing |
| `ngpt` (Dory) | `N(N(h) + abs(alpha) (N(f(h)) - N(h)))` | nothing (h is on the sphere) | `h W^T * logit_scale / std` | weight vectors back on the unit sphere |

The PyTorch model (`modeling`), the vLLM model (`vllm_model`) and the training engine ask the
backbone object, never the string.
"""

from __future__ import annotations

import abc
import functools
from typing import Callable, ClassVar

import torch
from torch import nn

from elr_rl.model.config import LoopSpec
from elr_rl.model.layers import NgptSublayer, PrenormSublayer, RMSNorm
from elr_rl.model.loop import justnorm


class LMHead(nn.Module):
    """logits = h W^T (float32)."""

    def __init__(self, spec: LoopSpec) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(spec.vocab_size, spec.hidden_size))

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return (h @ self.weight.t()).float()


class NgptLMHead(LMHead):
    """logits = lm_head(h) * logit_scale / std (Dory; no final norm)."""

    def __init__(self, spec: LoopSpec) -> None:
        super().__init__(spec)
        self.logit_scale = nn.Parameter(torch.full((spec.vocab_size,), spec.init_std))
        self.std = spec.init_std

    def forward(self, h):
        return (h @ self.weight.t()).float() * (self.logit_scale.float() / self.std)


class BackboneVariant(abc.ABC):
    """What differs between backbones: the sublayer wrapper, the final norm, the head, and whether
    weights are renormalised after every optimizer step."""

    name: ClassVar[str]
    unit_norm_weights: ClassVar[bool] = False
    """True when `normalize_weights_` must run after every optimizer step."""

    @abc.abstractmethod
    def sublayer(self, spec: LoopSpec, layer: int) -> nn.Module:
        """The wrapper around sublayer `layer` (residual and norms)."""

    def final_norm(self, spec: LoopSpec) -> nn.Module | None:
        return None

    def lm_head(self, spec: LoopSpec) -> LMHead:
        return LMHead(spec)

    def weight_rule(self, name: str, param: torch.Tensor) -> Callable[[torch.Tensor], torch.Tensor] | None:
        """What `normalize_weights_` makes of this parameter (a function of its value), or None if nothing.
        One parameter at a time: a training engine applies it to each fp32 master in turn."""
        return None

    def normalize_weights_(self, model: nn.Module) -> None:
        """Put the weights back where the backbone keeps them (in place, no gradients)."""
        for name, p in model.named_parameters():
            rule = self.weight_rule(name, p)
            if rule is not None:
                p.copy_(rule(p))


class Prenorm(BackboneVariant):
    """Pre-norm residual sublayers, an RMSNorm after the output block, a plain head."""

    name = "prenorm"

    def sublayer(self, spec, layer):
        return PrenormSublayer(spec, layer)

    def final_norm(self, spec):
        return RMSNorm(spec.hidden_size, spec.norm_eps)


# nGPT keeps weight vectors on the unit sphere along the embedding dimension:
# input-side projections normalise rows (dim 1), output-side ones columns (dim 0).
_NGPT_ROW = ("q_proj", "k_proj", "v_proj", "g_proj", "gate_proj", "up_proj", "embeddings", "lm_head")
_NGPT_COL = ("o_proj", "down_proj")


class Ngpt(BackboneVariant):
    """nGPT (Dory): normalised steps on the unit sphere, a scaled head, unit-norm weight vectors."""

    name = "ngpt"
    unit_norm_weights = True

    def sublayer(self, spec, layer):
        return NgptSublayer(spec, layer)

    def lm_head(self, spec):
        return NgptLMHead(spec)

    @torch.no_grad()
    def weight_rule(self, name, param):
        if param.dim() != 2:
            return None
        if any(f"{t}." in name or name.startswith(t) for t in _NGPT_ROW):
            return functools.partial(justnorm, dim=1)
        if any(f"{t}." in name for t in _NGPT_COL):
            return functools.partial(justnorm, dim=0)
        return None


VARIANTS: dict[str, type[BackboneVariant]] = {v.name: v for v in (Prenorm, Ngpt)}


def make_backbone_variant(name: str) -> BackboneVariant:
    if name not in VARIANTS:
        raise ValueError(f"unknown backbone {name!r}; choose one of {', '.join(VARIANTS)}")
    return VARIANTS[name]()
