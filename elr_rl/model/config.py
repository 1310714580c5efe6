"""Model configs: Hugging Face `PretrainedConfig` subclasses, so checkpoints are normal HF folders.

Two formats share one model implementation (`LoopedForCausalLM`):

* `ElrConfig` (model_type "elr_looped"): the ELR-style looped transformer with
  every knob of this project (update rules, pre-norm or nGPT backbone, loop
  conditioning, attention pattern, output gate, KV-cache mode, truncated backprop).
  Layer counts are in transformer *blocks* (attention + MLP).
* `DoryConfig` (model_type "dory"): NVIDIA Dory1.0-4B's released format, read
  and written field for field. Layer counts are in *sublayers* (one attention or
  one MLP each), as in Dory's `hybrid_layer_pattern`.

The model never reads either config directly: both produce a `LoopSpec`, the
normalised description (a flat list of sublayers split into input, recurrent
and output ranges) that the PyTorch and vLLM implementations build from.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum

from transformers import PretrainedConfig

UPDATE_RULES = ("replace", "residual", "delta", "adaptive_delta", "ngpt")
# Each backbone (elr_rl.model.backbones) and the update rules it goes with: nGPT keeps states on the
# unit sphere, so it takes its own rule and no other backbone does.
BACKBONES = {"prenorm": ("replace", "residual", "delta", "adaptive_delta"), "ngpt": ("ngpt",)}
ATTENTION_PATTERNS = ("full", "swa_interleave")
class CacheMode(StrEnum):
    """How the recurrent block's KV cache is kept across loops (checked here; every other module uses these)."""

    PER_LOOP = "per_loop"  # one cache per loop: decoding equals teacher-forced loops
    LAST_LOOP = "last_loop"  # one cache, written by the last loop: 1/k of the cache, a different distribution


KV_CACHE_MODES = tuple(m.value for m in CacheMode)
INITIAL_STATES = ("input_copy", "zeros")


@dataclass(frozen=True)
class LoopSpec:
    """What the model builds: format-independent, derived from a config."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    pattern: str  # one char per sublayer: "S" sliding-window attention, "*" full attention, "-" MLP
    n_in: int  # sublayers in the input block
    n_rec: int  # sublayers in the recurrent block
    n_out: int  # sublayers in the output block
    rope_thetas: tuple[float, ...]  # per sublayer (ignored for MLP sublayers)
    rotary_fractions: tuple[float, ...]  # per sublayer: share of head_dim that is rotated
    swa_window: int
    backbone: str
    update_rule: str
    loop_conditioning: bool
    output_gate: bool
    initial_state: str
    max_loops: int
    num_loops: int
    kv_cache_mode: str
    truncated_backprop: int | None
    init_std: float
    norm_eps: float
    ngpt_alpha_init: float
    gate_logit_scale_init: float

    @property
    def num_sublayers(self) -> int:
        return len(self.pattern)

    def is_attention(self, i: int) -> bool:
        return self.pattern[i] in "S*"

    def effective_depth(self, k: int) -> int:
        """D_eff(k) = L_in + k * L_rec + L_out, in sublayers."""
        return self.n_in + k * self.n_rec + self.n_out


def _err(field: str, msg: str) -> ValueError:
    return ValueError(f"config field `{field}`: {msg}")


def _check_common(hidden: int, heads: int, kv_heads: int, head_dim: int, n_rec: int, K: int, k: int) -> None:
    if kv_heads < 1 or heads % kv_heads != 0:
        raise _err(
            "num_key_value_heads", f"{kv_heads} KV heads must divide num_attention_heads {heads}: pick a divisor of it"
        )
    if n_rec < 1:
        raise _err("n_recurrent_layers", f"must be >= 1 (got {n_rec}): a looped model needs a recurrent block")
    if K < 1:
        raise _err("max_loops", f"must be >= 1 (got {K})")
    if not 1 <= k <= K:
        raise _err("num_loops", f"the default loop count k={k} must be in 1..max_loops={K}")


class ElrConfig(PretrainedConfig):
    """The ELR looped transformer. Layer counts are transformer blocks (attention + MLP)."""

    model_type = "elr_looped"

    def __init__(
        self,
        vocab_size: int = 260,
        hidden_size: int = 64,
        intermediate_size: int = 176,
        num_attention_heads: int = 4,
        num_key_value_heads: int = 2,
        head_dim: int | None = None,
        n_input_layers: int = 1,
        n_recurrent_layers: int = 1,
        n_output_layers: int = 1,
        max_loops: int = 4,
        num_loops: int = 4,
        update_rule: str = "adaptive_delta",
        backbone: str = "prenorm",
        loop_conditioning: bool = False,
        attention_pattern: str = "full",
        swa_window_size: int = 64,
        rope_theta: float = 10000.0,
        rope_theta_2: float = 1000000.0,
        attention_output_gate: bool = False,
        kv_cache_mode: str = "per_loop",
        truncated_backprop: int | None = None,
        initial_state: str = "input_copy",
        max_position_embeddings: int = 2048,
        init_std: float = 0.02,
        rms_norm_eps: float = 1e-6,
        ngpt_alpha_init: float = 0.05,
        bos_token_id: int = 257,
        eos_token_id: int = 258,
        pad_token_id: int = 256,
        **kwargs,
    ) -> None:
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.intermediate_size = intermediate_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.head_dim = head_dim
        self.n_input_layers = n_input_layers
        self.n_recurrent_layers = n_recurrent_layers
        self.n_output_layers = n_output_layers
        self.max_loops = max_loops
        self.num_loops = num_loops
        self.update_rule = update_rule
        self.backbone = backbone
        self.loop_conditioning = loop_conditioning
        self.attention_pattern = attention_pattern
        self.swa_window_size = swa_window_size
        self.rope_theta = rope_theta
        self.rope_theta_2 = rope_theta_2
        self.attention_output_gate = attention_output_gate
        self.kv_cache_mode = kv_cache_mode
        self.truncated_backprop = truncated_backprop
        self.initial_state = initial_state
        self.max_position_embeddings = max_position_embeddings
        self.init_std = init_std
        self.rms_norm_eps = rms_norm_eps
        self.ngpt_alpha_init = ngpt_alpha_init
        kwargs.setdefault("architectures", ["ElrForCausalLM"])
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(bos_token_id=bos_token_id, eos_token_id=eos_token_id, pad_token_id=pad_token_id, **kwargs)
        self.validate()

    @classmethod
    def tiny(cls, **overrides) -> "ElrConfig":
        """A CPU-sized config for tests and demos (about 0.1M parameters)."""
        return cls(**overrides)

    def validate(self) -> None:
        hd = self.head_dim if self.head_dim is not None else None
        if self.num_attention_heads < 1 or (hd is None and self.hidden_size % self.num_attention_heads != 0):
            raise _err(
                "num_attention_heads",
                f"{self.num_attention_heads} heads must divide hidden_size {self.hidden_size} (or set head_dim)",
            )
        _check_common(
            self.hidden_size, self.num_attention_heads, self.num_key_value_heads, 0,
            self.n_recurrent_layers, self.max_loops, self.num_loops,
        )
        for field, value, allowed in (
            ("update_rule", self.update_rule, UPDATE_RULES),
            ("backbone", self.backbone, BACKBONES),
            ("attention_pattern", self.attention_pattern, ATTENTION_PATTERNS),
            ("kv_cache_mode", self.kv_cache_mode, KV_CACHE_MODES),
            ("initial_state", self.initial_state, INITIAL_STATES),
        ):
            if value not in allowed:
                raise _err(field, f"unknown value {value!r}; choose one of {', '.join(allowed)}")
        if self.update_rule not in BACKBONES[self.backbone]:
            rules = ", ".join(BACKBONES[self.backbone])
            raise _err("update_rule", f"the {self.backbone} backbone goes with update_rule in ({rules}) only "
                       "(update_rule='ngpt' and backbone='ngpt' go together)")
        if self.n_input_layers < 0 or self.n_output_layers < 0:
            raise _err("n_input_layers", "layer counts must be >= 0")
        tb = self.truncated_backprop
        if tb is not None and not 1 <= tb:
            raise _err("truncated_backprop", f"must be None (full backprop) or >= 1 loops, got {tb}")

    def effective_depth(self, k: int) -> int:
        """D_eff(k) = L_in + k * L_rec + L_out, in transformer blocks."""
        return self.n_input_layers + k * self.n_recurrent_layers + self.n_output_layers

    def loop_spec(self) -> LoopSpec:
        n_blocks = self.n_input_layers + self.n_recurrent_layers + self.n_output_layers
        pattern, thetas = [], []
        for j in range(n_blocks):
            # Dory's 3:1 interleave: three sliding-window blocks, then one full-attention block.
            attn = "*" if self.attention_pattern == "full" or j % 4 == 3 else "S"
            theta = self.rope_theta_2 if (self.attention_pattern != "full" and attn == "*") else self.rope_theta
            pattern += [attn, "-"]
            thetas += [theta, theta]
        head_dim = self.head_dim or self.hidden_size // self.num_attention_heads
        return LoopSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=head_dim,
            pattern="".join(pattern),
            n_in=2 * self.n_input_layers,
            n_rec=2 * self.n_recurrent_layers,
            n_out=2 * self.n_output_layers,
            rope_thetas=tuple(thetas),
            rotary_fractions=tuple(1.0 for _ in thetas),
            swa_window=self.swa_window_size,
            backbone=self.backbone,
            update_rule=self.update_rule,
            loop_conditioning=self.loop_conditioning,
            output_gate=self.attention_output_gate,
            initial_state=self.initial_state,
            max_loops=self.max_loops,
            num_loops=self.num_loops,
            kv_cache_mode=self.kv_cache_mode,
            truncated_backprop=self.truncated_backprop,
            init_std=self.init_std,
            norm_eps=self.rms_norm_eps,
            ngpt_alpha_init=self.ngpt_alpha_init,
            gate_logit_scale_init=float(self.hidden_size) ** 0.5,
        )


class DoryConfig(PretrainedConfig):
    """Dory1.0-4B's checkpoint config, field for field (config fields and tensor names read from upstream vLLM's Dory model and config).

    Layer counts are sublayers. Fields this project adds for training
    (`max_recurrent_loops`, `truncated_backprop`) are only written when set.
    """

    model_type = "dory"
    # The generic name libraries read (vLLM's model-level head size: else hidden_size / heads = 160, not 256)
    attribute_map = {"head_dim": "attention_head_dim"}

    def __init__(
        self,
        dory_format_version: int = 1,
        vocab_size: int = 131072,
        hidden_size: int = 2560,
        num_hidden_layers: int = 72,
        intermediate_size: int = 7168,
        num_attention_heads: int = 16,
        num_key_value_heads: int = 4,
        attention_head_dim: int = 256,
        hybrid_layer_pattern: str | None = None,
        swa_window_size: int = 1024,
        rope_theta: float = 10000.0,
        rope_theta_2: float = 1000000.0,
        rope_profile_layers: list[int] | None = None,
        partial_rotary_factor: float = 1.0,
        partial_rotary_factor_2: float = 1.0,
        init_method_std: float = 0.02,
        ngpt_alpha_init: float = 0.05,
        attention_output_gate_logit_scale_init: float | None = None,
        n_input_layers: int = 16,
        n_recurrent_layers: int = 40,
        n_output_layers: int = 16,
        n_recurrent_loops: int = 4,
        initial_state: str = "input_copy",
        input_transform: str = "residual",
        output_transform: str = "replace",
        recurrent_kv_cache_mode: str = "per_loop",
        max_position_embeddings: int = 65536,
        **kwargs,
    ) -> None:
        self.dory_format_version = dory_format_version
        self.vocab_size = vocab_size
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.intermediate_size = intermediate_size
        self.num_attention_heads = num_attention_heads
        self.num_key_value_heads = num_key_value_heads
        self.attention_head_dim = attention_head_dim
        self.hybrid_layer_pattern = hybrid_layer_pattern or "S-S-S-*-" * (num_hidden_layers // 8)
        self.swa_window_size = swa_window_size
        self.rope_theta = rope_theta
        self.rope_theta_2 = rope_theta_2
        self.rope_profile_layers = rope_profile_layers or [
            2 if c == "*" else 1 for c in self.hybrid_layer_pattern
        ]
        self.partial_rotary_factor = partial_rotary_factor
        self.partial_rotary_factor_2 = partial_rotary_factor_2
        self.init_method_std = init_method_std
        self.ngpt_alpha_init = ngpt_alpha_init
        self.attention_output_gate_logit_scale_init = attention_output_gate_logit_scale_init
        self.n_input_layers = n_input_layers
        self.n_recurrent_layers = n_recurrent_layers
        self.n_output_layers = n_output_layers
        self.n_recurrent_loops = n_recurrent_loops
        self.initial_state = initial_state
        self.input_transform = input_transform
        self.output_transform = output_transform
        self.recurrent_kv_cache_mode = recurrent_kv_cache_mode
        self.max_position_embeddings = max_position_embeddings
        kwargs.setdefault("architectures", ["DoryForCausalLM"])
        kwargs.setdefault("tie_word_embeddings", False)
        super().__init__(**kwargs)
        self.validate()

    # Loop counts: the released format stores only the default; K caps it (llama.cpp caps at 4).
    @property
    def max_loops(self) -> int:
        return int(getattr(self, "max_recurrent_loops", None) or max(4, self.n_recurrent_loops))

    @property
    def num_loops(self) -> int:
        return self.n_recurrent_loops

    @property
    def kv_cache_mode(self) -> str:
        return self.recurrent_kv_cache_mode

    def validate(self) -> None:
        p = self.hybrid_layer_pattern
        if len(p) != self.num_hidden_layers or set(p) - set("S*-"):
            raise _err("hybrid_layer_pattern", f"needs {self.num_hidden_layers} chars from 'S', '*', '-', got {p!r}")
        if self.n_input_layers + self.n_recurrent_layers + self.n_output_layers != self.num_hidden_layers:
            raise _err("n_recurrent_layers", "n_input_layers + n_recurrent_layers + n_output_layers must equal num_hidden_layers")
        if len(self.rope_profile_layers) != self.num_hidden_layers:
            raise _err("rope_profile_layers", f"needs one entry (1 or 2) per layer ({self.num_hidden_layers})")
        _check_common(
            self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.attention_head_dim,
            self.n_recurrent_layers, self.max_loops, self.n_recurrent_loops,
        )
        if self.recurrent_kv_cache_mode not in KV_CACHE_MODES:
            raise _err("recurrent_kv_cache_mode", f"choose one of {', '.join(KV_CACHE_MODES)}")
        for field, want in (("initial_state", "input_copy"), ("input_transform", "residual"), ("output_transform", "replace")):
            if getattr(self, field) != want:
                raise _err(field, f"only {want!r} is supported (the released Dory model's value)")

    def effective_depth(self, k: int) -> int:
        return self.n_input_layers + k * self.n_recurrent_layers + self.n_output_layers

    def loop_spec(self) -> LoopSpec:
        thetas = tuple(self.rope_theta_2 if p == 2 else self.rope_theta for p in self.rope_profile_layers)
        fracs = tuple(
            self.partial_rotary_factor_2 if p == 2 else self.partial_rotary_factor for p in self.rope_profile_layers
        )
        g0 = self.attention_output_gate_logit_scale_init
        return LoopSpec(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_heads=self.num_attention_heads,
            num_kv_heads=self.num_key_value_heads,
            head_dim=self.attention_head_dim,
            pattern=self.hybrid_layer_pattern,
            n_in=self.n_input_layers,
            n_rec=self.n_recurrent_layers,
            n_out=self.n_output_layers,
            rope_thetas=thetas,
            rotary_fractions=fracs,
            swa_window=self.swa_window_size,
            backbone="ngpt",
            update_rule="ngpt",
            loop_conditioning=False,
            output_gate=True,
            initial_state="input_copy",
            max_loops=self.max_loops,
            num_loops=self.n_recurrent_loops,
            kv_cache_mode=self.recurrent_kv_cache_mode,
            truncated_backprop=getattr(self, "truncated_backprop", None),
            init_std=self.init_method_std,
            norm_eps=1e-6,
            ngpt_alpha_init=self.ngpt_alpha_init,
            gate_logit_scale_init=float(g0) if g0 is not None else float(self.hidden_size) ** 0.5,
        )

    @classmethod
    def tiny(cls, **overrides) -> "DoryConfig":
        """A tiny Dory-format config: 24 sublayers as 8 + 8 + 8, vocab 260."""
        base = dict(
            vocab_size=260, hidden_size=64, num_hidden_layers=24, intermediate_size=128,
            num_attention_heads=4, num_key_value_heads=2, attention_head_dim=16,
            swa_window_size=32, n_input_layers=8, n_recurrent_layers=8, n_output_layers=8,
            n_recurrent_loops=4, max_position_embeddings=2048,
        )
        base.update(overrides)
        return cls(**base)


# Training-side fields the Dory format accepts on top of its released ones (written only when set).
DORY_EXTRAS = {"max_recurrent_loops": "int | None", "truncated_backprop": "int | None"}
_TYPES = {"int": int, "float": (int, float), "str": str, "bool": bool, "list": list, "dict": dict}


def check_overrides(cls: type, overrides: dict, where: str = "") -> None:
    """Reject unknown config fields and values of the wrong type, naming the field.

    `PretrainedConfig` swallows unknown keyword arguments, so a typo (`hiden_size=32`) would
    otherwise be written into config.json and silently do nothing.
    """
    import inspect

    params = inspect.signature(cls.__init__).parameters
    known = {n: str(p.annotation) for n, p in params.items() if n not in ("self", "kwargs")}
    if cls is DoryConfig:
        known.update(DORY_EXTRAS)
    for key, value in overrides.items():
        name = f"{where}{key}"
        if key not in known:
            raise ValueError(f"config field `{name}`: {cls.__name__} has no field {key!r}; choose among {sorted(known)}")
        # "int | None", "Optional[float]", "list[int] | None" -> ["int", "None"], ["float"], ["list", "None"]
        allowed = [t.strip().split("[")[0] for t in known[key].replace("Optional[", "").split("|")]
        if value is None and "None" in allowed:
            continue
        types: tuple = ()
        for t in allowed:  # names outside _TYPES (None, Any, ...) add no constraint of their own
            found = _TYPES.get(t, ())
            types += found if isinstance(found, tuple) else (found,)
        ok = isinstance(value, types) and not (isinstance(value, bool) and bool not in types)
        if types and not ok:
            raise ValueError(f"config field `{name}`: {value!r} is a {type(value).__name__}, expected {known[key]}")


def config_from_dict(d: dict) -> PretrainedConfig:
    """The right config class for a config.json dict (by model_type)."""
    mt = d.get("model_type")
    if mt == ElrConfig.model_type:
        return ElrConfig(**d)
    if mt == DoryConfig.model_type:
        return DoryConfig(**d)
    raise ValueError(f"unknown model_type {mt!r} in config.json: expected 'elr_looped' or 'dory'")
