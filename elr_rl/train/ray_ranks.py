"""Training ranks as Ray actors with a torch.distributed rendezvous (imports Ray: load only when used).

The driver creates one `RankActor` per rank, asks rank 0's actor for its node's
address and a free port there, then starts every rank's `run` at once (the
process group forms only when all ranks have joined). The RL learner
(elr_rl/rl/learner.py) creates its own rank actors the same way; it does not use this module.
"""

from __future__ import annotations

from typing import Any

import ray

from elr_rl.train.config import TrainConfig


@ray.remote
class RankActor:
    """One data-parallel training rank living in a Ray worker process."""

    def address(self) -> tuple[str, int]:
        """This node's IP and a free port on it (used by rank 0 for the rendezvous)."""
        from elr_rl.train.rank import free_port

        return ray.util.get_node_ip_address(), free_port()

    def run(self, cfg: TrainConfig, rank: int, world_size: int, master_addr: str, master_port: int) -> Any:
        from elr_rl.train.rank import run_rank

        # Each actor sees only its own GPU(s) (Ray sets CUDA_VISIBLE_DEVICES): local rank 0.
        return run_rank(cfg, rank, world_size, master_addr, master_port, local_rank=0)


def launch_on_ray(cfg: TrainConfig) -> dict[str, Any] | None:
    """Run the ranks as Ray actors; returns rank 0's summary. Starts (and stops) Ray if not running."""
    d = cfg.dist
    started = not ray.is_initialized()
    if started:
        ray.init(address=d.ray_address or "local", include_dashboard=False, log_to_driver=True)
    actors = [
        RankActor.options(num_cpus=d.ray_num_cpus_per_rank, num_gpus=d.ray_num_gpus_per_rank).remote()
        for _ in range(d.world_size)
    ]
    try:
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
