"""The looped model inside vLLM: the PyTorch model's own modules with vLLM attention cores.

Only imported by vLLM (through `elr_rl.vllm_plugin`), never by `import elr_rl`.

Everything but the attention core is the PyTorch model's code: the `Backbone`
(sublayers, RoPE, nGPT qk-norm and gates, MLPs, update rules, loop conditioning,
`run_loops`) and the LM heads are built from `elr_rl.model.modeling`, so the
served model and the trained model cannot drift. The backbone calls
`core(q, k, v, layer_id, loop_idx, window)` for every attention sublayer; here the
core is a set of vLLM `Attention` layers, each owning one KV cache:

* per_loop: one `Attention` per (recurrent attention sublayer, loop), sharing the
  sublayer's projections; the virtual layer index `loop * num_sublayers + layer`
  (upstream Dory's) names it, so each name holds exactly one integer as vLLM
  requires. Decoding at loop i sees past tokens' loop-i K/V: the teacher-forced
  semantics. Input/output sublayers run once and keep one cache.
* last_loop: one `Attention` per attention sublayer, called k times per forward;
  each call writes the token's K/V before reading, so the last loop's K/V stays.
  Memory is flat in k. Needs whole-prompt prefill and no prefix-cache hits
  (chunked prefill put later chunks off by up to 2.85 nats in a measurement on the CPU
  backend); `elr_rl.rollout.engine` sets those engine options.

The loop count lives on the model (`num_loops`) and is read at every forward, so
in eager mode a worker can change it between batches (`set_num_loops`).

Head sizes the attention backend lacks (CPU: below 32) are zero-padded inside the
core (`kernel_head_size`); the projections are plain `nn.Linear`, so the model
runs with tensor_parallel_size=1 on CPU and CUDA alike. On CPU they run on weights packed after every
load (`PackedLinears`): an fp32 model on an AVX2 CPU runs our few-row kernel (`elr_rl.model.cpu_gemm`)
below 1024 rows and MKL above; anything else vLLM's oneDNN matmul (the `elr_cpu_gemm` override picks
"elr", "onednn", "onednn_all" or "torch"; under "onednn" fp32 batches of 96 rows and more on an AVX2 CPU
go to MKL, faster there at those sizes; "onednn_all" keeps them on oneDNN), and decode steps' attention runs our kernel
on vLLM's paged cache (`elr_rl.model.cpu_attention`; `elr_cpu_attention` picks "elr" or "vllm").
"""

from __future__ import annotations

import logging
from collections.abc import Iterable

import torch
from torch import nn

from elr_rl.model.config import KV_CACHE_MODES, LoopSpec, config_from_dict
from elr_rl.model.modeling import Backbone

logger = logging.getLogger(__name__)

# hf_overrides key: how many loops get their own KV cache in per_loop mode
# (default max_loops). A worker that never runs deeper than k allocates less.
KV_LOOPS_KEY = "elr_kv_loops"
# hf_overrides key: the CPU matmul of the projections: "elr" (default: our few-row fp32 kernel on packed
# weights where it applies, `cpu_gemm.available()`, MKL from `elr_row_limits` rows; elsewhere as "onednn"),
# "onednn" (oneDNN on packed weights, MKL for the batch sizes where `onednn_row_limits` says it is faster),
# "onednn_all" (oneDNN at every batch size from PackedLinears.min_rows) or "torch" (F.linear).
CPU_GEMM_KEY = "elr_cpu_gemm"
CPU_GEMMS = ("elr", "onednn", "onednn_all", "torch")
# hf_overrides key: decode attention on CPU, "elr" (our kernel, default) or "vllm" (vLLM-CPU's kernel).
CPU_ATTENTION_KEY = "elr_cpu_attention"
_ENGINE_KEYS = (KV_LOOPS_KEY, CPU_GEMM_KEY, CPU_ATTENTION_KEY)  # engine settings in hf_overrides, not model fields


def kernel_head_size(head_dim: int, has_window: bool) -> int:
    """The head size the attention backend runs: head_dim itself, or the next size it supports.

    Zero-padding q, k and v to a larger head size leaves q.k and the output's first
    head_dim channels unchanged (the softmax scale stays 1/sqrt(head_dim)), so tiny
    test models with head_dim 16 run on backends whose smallest size is 32 (CPU).
    """
    from vllm.v1.attention.selector import get_attn_backend

    try:
        backend = get_attn_backend(head_dim, torch.get_default_dtype(), "auto", has_sliding_window=has_window)
        sizes = sorted(backend.get_supported_head_sizes())
    except Exception:  # noqa: BLE001 - a backend without a size list accepts the size as is
        return head_dim
    if not sizes or head_dim in sizes:
        return head_dim
    larger = [s for s in sizes if s >= head_dim]
    if not larger:
        raise ValueError(f"head_dim={head_dim} exceeds the attention backend's largest head size {sizes[-1]}")
    return larger[0]


class VllmAttentionCore(nn.Module):
    """The backbone's attention core on vLLM `Attention` layers (one KV cache each)."""

    def __init__(self, spec: LoopSpec, cache_mode: str, kv_loops: int, cache_config, prefix: str) -> None:
        super().__init__()
        from vllm.model_executor.layers.attention import Attention

        if cache_mode not in KV_CACHE_MODES:
            raise ValueError(f"kv cache mode must be one of {KV_CACHE_MODES}, got {cache_mode!r}")
        self.spec, self.cache_mode, self.kv_loops = spec, cache_mode, kv_loops
        self.H, self.KV, self.hd = spec.num_heads, spec.num_kv_heads, spec.head_dim
        self.attn = nn.ModuleDict()
        self.decode_kernel_calls = 0  # attention calls our CPU decode kernel ran (use_decode_kernel)
        for layer in range(spec.num_sublayers):
            if not spec.is_attention(layer):
                continue
            window = spec.swa_window if spec.pattern[layer] == "S" else None
            padded = kernel_head_size(self.hd, window is not None)
            for loop in range(kv_loops if self._per_loop(layer) else 1):
                virtual = self.virtual_index(layer, loop)
                self.attn[str(virtual)] = Attention(
                    num_heads=self.H,
                    head_size=padded,
                    scale=self.hd**-0.5,  # the model's scale, also when padded
                    num_kv_heads=self.KV,
                    cache_config=cache_config,
                    per_layer_sliding_window=window,
                    prefix=f"{prefix}.layers.{virtual}.attn",
                )

    def _per_loop(self, layer: int) -> bool:
        s = self.spec
        return self.cache_mode == "per_loop" and s.n_in <= layer < s.n_in + s.n_rec

    def virtual_index(self, layer: int, loop_idx: int) -> int:
        """Cache index: loop * num_sublayers + layer for per-loop caches, else the layer itself."""
        return (loop_idx if self._per_loop(layer) else 0) * self.spec.num_sublayers + layer

    def layers_at(self, k: int) -> list[str]:
        """Names of the `Attention` layers a forward at loop count k uses."""
        names = []
        for layer in range(self.spec.num_sublayers):
            if self.spec.is_attention(layer):
                loops = range(k) if self._per_loop(layer) else range(1)
                names += [self.attn[str(self.virtual_index(layer, i))].layer_name for i in loops]
        return names

    def use_decode_kernel(self, block_size: int, dtype: torch.dtype) -> str:
        """CPU: run decode-only steps' attention on `elr_rl.model.cpu_attention`'s kernel (other steps, and
        layers it does not cover, keep vLLM's). Returns "elr" when every layer uses it, else "vllm" (why, logged)."""
        from elr_rl.model import cpu_attention

        reasons = []
        for attn in self.attn.values():
            why = cpu_attention.supports(attn.head_size, self.H, self.KV, block_size, dtype) or _unsupported(attn.impl)
            if why:
                reasons.append(why)
        if reasons:
            logger.warning("decode attention stays on vLLM's CPU kernel: %s", reasons[0])
            return "vllm"
        module = cpu_attention.load()
        if module is None:
            return "vllm"  # load() logged why
        if dtype == torch.bfloat16 and not module.vectorised_bf16():
            logger.warning("decode attention stays on vLLM's CPU kernel: this CPU has no AVX-512, and our kernel's "
                           "plain bf16 loops measured slower than vLLM's")
            return "vllm"
        for attn in self.attn.values():
            attn.impl.forward = self._decode_forward(attn.impl, attn.impl.forward, module)
        return "elr"

    def _decode_forward(self, impl, vllm_forward, module):
        window = max(int(impl.sliding_window), 0)

        def forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale=None,
                    output_block_scale=None):
            meta = attn_metadata
            if (meta is not None and output_scale is None and output_block_scale is None and meta.max_query_len == 1
                    and meta.causal is True and meta.dynamic_causal is None and kv_cache.dtype == query.dtype
                    and kv_cache.is_contiguous() and meta.block_table.dtype == torch.int32
                    and meta.seq_lens.dtype == torch.int32):
                n = meta.num_actual_tokens
                module.decode_attention(query[:n], kv_cache, meta.block_table[:n], meta.seq_lens[:n], output[:n],
                                        impl.scale, window)
                self.decode_kernel_calls += 1
                return output
            return vllm_forward(layer, query, key, value, kv_cache, attn_metadata, output, output_scale,
                                output_block_scale)

        return forward

    def forward(self, q, k, v, layer_id: int, loop_idx: int, window: int | None) -> torch.Tensor:
        # q: [T, H, hd]; k, v: [T, KV, hd] (a flat token stream) -> [T, H, hd]
        if self._per_loop(layer_id) and loop_idx >= self.kv_loops:
            raise ValueError(
                f"loop {loop_idx + 1} has no KV cache: the engine was built with {self.kv_loops} per-loop caches "
                f"({KV_LOOPS_KEY}); build it with more or run fewer loops"
            )
        attn = self.attn[str(self.virtual_index(layer_id, loop_idx))]
        pad = attn.head_size - self.hd
        if pad:
            q, k, v = (nn.functional.pad(x, (0, pad)) for x in (q, k, v))
        out = attn(q.reshape(q.shape[0], -1), k.reshape(k.shape[0], -1), v.reshape(v.shape[0], -1))
        out = out.view(q.shape[0], self.H, attn.head_size)
        return out[..., : self.hd] if pad else out


class LoopedVllmForCausalLM(nn.Module):
    """vLLM model class for `ElrForCausalLM` and `DoryForCausalLM` checkpoints."""

    def __init__(self, *, vllm_config, prefix: str = "") -> None:
        super().__init__()
        from vllm.distributed import get_tensor_model_parallel_world_size

        if get_tensor_model_parallel_world_size() != 1:
            # The backbone's projections are plain nn.Linear: nothing is sharded across ranks.
            raise ValueError("looped models run with tensor_parallel_size=1; scale out with more engines instead")
        hf = vllm_config.model_config.hf_config
        fields = {key: val for key, val in hf.to_dict().items() if key not in _ENGINE_KEYS}
        self.config = config_from_dict(fields)  # the project's typed config (validated)
        spec = self.spec = self.config.loop_spec()
        kv_loops = int(getattr(hf, KV_LOOPS_KEY, None) or spec.max_loops)
        if not spec.num_loops <= kv_loops <= spec.max_loops:
            raise ValueError(
                f"{KV_LOOPS_KEY}={kv_loops} must be in num_loops..max_loops = {spec.num_loops}..{spec.max_loops}"
            )
        self.backbone = Backbone(spec)
        self.lm_head = self.backbone.variant.lm_head(spec)
        core_prefix = f"{prefix}.core" if prefix else "core"  # attention names: core.layers.{virtual}.attn
        self.core = VllmAttentionCore(spec, spec.kv_cache_mode, kv_loops, vllm_config.cache_config, core_prefix)
        self.num_loops = spec.num_loops
        # Every checkpoint tensor this model takes, with its shape: weight updates are checked against it.
        self.expected_shapes = {name: tuple(p.shape) for name, p in self.named_parameters()}
        self.last_loaded: set[str] = set()
        from vllm.platforms import current_platform

        self.cpu_gemm = _cpu_gemm(hf, current_platform.device_type, vllm_config.model_config.enforce_eager,
                                  vllm_config.model_config.dtype)
        self.packed = None
        if self.cpu_gemm != "torch":
            self.packed = PackedLinears(self, max_rows={} if self.cpu_gemm == "onednn_all" else None,
                                        kernel="elr" if self.cpu_gemm == "elr" else "onednn")
        self.cpu_attention = "vllm"  # decode attention: our kernel ("elr") or vLLM's
        if _cpu_attention(hf, current_platform.device_type) == "elr":
            self.cpu_attention = self.core.use_decode_kernel(vllm_config.cache_config.block_size,
                                                             vllm_config.model_config.dtype)
        # CPU, bf16, eager, a build with AVX-512: RMSNorm and rotary run one-pass kernels with PyTorch's roundings
        # (cpu_elementwise). Without AVX-512 the kernels' scalar loops sum RMSNorm's squares in another order than
        # PyTorch's there (24 of 55 logprobs of tests/rollout/test_cpu_elementwise_engine.py equal on an AVX2 EPYC),
        # and bf16 is not the dtype such a CPU runs (its bf16 matrix products are ~50x slower than fp32).
        self.fused_elementwise = 0
        if (current_platform.device_type == "cpu" and vllm_config.model_config.dtype == torch.bfloat16
                and vllm_config.model_config.enforce_eager):
            from elr_rl.model import cpu_attention, cpu_elementwise

            kernels = cpu_attention.load()
            if kernels is not None and kernels.vectorised_bf16():
                self.fused_elementwise = cpu_elementwise.fuse(self.backbone)
        if spec.kv_cache_mode == "last_loop":
            _warn_unsafe_last_loop(vllm_config)

    # ------------------------------------------------------------------ vLLM contract
    def embed_input_ids(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.backbone.embeddings(input_ids)

    def forward(self, input_ids, positions, intermediate_tensors=None, inputs_embeds=None, **kwargs) -> torch.Tensor:
        # Flat token streams: input_ids/positions [T], hidden states [T, d].
        if self.packed is not None:
            self.packed.refresh()  # after a weight load: repack before the first matmul reads them
        h = inputs_embeds if inputs_embeds is not None else self.embed_input_ids(input_ids)
        return self.backbone(h, positions, self.core, self.num_loops)

    def compute_logits(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.lm_head(hidden_states)  # [T, V] float32

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        """Load checkpoint tensors by their checkpoint names; refuse unknown names and shapes."""
        from vllm.model_executor.model_loader.weight_utils import default_weight_loader

        if self.packed is not None:
            self.packed.mark_stale()  # also if this load fails half way: some weights may have changed
        # Look parameters up afresh: in-place reloads swap them for placeholders first.
        params = dict(self.named_parameters())
        loaded: set[str] = set()
        for name, tensor in weights:
            if name not in params:
                model = type(self.config).__name__
                raise ValueError(f"checkpoint tensor {name!r} is not a parameter of this {model} model")
            if tuple(tensor.shape) != self.expected_shapes[name]:
                want = self.expected_shapes[name]
                raise ValueError(f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, expected {want}")
            param = params[name]
            getattr(param, "weight_loader", default_weight_loader)(param, tensor)
            loaded.add(name)
        self.last_loaded = loaded
        return loaded

    # ----------------------------------------------------------- loop count, caches
    def set_num_loops(self, k: int) -> None:
        """Run k loops from the next forward on (eager mode; a compiled graph would keep its k)."""
        k = int(k)
        limit = self.core.kv_loops if self.spec.kv_cache_mode == "per_loop" else self.spec.max_loops
        if not 1 <= k <= limit:
            raise ValueError(f"loop count k={k} is outside 1..{limit} for this engine: pick k in that range")
        self.num_loops = k


class PackedLinears:
    """CPU: a model's `nn.Linear` layers through a kernel that reads packed copies of their weights.

    `kernel` "elr": our few-row fp32 kernel (`elr_rl.model.cpu_gemm`, weights in panels of 16 columns) for
    batches below `max_rows[dtype]` rows (`elr_row_limits`), F.linear (MKL) from there up and for other
    dtypes. On an AVX2 AMD EPYC (Zen 3), fp32, this model's shapes, it ran 2-128 rows faster than both MKL and
    oneDNN on one thread and on two, and one row level with MKL on one thread (`scripts/bench_gemm.py`); from
    about 2048 rows MKL is faster.
    `kernel` "onednn": vLLM's oneDNN matmul. torch's `F.linear` goes to MKL, whose fp32 GEMM with 8 rows (a
    decode step's batch) ran at 8-25 GFLOP/s on that CPU where oneDNN on the same shapes ran 1.2-2x faster.
    The few rows of a request's thinning tail: rows below `min_rows` stay on MKL, by default
    (`small_rows_floor`) one row on one thread only. On that CPU (one layer's seven projections, d = 1024,
    fp32) MKL's one-row product was level with oneDNN's or ahead (3.2-4.1 against 4.0-4.4 ms), but at 2-3
    rows oneDNN was 1.3-1.8x faster (3.7-4.6 against 5.4-7.7 ms); and with 2 threads MKL ran 1-4 rows on one
    thread (3.2-6.6 ms, no faster than with one) where oneDNN used both (2.1-3.2 ms, 1.3-3.2x).
    At the other end, on the same CPU in fp32, MKL beat oneDNN from about 96 rows up (83 against 75
    GFLOP/s at 192-512 rows of this model's shapes, one thread; level at 64, oneDNN ahead below):
    rows from `max_rows[dtype]` up go to F.linear (`onednn_row_limits`: fp32 without AVX-512 only; the
    AVX-512 machines' oneDNN paths were measured faster, so they keep oneDNN at every size).
    A packed copy does not follow in-place weight changes: `mark_stale` (every load) makes the next
    `refresh` repack from the parameters, which the model calls at the start of each forward.
    """

    KERNELS = ("elr", "onednn")

    def __init__(self, model: nn.Module, min_rows: int | None = None, max_rows: dict | None = None,
                 kernel: str = "onednn") -> None:
        if kernel not in self.KERNELS:
            raise ValueError(f"PackedLinears kernel={kernel!r}: pick one of {self.KERNELS}")
        self.kernel = kernel
        if kernel == "onednn":
            from vllm import _custom_ops as ops

            self.ops = ops
        else:
            from elr_rl.model import cpu_gemm

            self.ops = cpu_gemm.kernels()
            if self.ops is None:
                raise RuntimeError("PackedLinears(kernel='elr'): the CPU gemm kernel is not built here "
                                   "(cpu_attention.load_error() says why); use kernel='onednn'")
        self.fixed_min_rows = min_rows
        self.min_rows = min_rows or 1  # set by each refresh, which runs before the first matmul (stale below)
        if max_rows is None:
            max_rows = elr_row_limits() if kernel == "elr" else onednn_row_limits()
        self.max_rows = max_rows
        self.layers = [m for m in model.modules() if type(m) is nn.Linear]
        self.handles: dict[int, object] = {}
        self.stale, self.warned = True, False
        for layer in self.layers:
            layer.forward = self._forward_of(layer)  # instance attribute: nn.Module.__call__ finds it first

    def mark_stale(self) -> None:
        self.stale = True

    def refresh(self) -> None:
        """Repack every weight if a load happened since the last pack."""
        if not self.stale:
            return
        if self.kernel == "elr":
            self._pack_panels()
        else:
            self._pack_onednn()
        self.stale = False

    def _pack_onednn(self) -> None:
        # the engine's threads are set by now (vLLM's CPU worker sets them before loading the weights)
        self.min_rows = small_rows_floor() if self.fixed_min_rows is None else self.fixed_min_rows
        handles, failed = {}, []
        for layer in self.layers:
            try:
                handles[id(layer)] = self.ops.create_onednn_mm(layer.weight.detach().t(), 32)
            except RuntimeError as err:  # a dtype or shape oneDNN lacks here: that layer keeps F.linear
                failed.append(f"{tuple(layer.weight.shape)} {layer.weight.dtype}: {err}")
        self._warn_once(failed, "oneDNN matmul")
        self.handles = handles

    def _pack_panels(self) -> None:
        from elr_rl.model import cpu_gemm

        # one row too: level with MKL on one thread (0.97-1.15x), 1.7-1.9x on two (MKL runs it on one thread)
        self.min_rows = 1 if self.fixed_min_rows is None else self.fixed_min_rows
        handles, failed = {}, []
        for layer in self.layers:
            if layer.weight.dtype == torch.float32:
                handles[id(layer)] = cpu_gemm.pack_panels(layer.weight)
            else:  # the kernel is fp32 only: that layer keeps F.linear
                failed.append(f"{tuple(layer.weight.shape)} {layer.weight.dtype}")
        self._warn_once(failed, "the fp32 gemm kernel")
        self.handles = handles

    def _warn_once(self, failed: list[str], what: str) -> None:
        if failed and not self.warned:
            logger.warning("%s unavailable for %d of %d projections, which keep F.linear (first: %s)",
                           what, len(failed), len(self.layers), failed[0])
            self.warned = True

    def _forward_of(self, layer: nn.Linear):
        def forward(x: torch.Tensor) -> torch.Tensor:
            handle = self.handles.get(id(layer))
            rows = x.numel() // max(x.shape[-1], 1)
            limit = self.max_rows.get(x.dtype)
            if (handle is None or self.stale or rows < self.min_rows or x.dtype != layer.weight.dtype
                    or (limit is not None and rows >= limit)):
                return nn.functional.linear(x, layer.weight, layer.bias)
            flat = x.reshape(rows, x.shape[-1])
            if not flat.is_contiguous():
                flat = flat.contiguous()
            if self.kernel == "elr":
                bias = None if layer.bias is None else layer.bias.detach()
                out = self.ops.gemm_f32_panels(flat, handle, layer.out_features, bias)
            else:
                out = self.ops.onednn_mm(handle, flat, layer.bias)
            return out.view(*x.shape[:-1], out.shape[-1])

        return forward


def small_rows_floor(threads: int | None = None) -> int:
    """Rows from which PackedLinears runs oneDNN (fewer stay on MKL): 2 on one thread, where MKL's one-row
    product was level with oneDNN's or ahead, else 1, since MKL ran a few rows on one of the threads only."""
    threads = torch.get_num_threads() if threads is None else threads
    return 2 if threads <= 1 else 1


def onednn_row_limits(capability: str | None = None) -> dict:
    """{dtype: rows from which PackedLinears leaves a projection to F.linear (MKL)} for this CPU.

    Measured on an AVX2 AMD EPYC (Zen 3), one thread, this model's projection shapes (1024 -> 256..2816,
    2816 -> 1024): fp32 MKL over oneDNN 1.11x at 512 rows, 1.05-1.11x at 96-224, level at 64, 0.85x at 16.
    Nothing measured says the same of AVX-512 or non-x86 CPUs (no MKL there) or of bf16 (MKL has no
    bf16 GEMM; torch sends it to oneDNN unpacked), so those keep oneDNN at every row count."""
    capability = capability or torch.backends.cpu.get_cpu_capability()
    return {torch.float32: 96} if capability.upper() == "AVX2" and torch.backends.mkl.is_available() else {}


def elr_row_limits() -> dict:
    """{dtype: rows from which PackedLinears(kernel="elr") leaves a projection to F.linear}: the kernel ran
    level with MKL at 1024 rows and behind it from 2048 (AVX2 AMD EPYC, fp32, one and two threads,
    `scripts/bench_gemm.py`); prefill chunks are that large, decode batches are not."""
    return {torch.float32: 1024}


def _cpu_gemm(hf, platform: str, eager: bool, dtype: torch.dtype = torch.float32) -> str:
    """The projections' matmul on CPU: "elr" (the default) where our fp32 kernel applies (an fp32 model on a
    CPU where `cpu_gemm.available()`), else oneDNN; F.linear on other devices and under torch.compile
    (packing at the first forward after a load is a Python side effect)."""
    choice = str(getattr(hf, CPU_GEMM_KEY, None) or "elr")
    if choice not in CPU_GEMMS:
        raise ValueError(f"{CPU_GEMM_KEY}={choice!r}: pick one of {CPU_GEMMS}")
    if platform != "cpu" or choice == "torch" or not eager:
        return "torch"
    if choice == "elr":
        from elr_rl.model import cpu_gemm

        if dtype == torch.float32 and cpu_gemm.available():
            return "elr"
        logger.info("cpu_gemm 'elr' does not apply here (dtype %s, CPU capability %s, kernel built: %s): oneDNN runs",
                    dtype, torch.backends.cpu.get_cpu_capability(), cpu_gemm.kernels() is not None)
        choice = "onednn"
    from vllm import _custom_ops as ops

    return choice if getattr(ops, "_supports_onednn", False) else "torch"


def _cpu_attention(hf, platform: str) -> str:
    """Decode attention: our kernel on CPU unless asked otherwise; vLLM's own on other devices."""
    from elr_rl.model.cpu_attention import CHOICES

    choice = str(getattr(hf, CPU_ATTENTION_KEY, None) or "elr")
    if choice not in CHOICES:
        raise ValueError(f"{CPU_ATTENTION_KEY}={choice!r}: pick one of {CHOICES}")
    return choice if platform == "cpu" else "vllm"


def _unsupported(impl) -> str | None:
    """Why our decode kernel cannot stand in for this vLLM attention implementation, or None."""
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionBackendImpl

    if not isinstance(impl, CPUAttentionBackendImpl):
        return f"attention backend {type(impl).__name__} (the CPU backend's only)"
    if impl.alibi_slopes is not None or impl.logits_soft_cap or impl.sinks is not None:
        return "ALiBi, logit soft-capping or attention sinks"
    if impl.kv_cache_dtype != "auto":
        return f"kv cache dtype {impl.kv_cache_dtype!r} (the model's own only)"
    return None


def _warn_unsafe_last_loop(vllm_config) -> None:
    """last_loop results change with chunked prefill and prefix-cache hits: say so."""
    sched, cache = vllm_config.scheduler_config, vllm_config.cache_config
    if getattr(sched, "enable_chunked_prefill", False) or getattr(cache, "enable_prefix_caching", False):
        logger.warning(
            "last_loop KV caching with chunked prefill or prefix caching on: results depend on scheduling. "
            "Use elr_rl.rollout.RolloutEngine or pass enable_chunked_prefill=False, enable_prefix_caching=False "
            "and max_num_batched_tokens >= max_model_len."
        )
