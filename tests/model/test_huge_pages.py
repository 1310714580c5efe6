"""elr_rl.model.huge_pages: which memory is advised, and that advising keeps contents."""

from __future__ import annotations

import pytest
import torch

from elr_rl.model import huge_pages
from elr_rl.model.huge_pages import HUGE_PAGE, aligned_span

MiB = 1 << 20


def test_aligned_span_keeps_inside_the_range():
    assert aligned_span(0, 3 * HUGE_PAGE) == (0, 3 * HUGE_PAGE)
    assert aligned_span(1, 3 * HUGE_PAGE) == (HUGE_PAGE, 2 * HUGE_PAGE)  # the partial pages at both ends are left
    assert aligned_span(1, 3 * HUGE_PAGE - 2) == (HUGE_PAGE, HUGE_PAGE)
    assert aligned_span(HUGE_PAGE - 1, HUGE_PAGE + 2) == (HUGE_PAGE, HUGE_PAGE)
    assert aligned_span(5, HUGE_PAGE)[1] == 0  # no whole page inside
    assert aligned_span(5, 10)[1] == 0


def test_small_and_non_cpu_tensors_are_left_alone():
    assert huge_pages.advise(torch.zeros(1000)).as_dict() == {"advised_bytes": 0, "collapsed_bytes": 0, "errors": {},
                                                             "seconds": 0.0}
    assert huge_pages.advise(torch.zeros(4, device="meta")).advised == 0


@pytest.mark.skipif(not huge_pages.supported(), reason="needs Linux with transparent huge pages not 'never'")
def test_advise_collapses_a_large_tensor_and_keeps_its_contents():
    t = torch.randn(24 * MiB // 4, generator=torch.Generator().manual_seed(0))  # 24 MiB, resident
    copy = t.clone()
    before = huge_pages.huge_bytes()
    report = huge_pages.advise(t)
    first, length = aligned_span(t.untyped_storage().data_ptr(), t.untyped_storage().nbytes())
    assert report.advised == length >= 22 * MiB
    assert report.collapsed == report.advised or report.errors  # collapse is best effort; failures are named
    if not report.errors:
        assert huge_pages.huge_bytes() - before >= report.collapsed - 2 * HUGE_PAGE  # counted by the kernel
    assert torch.equal(t, copy)


@pytest.mark.skipif(not huge_pages.supported(), reason="needs Linux with transparent huge pages not 'never'")
def test_advise_all_advises_each_storage_once():
    t = torch.zeros(8 * MiB // 4)
    views = [t, t[: t.numel() // 2], t.view(2, -1)]
    report = huge_pages.advise_all(views + [torch.zeros(3), "not a tensor"], collapse=False)
    assert report.advised == aligned_span(t.data_ptr(), t.untyped_storage().nbytes())[1]
    assert report.collapsed == 0
