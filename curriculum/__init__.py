"""Difficulty-aware loop curriculum: pass-rate estimates, routing scores and the curriculum service.

It imports nothing of `elr_rl` or `environments`: the profiler that measures pass rates with the
rollout engine is `elr_rl.profile`, above both.

Importing this package is cheap: Ray, vLLM and `datasets` load only inside the
functions that use them.
"""

from curriculum.passrates import PROFILE_COLUMNS, RolloutResult
from curriculum.routing import Assignment, CurriculumConfig, LoopRouter, Prompt, build_pool, midpoint_quantiles

__all__ = [
    "PROFILE_COLUMNS",
    "Assignment",
    "CurriculumConfig",
    "LoopRouter",
    "Prompt",
    "RolloutResult",
    "build_pool",
    "midpoint_quantiles",
]
