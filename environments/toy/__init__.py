"""Toy environments for tests, demos and the "add an environment" example (not among the 23)."""
