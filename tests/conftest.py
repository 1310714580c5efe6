"""Fixtures shared across test packages."""

from __future__ import annotations

import os

import pytest

os.environ.setdefault("RAY_AUTH_MODE", "disabled")  # local test clusters need no token


@pytest.fixture(scope="session")
def toy_checkpoint(tmp_path_factory):
    """A tiny model that learned even_odd's answer format, and its answers a little better than chance."""
    import torch

    from elr_rl.rl.toy import format_sft_checkpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return format_sft_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt", steps=150, warm_steps=30)
    finally:
        torch.set_num_threads(threads)
