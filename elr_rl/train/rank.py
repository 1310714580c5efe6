"""One rank of a training run, whatever started it (`train.launch`: torchrun, spawned processes;
`train.ray_ranks`: Ray actors). Both launchers import this module; it imports neither."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path
from typing import Any

from elr_rl.train.config import TrainConfig


def free_port() -> int:
    """A TCP port free on this machine now (for a torch.distributed rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def run_rank(cfg: TrainConfig, rank: int, world_size: int, master_addr: str, master_port: int,
             local_rank: int | None = None) -> dict[str, Any] | None:
    """Run one rank to the end; rank 0 returns the run summary (also written to summary.json)."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master_addr, str(master_port)
    from elr_rl.train.trainer import Trainer

    trainer = Trainer(cfg, rank, world_size, local_rank=local_rank)
    try:
        summary = trainer.run()
    finally:
        trainer.close()
    if rank != 0:
        return None
    Path(cfg.run.output_dir, "summary.json").write_text(json.dumps(summary, indent=1))
    return summary
