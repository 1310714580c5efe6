"""The driver's share of a checkpoint: step, buffer, queued prompts, curriculum state, ledger.

The learner writes the model and optimizer next to it (`TrainEngine.save`);
this file is written last, so a checkpoint folder with `run_state.json` is complete.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATE_FILE = "run_state.json"


@dataclass
class RunState:
    step: int
    version: int
    buffer: dict[str, Any]
    queue: list[dict[str, Any]]  # assignments scheduled but not yet scored: re-queued on resume
    curriculum: dict[str, Any]
    ledger: dict[str, int] = field(default_factory=dict)

    @classmethod
    def load(cls, ckpt: Path) -> "RunState":
        d = json.loads((Path(ckpt) / STATE_FILE).read_text())
        d.pop("python_rng", None)  # written by older versions; nothing in a run draws from Python's random
        return cls(**d)


def save_run_state(ckpt: Path, state: RunState) -> None:
    ckpt = Path(ckpt)
    ckpt.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=ckpt, prefix=".run_state.", suffix=".tmp")
    with os.fdopen(fd, "w") as f:
        json.dump(asdict(state), f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, ckpt / STATE_FILE)


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    """Same naming as the training stages: <run_dir>/checkpoints/step_0000020."""
    return Path(run_dir) / "checkpoints" / f"step_{step:07d}"


def mark_latest(ckpt: Path) -> None:
    """Point <run_dir>/checkpoints/latest at a complete checkpoint (after its run_state.json)."""
    (ckpt.parent / "latest").write_text(ckpt.name)


def latest_checkpoint(run_dir: Path) -> Path | None:
    """The newest complete checkpoint (one whose run_state.json was written) of a run, if any."""
    root = Path(run_dir) / "checkpoints"
    done = sorted(p for p in root.glob("step_*") if (p / STATE_FILE).is_file()) if root.is_dir() else []
    return done[-1] if done else None
