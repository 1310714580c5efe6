"""Runtime environments of the RL actors."""

from __future__ import annotations

import os
from typing import Any


def actor_runtime_env(env_vars: dict[str, str]) -> dict[str, Any]:
    """The job's runtime env (its working_dir, under `ray job submit`) plus these env vars.

    An actor whose runtime env drops the job's working_dir gets a different one, and Ray
    may then garbage-collect the job's unpacked working_dir from under the driver.
    """
    import ray

    from environments.registry import SPECS_ENV

    job_env = dict(ray.get_runtime_context().runtime_env or {})
    if os.environ.get(SPECS_ENV):  # dataset environments of this run resolve by name in every actor
        env_vars = {SPECS_ENV: os.environ[SPECS_ENV], **env_vars}
    job_env["env_vars"] = {**job_env.get("env_vars", {}), **env_vars}
    return job_env
