"""One rank of a training run, whatever started it (`train.launch`: torchrun, spawned processes;
`train.ray_ranks`: Ray actors). Both launchers import this module; it imports neither."""

from __future__ import annotations

import json
import os
import socket
import uuid
from pathlib import Path
from typing import Any, Callable

from elr_rl.train.config import TrainConfig


def free_port() -> int:
    """A TCP port free on this machine now (for a torch.distributed rendezvous)."""
    with socket.socket() as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])


def check_shared_folder(folder: str | Path, askers: dict[str, Callable[[str], list[bool]]]) -> None:
    """Every actor must see the run folder: ranks write their checkpoints there, resumed runs and restarted
    workers read them back, so on a cluster it must be storage all nodes mount. `askers`: a label ("rank") ->
    a function asking each such actor whether a path exists where it runs. ValueError naming the blind ones."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f".visible-{uuid.uuid4().hex}"
    marker.write_text("written by the launcher; every actor of the run must see it\n")
    try:
        blind = [f"{label} {i}" for label, ask in askers.items() for i, ok in enumerate(ask(str(marker))) if not ok]
    finally:
        marker.unlink(missing_ok=True)
    if blind:
        raise ValueError(
            f"config field `run.output_dir`: {folder} is not visible from {', '.join(blind)} (another node's file "
            "system): put the run folder on storage every node mounts at the same path (NFS, a parallel file "
            "system), e.g. run.output_dir=/shared/runs/NAME")


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
