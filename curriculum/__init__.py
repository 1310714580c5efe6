"""Difficulty-aware loop curriculum: pass-rate profiling, routing scores and the curriculum service.

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
