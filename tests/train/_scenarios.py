"""Training scenarios run inside real 2-rank DeepSpeed process groups (gloo), shared by the tests.

One spawn of two processes runs several trainings in a row (the process group and
the imports are paid once): an uninterrupted run, the same run interrupted and
resumed, a delayed-mixed-depth run probed across its switch (ZeRO-3, bf16), and an
nGPT (Dory-format) bf16 run whose fp32 master weights must stay normalised.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "pretrain_tiny.yaml"
DORY_CONFIG = CONFIG.parent / "pretrain_tiny_dory.yaml"
COMMON = [
    "dist.world_size=2", "engine.micro_batch_size=4", "engine.grad_accum_steps=2", "data.seq_len=64",
    "run.progress=false", "schedule.warmup_steps=3", "optim.lr=0.005",
]
STEPS = 20


def pretrain_overrides(out: Path) -> dict[str, list[str]]:
    base = [*COMMON, "engine.zero_stage=2", f"run.total_steps={STEPS}", f"run.eval_interval={STEPS}"]
    return {
        "full": [*base, f"run.output_dir={out / 'full'}"],
        "part1": [*base, f"run.output_dir={out / 'resumed'}", f"run.stop_after_steps={STEPS // 2}"],
        "part2": [*base, f"run.output_dir={out / 'resumed'}"],
    }


def delayed_overrides(out: Path) -> list[str]:
    return [*COMMON, "engine.zero_stage=3", "engine.precision=bf16", "run.total_steps=8", "run.eval_interval=0",
            "loops.delay_fraction=0.5", "loops.force_one_fraction=0.0", "loops.mode=synchronized", f"run.output_dir={out / 'delayed'}"]


def _heads_abs_sum(trainer) -> float:
    state = trainer.engine.full_state_dict()
    return float(sum(v.abs().sum() for n, v in state.items() if ".loop_cond.heads." in n))


@torch.no_grad()
def _probe(trainer, batch) -> dict[int, torch.Tensor]:
    trainer.engine.engine.eval()
    b = trainer.engine.to_device(batch)
    return {k: trainer.engine.forward(b, k).float().cpu() for k in range(1, trainer.K + 1)}


def run_delayed(cfg, rank: int, world: int) -> dict:
    from elr_rl.train.trainer import Trainer

    tr = Trainer(cfg, rank, world)
    probe, res = tr.heldout[0], {"ks": [], "switch_at": tr.sampler.switch_at}
    for step in range(cfg.run.total_steps):
        if step == tr.sampler.switch_at:
            res["heads_before_switch"] = _heads_abs_sum(tr)
            before = _probe(tr, probe)
            tr._delay_phase(step)  # the switch: zero-init the heads, unfreeze the conditioning
            after = _probe(tr, probe)
            res["max_change_at_switch"] = max(float((before[k] - after[k]).abs().max()) for k in before)
            res["k_spread_at_switch"] = float((after[1] - after[tr.K]).abs().max())
        ks = tr.train_one_step(step)["loops/ks"]  # rank-major: [rank0 micro0, rank0 micro1, rank1 ...]
        res["ks"].append([ks[:2], ks[2:]])
    res["heads_after_training"] = _heads_abs_sum(tr)
    return res


def ngpt_overrides(out: Path) -> list[str]:
    return [*COMMON, "engine.zero_stage=0", "engine.precision=bf16",
            "engine.micro_batch_size=2", "engine.grad_accum_steps=1", "data.seq_len=32", "run.total_steps=2",
            "run.eval_interval=0", "run.eval_batches=1", f"run.output_dir={out / 'ngpt'}"]


def run_ngpt(cfg, rank: int, world: int) -> dict:
    """nGPT re-normalisation must reach the fp32 masters of a bf16 engine, not only the bf16 copies."""
    from elr_rl.train.trainer import Trainer

    tr = Trainer(cfg, rank, world)
    for step in range(cfg.run.total_steps):
        tr.train_one_step(step)
    state = tr.engine.full_state_dict()
    rows = state["backbone.layers.0.mixer.q_proj.weight"].norm(dim=1)
    cols = state["backbone.layers.1.mixer.down_proj.weight"].norm(dim=0)
    return {"max_norm_error": float(torch.cat([rows, cols]).sub(1).abs().max()),
            "master_dtype": str(state["backbone.layers.0.mixer.q_proj.weight"].dtype)}


def worker(rank: int, world: int, port: int, out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    from elr_rl.config import load_config
    from elr_rl.train.config import TrainConfig
    from elr_rl.train.engine import release_process_groups
    from elr_rl.train.launch import leave_spawned_rank
    from elr_rl.train.trainer import Trainer

    out_dir = Path(out)
    results = {}
    for name, overrides in pretrain_overrides(out_dir).items():
        results[name] = Trainer(load_config(TrainConfig, CONFIG, overrides), rank, world).run()
    results["delayed"] = run_delayed(load_config(TrainConfig, CONFIG, delayed_overrides(out_dir)), rank, world)
    results["ngpt"] = run_ngpt(load_config(TrainConfig, DORY_CONFIG, ngpt_overrides(out_dir)), rank, world)
    if rank == 0:
        torch.save(results, out_dir / "results.pt")
    release_process_groups()
    leave_spawned_rank()  # as the launcher's ranks do
