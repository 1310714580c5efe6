"""Decode attention for vLLM's CPU backend: our kernel on vLLM's paged KV cache.

In a decode step every sequence brings one query token and reads its whole KV cache. On a CPU without AMX,
vLLM-CPU's generic kernel held that to ~6 GB/s of KV read at RL-length contexts (a profile of a 512-row step
at context ~400: 29% of the step in attention for ~9% of its FLOPs): its reads wait on memory latency (a
sequence's blocks sit anywhere in the cache) and it widens every bf16 element with a cross-lane instruction.
`csrc/decode_attention.cpp` prefetches K and V into L2 ahead of their use (bf16: K a few chunks ahead of the
scores and V one item ahead of the outputs, across a thread's items), splits two bf16 values read as one 32-bit
word with a shift and a mask, and accumulates in fp32 as vLLM's does (bf16 scores as bf16 dot products where
the CPU has AVX512-BF16). 2.2x vLLM-CPU's kernel on a 512-sequence step at context ~400, bf16, one thread.
`CHOICES` name the engine's options (`EngineOptions.cpu_attention`, `rollout.cpu_attention`);
`scripts/bench_attention.py` times the two kernels on one cache, `scripts/bench_rollout.py --cpu-attention
elr vllm` the engine with each.

The same extension holds `csrc/elementwise.cpp`, the one-pass RMSNorm and rotary kernels of
`cpu_elementwise`, and `csrc/small_gemm.cpp`, the few-row fp32 products of `cpu_gemm`. It is compiled on first use for the machine it runs on (g++, -march=native; cached by
PyTorch's extension builder under $TORCH_EXTENSIONS_DIR, keyed by the sources, the CPU's flags and torch's
version; a lock left by a build that was killed is cleared after STALE_LOCK_SECONDS). The build reads copies
of the sources kept in its own folder, not the package's files: ninja rebuilds whenever a source's path
changes, and a Ray job runs its own copy of the working directory, so every job's rollout workers compiled
the kernels again (about two minutes on two cores) before any rollout.
Where it cannot be built, `load()` says why and vLLM's own kernel runs. It covers decode-only batches
(one query token per sequence) with bf16 or fp32 caches, head_dim 32/64/128/256, 1/2/4/8 query heads per
KV head, block sizes that are multiples of 32, and an optional sliding window; anything else (prefill,
chunked prefill, mixed batches) runs vLLM's kernel. bf16 caches take an AVX-512 path; built without AVX-512
the kernel computes bf16 in plain loops, correct but slower than vLLM's (a -march=haswell build of it: 58 ms
for a 512-row step at context 400 against 36 ms for vLLM's kernel here), so the engine keeps vLLM's there.
fp32 caches (the dtype picked on AVX2-only CPUs, where bf16 matrix products are slow) take an AVX2 path:
prefetch streams, 8-wide arithmetic and a vectorised softmax (`vectorised_f32()` says whether it was built);
without AVX2 they run plain loops. `reference` is the same computation in PyTorch, for tests.
"""

from __future__ import annotations

import hashlib
import logging
import os
import tempfile
import threading
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

SOURCE = Path(__file__).parent / "csrc" / "decode_attention.cpp"
# One extension: decode attention, the one-pass RMSNorm and rotary of `cpu_elementwise`, and the few-row fp32
# products of `cpu_gemm`.
SOURCES = (SOURCE, Path(__file__).parent / "csrc" / "elementwise.cpp", Path(__file__).parent / "csrc" / "small_gemm.cpp")
CHOICES = ("elr", "vllm")  # decode attention on CPU: this kernel, or vLLM-CPU's own
HEAD_DIMS = (32, 64, 128, 256)
GROUPS = (1, 2, 4, 8)

_lock = threading.Lock()
_module = None
_error: str | None = None


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return ""


def build_name() -> str:
    """The extension's name: changes with the source, the CPU's flags (-march=native) and torch's version."""
    h = hashlib.sha256()
    for part in (*(f.read_bytes() for f in SOURCES), _cpu_flags().encode(), torch.__version__.encode()):
        h.update(part)
    return f"elr_decode_attention_{h.hexdigest()[:16]}"


def load():
    """The compiled kernel module, or None when it cannot be built (`load_error()` says why). Built once."""
    global _module, _error
    with _lock:
        if _module is not None or _error is not None:
            return _module
        try:
            from torch.utils.cpp_extension import load as build

            name = build_name()
            _clear_stale_lock(name)
            logger.info("loading the decode-attention kernel (compiled once per CPU, sources and torch version)")
            _module = build(
                name=name,
                sources=[str(f) for f in stable_sources(name)],
                extra_cflags=["-O3", "-march=native", "-fopenmp"],
                extra_ldflags=["-fopenmp"],
                verbose=False,
            )
        except Exception as exc:  # noqa: BLE001 - no compiler, no ninja, an unknown -march: vLLM's kernel runs
            _error = f"{type(exc).__name__}: {exc}"
            logger.warning("elr decode attention unavailable, vLLM's CPU kernel runs instead: %s", _error)
        return _module


def stable_sources(name: str) -> list[Path]:
    """The sources, copied into the build's folder under fixed paths: the same build wherever the package lives.

    The folder is named by a hash of the sources' contents, so a file already there is the same file; it is
    never rewritten (a newer mtime would make ninja rebuild). A new file appears whole or not at all (written
    aside, then hard-linked into place), so two processes loading at once cannot read a half-written copy."""
    from torch.utils.cpp_extension import _get_build_directory

    folder = Path(_get_build_directory(name, verbose=False)) / "src"
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for src in SOURCES:
        dst = folder / src.name
        if not dst.exists():
            fd, tmp = tempfile.mkstemp(dir=folder, prefix=f".{src.name}.")
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(src.read_bytes())
                try:
                    os.link(tmp, dst)
                except FileExistsError:
                    pass  # another process put the same file there first
            finally:
                os.unlink(tmp)
        paths.append(dst)
    return paths


STALE_LOCK_SECONDS = 600  # a build takes about a minute here


def _clear_stale_lock(name: str) -> None:
    """Remove a build lock left by a process killed while compiling: torch's builder would wait on it forever."""
    import time

    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory(name, verbose=False)) / "lock"
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_SECONDS:
        logger.warning("removing a stale build lock %s (%.0f s old: a build was interrupted)", lock, age)
        lock.unlink(missing_ok=True)


def load_error() -> str | None:
    return _error


def supports(head_dim: int, heads: int, kv_heads: int, block_size: int, dtype: torch.dtype) -> str | None:
    """None when the kernel covers this layer's shape, else the reason it does not."""
    if dtype not in (torch.bfloat16, torch.float32):
        return f"dtype {dtype} (bfloat16 or float32 only)"
    if head_dim not in HEAD_DIMS:
        return f"head_dim {head_dim} (one of {HEAD_DIMS})"
    if heads % kv_heads or heads // kv_heads not in GROUPS:
        return f"{heads} query heads over {kv_heads} KV heads (a group of {GROUPS})"
    if not block_size or block_size % 32:
        return f"block size {block_size} (a multiple of 32)"
    return None


def decode_attention(query, kv_cache, block_table, seq_lens, out, scale: float, window: int = 0) -> torch.Tensor:
    """out[i] = attention of query[i] ([heads, head_dim]) over the first seq_lens[i] tokens of sequence i's
    blocks (block_table[i]) in a vLLM-CPU cache [blocks, kv_heads, block_size, 2 * head_dim]; window > 0
    keeps only the last `window` of them."""
    module = load()
    if module is None:
        raise RuntimeError(f"the decode-attention kernel is not available: {_error}")
    module.decode_attention(query, kv_cache, block_table, seq_lens, out, float(scale), int(window))
    return out


def reference(query, kv_cache, block_table, seq_lens, scale: float, window: int = 0) -> torch.Tensor:
    """The same attention in PyTorch (fp32), reading the cache layout directly: K transposed per block
    ([head_dim, block_size]), then V ([block_size, head_dim])."""
    n, heads, dim = query.shape
    kv_heads, block_size = kv_cache.shape[1], kv_cache.shape[2]
    group = heads // kv_heads
    view = kv_cache.view(kv_cache.shape[0], kv_heads, 2 * block_size, dim).float()
    k_t, v = view[:, :, :block_size], view[:, :, block_size:]  # K's block_size*dim values; V [blk, kvh, bs, dim]
    k_t = k_t.reshape(kv_cache.shape[0], kv_heads, dim, block_size)
    out = torch.empty(n, heads, dim, dtype=torch.float32)
    for i in range(n):
        length = int(seq_lens[i])
        blocks = block_table[i, : (length + block_size - 1) // block_size].long()
        keys = k_t[blocks].permute(1, 0, 3, 2).reshape(kv_heads, -1, dim)[:, :length]  # [kvh, len, dim]
        values = v[blocks].permute(1, 0, 2, 3).reshape(kv_heads, -1, dim)[:, :length]
        start = max(0, length - window) if window > 0 else 0
        keys, values = keys[:, start:], values[:, start:]
        q = query[i].float().view(kv_heads, group, dim)
        probs = torch.softmax(scale * q @ keys.transpose(1, 2), dim=-1)  # [kvh, group, len]
        out[i] = (probs @ values).reshape(heads, dim)
    return out.to(query.dtype)
