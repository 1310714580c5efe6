"""Pretraining and SFT of looped models on DeepSpeed with mixed-depth training.

Light to import: DeepSpeed and Ray are imported only inside the engine and the
launchers. The RL learner reuses `elr_rl.train.engine.TrainEngine`.
"""

from elr_rl.train.config import TrainConfig

__all__ = ["TrainConfig"]
