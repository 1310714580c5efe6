"""Shared fixtures of the RL integration tests: one Ray cluster for the package (the toy checkpoint is in tests/conftest.py)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="package")
def ray_cluster():
    import ray

    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    yield ray.get_runtime_context().gcs_address
    ray.shutdown()
