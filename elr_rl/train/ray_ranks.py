"""Training ranks as Ray actors with a torch.distributed rendezvous (imports Ray: load only when used).

The driver creates one `RankActor` per rank, asks rank 0's actor for its node's
address and a free port there, then starts every rank's `run` at once (the
process group forms only when all ranks have joined). The RL learner
(elr_rl/rl/learner.py) creates its own rank actors the same way; it does not use this module.
"""

from __future__ import annotations

import copy
import os
from pathlib import Path
from typing import Any

import ray

from elr_rl.train.config import TrainConfig
from elr_rl.train.rank import check_shared_folder


@ray.remote
class RankActor:
    """One data-parallel training rank living in a Ray worker process."""

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port on it (used by rank 0 for the rendezvous)."""
        from elr_rl.train.rank import free_port

        return ray.util.get_node_ip_address(), free_port()

    def sees(self, path: str) -> bool:
        """Whether `path` exists where this rank runs (the output folder must be shared storage)."""
        return os.path.exists(path)

    def run(self, cfg: TrainConfig, rank: int, world_size: int, master_addr: str, master_port: int) -> Any:
        from elr_rl.train.rank import run_rank

        # Each actor sees only its own GPU(s) (Ray sets CUDA_VISIBLE_DEVICES): local rank 0.
        return run_rank(cfg, rank, world_size, master_addr, master_port, local_rank=0)


def with_absolute_paths(cfg: TrainConfig) -> TrainConfig:
    """A copy whose paths (output folder, init checkpoint, tokenizer, data files) are absolute: a rank actor's
    working directory is its own (a Ray job's copy, another node's), not the launcher's."""
    cfg = copy.deepcopy(cfg)
    absolute = lambda p: str(Path(p).resolve())  # noqa: E731
    cfg.run.output_dir = absolute(cfg.run.output_dir)
    if cfg.model.init_from is not None:
        cfg.model.init_from = absolute(cfg.model.init_from)
    if cfg.model.tokenizer is not None:
        cfg.model.tokenizer = absolute(cfg.model.tokenizer)
    cfg.data.files = [absolute(f) for f in cfg.data.files]
    return cfg


def launch_on_ray(cfg: TrainConfig) -> dict[str, Any] | None:
    """Run the ranks as Ray actors; returns rank 0's summary. Starts (and stops) Ray if not running."""
    cfg = with_absolute_paths(cfg)
    d = cfg.dist
    started = not ray.is_initialized()
    if started:
        ray.init(address=d.ray_address or "local", include_dashboard=False, log_to_driver=True)
    actors = [
        RankActor.options(num_cpus=d.ray_num_cpus_per_rank, num_gpus=d.ray_num_gpus_per_rank).remote()
        for _ in range(d.world_size)
    ]
    try:
        check_shared_folder(cfg.run.output_dir, {"rank": lambda p: ray.get([a.sees.remote(p) for a in actors])})
        addr, port = ray.get(actors[0].address.remote())
        if d.master_port:
            port = d.master_port
        results = ray.get([a.run.remote(cfg, r, d.world_size, addr, port) for r, a in enumerate(actors)])
        return results[0]
    finally:
        for a in actors:
            ray.kill(a)
        if started:
            ray.shutdown()
