"""The few-row fp32 gemm kernel (elr_rl/model/cpu_gemm.py) against F.linear on the unpacked weight."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model import cpu_attention, cpu_gemm

pytestmark = pytest.mark.skipif(cpu_gemm.kernels() is None, reason="the CPU kernels cannot be built here")


def _close(got: torch.Tensor, want: torch.Tensor, k: int) -> None:
    """fp32 sums in another order: within a few ulps of the sum of |terms| (here bounded by sqrt(k) scale)."""
    assert got.shape == want.shape and got.dtype == torch.float32
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * max(1.0, k ** 0.5))


@pytest.mark.parametrize("n,k", [(16, 64), (37, 129), (5, 7), (250, 1024), (1024, 2816), (1, 3)])
@pytest.mark.parametrize("bias", [False, True])
def test_matches_f_linear_at_every_row_count(n, k, bias):
    g = torch.Generator().manual_seed(n * 1000 + k)
    weight = torch.randn(n, k, generator=g) * k ** -0.5
    b = torch.randn(n, generator=g) if bias else None
    panels = cpu_gemm.pack_panels(weight)
    assert panels.shape == (-(-n // 16), k, 16)
    # every register block (6 rows) and remainder (1-5 rows), and a few larger batches
    for rows in [*range(0, 14), 17, 64, 101]:
        x = torch.randn(rows, k, generator=g)
        _close(cpu_gemm.linear(x, panels, n, b), torch.nn.functional.linear(x, weight, b), k)


def test_leading_dims_strided_input_and_the_pytorch_reference():
    g = torch.Generator().manual_seed(1)
    weight, b = torch.randn(40, 96, generator=g), torch.randn(40, generator=g)
    panels = cpu_gemm.pack_panels(weight)
    x = torch.randn(3, 5, 2 * 96, generator=g)[..., ::2]  # not contiguous
    want = torch.nn.functional.linear(x, weight, b)
    _close(cpu_gemm.linear(x, panels, 40, b), want, 96)
    _close(cpu_gemm.reference(x, panels, 40, b), want, 96)


def test_results_do_not_depend_on_the_thread_count():
    """Each panel is computed whole by one thread: 1 and 2 threads give the same bits."""
    g = torch.Generator().manual_seed(2)
    weight = torch.randn(300, 512, generator=g)
    panels, x = cpu_gemm.pack_panels(weight), torch.randn(9, 512, generator=g)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = cpu_gemm.linear(x, panels, 300)
        torch.set_num_threads(2)
        two = cpu_gemm.linear(x, panels, 300)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_non_finite_inputs_propagate_as_in_f_linear():
    weight = torch.ones(16, 8)
    x = torch.zeros(3, 8)
    x[0, 2], x[1, 5] = float("inf"), float("nan")
    got = cpu_gemm.linear(x, cpu_gemm.pack_panels(weight), 16)
    want = torch.nn.functional.linear(x, weight)
    assert torch.equal(got.isinf(), want.isinf()) and torch.equal(got.isnan(), want.isnan())
    assert torch.equal(got[2], want[2])


def test_bad_inputs_say_what_to_change():
    panels = cpu_gemm.pack_panels(torch.randn(20, 8))
    with pytest.raises(ValueError, match="fp32"):
        cpu_gemm.pack_panels(torch.randn(20, 8, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="columns"):
        cpu_gemm.linear(torch.randn(2, 9), panels, 20)
    with pytest.raises(RuntimeError, match="fp32"):
        cpu_gemm.linear(torch.randn(2, 8, dtype=torch.float64), panels, 20)
    with pytest.raises(RuntimeError, match="does not fit"):
        cpu_gemm.linear(torch.randn(2, 8), panels, 40)
    with pytest.raises(RuntimeError, match="bias"):
        cpu_gemm.linear(torch.randn(2, 8), panels, 20, torch.randn(19))


def test_available_only_where_it_was_measured():
    """An AVX-512 CPU keeps oneDNN (measured faster there, and it picks bf16); AVX2 uses the kernel where
    it was built vectorised."""
    assert not cpu_gemm.available("AVX512") and not cpu_gemm.available("DEFAULT")
    assert cpu_gemm.available("AVX2") == bool(cpu_attention.load().vectorised_gemm())
