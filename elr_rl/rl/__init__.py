"""Asynchronous GRPO on Ray: rollout workers, learner, curriculum, driver (DESIGN.md section 3)."""
