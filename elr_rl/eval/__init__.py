"""Evaluation of a checkpoint across loop counts (pass@1 and response length per environment and k)."""
