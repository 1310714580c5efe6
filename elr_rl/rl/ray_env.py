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
    from environments.sandbox_tier import SANDBOX_ENV_VARS

    job_env = dict(ray.get_runtime_context().runtime_env or {})
    # dataset environments of this run resolve by name in every actor; its sandbox settings hold on every node
    inherited = {name: os.environ[name] for name in (SPECS_ENV, *SANDBOX_ENV_VARS) if os.environ.get(name)}
    env_vars = {**inherited, **env_vars}
    job_env["env_vars"] = {**job_env.get("env_vars", {}), **env_vars}
    return job_env
