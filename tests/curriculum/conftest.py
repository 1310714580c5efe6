"""Shared fixtures of the curriculum tests: one local Ray cluster for the whole package."""

from __future__ import annotations

import os

import pytest


@pytest.fixture(scope="package")
def ray_local():
    import ray

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = not ray.is_initialized()  # another package's session cluster, when tests run in another order
    if started:
        ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    if started:
        ray.shutdown()
