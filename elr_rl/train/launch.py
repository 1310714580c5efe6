"""Start the data-parallel ranks of a training run.

* `env`: this process is one rank of an external launch (torchrun / deepspeed set
  RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT).
* `local`: spawn `world_size` processes on this machine (one process when 1).
* `ray`: one Ray actor per rank anywhere on a Ray cluster; rank 0's node hosts
  the torch.distributed rendezvous (see `elr_rl.train.ray_ranks`).

Every path ends in `train.rank.run_rank`, and rank 0's summary is what the launch returns.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any, NoReturn

from elr_rl.train.config import TrainConfig
from elr_rl.train.rank import free_port, run_rank


def _spawned_rank(rank: int, cfg: TrainConfig, world_size: int, port: int) -> None:
    run_rank(cfg, rank, world_size, "127.0.0.1", port, local_rank=rank)
    leave_spawned_rank()


def leave_spawned_rank() -> NoReturn:
    """End a spawned rank whose work is done and written, without the interpreter's teardown.

    A gloo process group that DeepSpeed still holds (ZeRO-3 keeps its engine alive past
    `Trainer.close`, which releases everything else) can abort the process in that teardown
    now and then, and the launcher would then report a finished run as failed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def launch(cfg: TrainConfig) -> dict[str, Any] | None:
    """Run the whole training job as configured; returns rank 0's summary (None on other env ranks)."""
    d = cfg.dist
    if d.launcher == "env":
        rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
        return run_rank(cfg, rank, world, os.environ.get("MASTER_ADDR", "127.0.0.1"),
                        int(os.environ.get("MASTER_PORT", d.master_port or 29500)),
                        local_rank=int(os.environ.get("LOCAL_RANK", rank)))
    if d.launcher == "ray":
        from elr_rl.train.ray_ranks import launch_on_ray

        return launch_on_ray(cfg)
    port = d.master_port or free_port()
    if d.world_size == 1:
        return run_rank(cfg, 0, 1, "127.0.0.1", port, local_rank=0)
    import torch.multiprocessing as mp

    Path(cfg.run.output_dir).mkdir(parents=True, exist_ok=True)
    # spawn, not fork: a forked child would inherit this process's torch/DeepSpeed state.
    mp.start_processes(_spawned_rank, args=(cfg, d.world_size, port), nprocs=d.world_size, join=True,
                       start_method="spawn")
    return json.loads(Path(cfg.run.output_dir, "summary.json").read_text())
