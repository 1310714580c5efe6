"""elr-rl: reinforcement-learning post-training for looped (elastic-depth) language models.

Importing this package is cheap: it never imports vLLM, Ray or DeepSpeed. Those
live inside the modules that need them (rollout workers, learner, CLI commands).
"""

__version__ = "0.1.0"
