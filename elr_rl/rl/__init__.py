"""Asynchronous GRPO on Ray: rollout workers, learner, curriculum, driver."""
