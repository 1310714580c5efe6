"""Rollout generation: the vLLM engine API the rollout workers call (vLLM is imported lazily)."""

from elr_rl.rollout.engine import Completion, CompletionGroup, EngineOptions, RolloutEngine, Ticket

__all__ = ["Completion", "CompletionGroup", "EngineOptions", "RolloutEngine", "Ticket"]
