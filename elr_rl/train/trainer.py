"""The pretraining / SFT loop run by every data-parallel rank.

    for step in range(start, total_steps):
        microbatches = packer.next_batch() x grad_accum_steps      # this rank's shard of the stream
        ks = [sampler.k(step, i) for i]                            # mixed depth (forced ranks -> 1)
        engine.train_step(microbatches, ks, lr_at(step))           # DeepSpeed step (+ nGPT renorm)
        rank 0: metrics row (loss per k, tokens/s, lr, grad norm, held-out loss per k) through
                elr_rl.metrics.MetricsWriter (metrics.jsonl + TensorBoard); checkpoint

Everything that decides what a step trains on (packer cursor, loop draws,
lr) is either saved in the checkpoint or a pure function of the step, so a
resumed run repeats the uninterrupted run's losses.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from elr_rl.train.config import TrainConfig

LOOP_COND_PREFIX = ("backbone.loop_cond.",)


def _all_gather(obj: Any, world_size: int) -> list[Any]:
    import torch.distributed as dist

    if world_size == 1:
        return [obj]
    out: list[Any] = [None] * world_size
    dist.all_gather_object(out, obj)
    return out


def _barrier(world_size: int) -> None:
    import torch.distributed as dist

    if world_size > 1:
        dist.barrier()


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The checkpoint directory named in <output_dir>/checkpoints/latest, if any."""
    marker = Path(output_dir) / "checkpoints" / "latest"
    if not marker.is_file():
        return None
    path = marker.parent / marker.read_text().strip()
    return path if path.is_dir() else None


def step_metrics(gathered: list[dict], tokens: int, seconds: float) -> dict[str, Any]:
    """One step's metrics row (elr_rl.metrics key names): mean loss, loss per k, k counts, tokens/s,
    lr, grad norm, and `loops/ks`: every microbatch's k, rank-major ([rank0 micro0, rank0 micro1, ...])."""
    per_k: dict[int, list[float]] = {}
    for r in gathered:
        for k, loss in zip(r["ks"], r["losses"]):
            per_k.setdefault(k, []).append(loss)
    all_losses = [x for r in gathered for x in r["losses"]]
    row: dict[str, Any] = {
        "loss/mean": sum(all_losses) / len(all_losses),
        "lr": gathered[0]["lr"],
        "grad_norm": gathered[0]["grad_norm"],
        "perf/tokens": tokens,
        "perf/tokens_per_s": tokens / max(seconds, 1e-9),
        "perf/step_time_s": seconds,
        "loops/ks": [k for r in gathered for k in r["ks"]],
    }
    for k in sorted(per_k):
        row[f"loss/k{k}"] = sum(per_k[k]) / len(per_k[k])
        row[f"loops/count_k{k}"] = len(per_k[k])
    return row


def export_final(ckpt: Path, final: Path) -> None:
    """Copy the last checkpoint's Hugging Face files (weights, config, tokenizer; not the optimizer)
    to <output_dir>/final: the path the next stage (SFT, `elr-rl rl model_path=...`, eval) names."""
    import shutil

    if final.exists():
        shutil.rmtree(final)
    final.mkdir(parents=True)
    for f in ckpt.iterdir():
        if f.is_file():
            shutil.copy2(f, final / f.name)


@dataclass
class RunState:
    """Where the run stands (the rest of the resume state lives in the packer, sampler and engine)."""

    step: int = 0


class Trainer:
    """One rank's training run (engine, data, loop sampler, metrics, checkpoints)."""

    def __init__(self, cfg: TrainConfig, rank: int, world_size: int, local_rank: int | None = None) -> None:
        from elr_rl.train.build import build_codec_for, build_model, build_model_config
        from elr_rl.train.config import check_rank_uniform_depth
        from elr_rl.train.corpus import build_source
        from elr_rl.train.data import Packer, fixed_batches, preflight
        from elr_rl.train.engine import TrainEngine
        from elr_rl.train.sampler import LoopSampler

        check_rank_uniform_depth(cfg, world_size)  # the real world size (env launches may differ from config)
        self.cfg, self.rank, self.world_size = cfg, rank, world_size
        self.out = Path(cfg.run.output_dir)
        self.model_cfg = build_model_config(cfg.model, cfg.loops)
        self.codec = build_codec_for(cfg.model, cfg.data.chat, self.model_cfg.vocab_size)
        model = build_model(cfg.model, self.model_cfg, cfg.run.seed)
        self.K = model.spec.max_loops
        self.has_loop_cond = model.backbone.loop_cond is not None
        self.engine = TrainEngine(self.model_cfg, cfg, rank, world_size, model=model, local_rank=local_rank)
        d = cfg.data
        source = build_source(d, cfg.stage)
        loop_targets = self.K if cfg.loop_aux.enabled and cfg.loop_aux.targets != "final" else 0
        dense, partial = cfg.loop_aux.dense, cfg.loop_aux.targets == "chain"
        self.preflight = preflight(source, self.codec, d.seq_len, cfg.stage,  # nothing that fits: an error here
                                   loop_targets=loop_targets, dense_targets=dense, partial_targets=partial)
        if rank == 0:
            for report in self.preflight:
                print(f"[data] {report.line()}", flush=True)
        self.packer = Packer(source, self.codec, d.seq_len, cfg.stage, rank, world_size,
                             loop_targets=loop_targets, dense_targets=dense, partial_targets=partial,
                             with_steps=cfg.loops.difficulty_aware)
        self.heldout = fixed_batches(build_source(d, cfg.stage, heldout=True), self.codec, d.seq_len, cfg.stage,
                                     cfg.engine.micro_batch_size, cfg.run.eval_batches)
        self.sampler = LoopSampler(cfg.loops, self.K, cfg.run.seed, rank, world_size, cfg.run.total_steps)
        self.state = RunState()
        self._pending: dict[str, Any] = {}
        self.writer = None
        if rank == 0:
            from elr_rl.metrics import MetricsWriter

            self.writer = MetricsWriter.from_config(self.out, cfg.metrics, run_config=cfg)
        if cfg.run.resume and (ckpt := latest_checkpoint(self.out)) is not None:
            self._restore(ckpt)
        if rank == 0:
            from elr_rl.config import save_config

            save_config(cfg, self.out / "config.yaml")

    # ------------------------------------------------------------------ checkpoints
    def _restore(self, ckpt: Path) -> None:
        client = self.engine.load(ckpt)
        if len(client["packers"]) != self.world_size:
            raise ValueError(
                f"config field `dist.world_size`: checkpoint {str(ckpt)!r} was written by {len(client['packers'])} "
                f"ranks, this run has {self.world_size}; resume with the same world size (each rank owns a data shard)"
            )
        self.state.step = int(client["step"])
        self.packer.load_state_dict(client["packers"][self.rank])
        self.sampler.load_state_dict(client["sampler"])
        torch.set_rng_state(client["torch_rng"][self.rank])
        self.note(**{"event/resumed": 1})

    def save(self, step: int) -> Path:
        """Checkpoint after `step` optimizer steps: HF weights + tokenizer + DeepSpeed + cursors."""
        packers = _all_gather(self.packer.state_dict(), self.world_size)
        rngs = _all_gather(torch.get_rng_state(), self.world_size)
        name = f"step_{step:07d}"
        path = self.out / "checkpoints" / name
        client = {"step": step, "packers": packers, "sampler": self.sampler.state_dict(), "torch_rng": rngs}
        self.engine.save(path, client, tokenizer=self.codec)
        _barrier(self.world_size)
        if self.rank == 0:
            (self.out / "checkpoints" / "latest").write_text(name)
        return path

    # ------------------------------------------------------------------ metrics
    def note(self, **metrics: Any) -> None:
        """Metrics (events, evaluations) to add to the current step's row."""
        self._pending.update(metrics)

    def log(self, step: int, row: dict[str, Any]) -> None:
        """Write one row (rank 0) to metrics.jsonl / TensorBoard, with anything noted since the last row."""
        row = {**row, **self._pending}
        self._pending = {}
        if self.writer is not None:
            self.writer.log(step, row)

    def evaluate(self) -> dict[str, float]:
        """Held-out loss at every k in 1..K (the same batches on every rank and every call)."""
        row = {}
        for k in range(1, self.K + 1):
            if self.heldout:  # run.eval_batches = 0: no held-out evaluation
                row[f"eval/loss_k{k}"] = sum(self.engine.eval_loss(b, k) for b in self.heldout) / len(self.heldout)
        self.note(**row)
        return row

    # ------------------------------------------------------------------ the loop
    def _delay_phase(self, step: int) -> None:
        """Delayed mixed depth: k = 1 with the conditioning frozen, then switch once."""
        if not self.has_loop_cond:
            return
        if self.sampler.in_delay(step):
            self.engine.freeze(LOOP_COND_PREFIX)  # heads stay zero-initialised: switching on changes nothing
        elif self.sampler.should_switch(step):
            self.engine.freeze(())
            self.engine.apply_to_weights_(lambda m: m.reset_loop_conditioning_())
            self.sampler.mark_switched()
            self.note(**{"event/mixed_depth_switch": 1})
        else:
            self.engine.freeze(())

    def train_one_step(self, step: int) -> dict[str, Any]:
        from elr_rl.train.schedule import lr_at

        c = self.cfg
        t0 = time.perf_counter()
        self._delay_phase(step)
        micro = [self.packer.next_batch(c.engine.micro_batch_size) for _ in range(c.engine.grad_accum_steps)]
        ks = [self.sampler.k(step, i) for i in range(len(micro))]
        if c.loops.difficulty_aware:  # k >= the serial steps the microbatch's hardest document needs
            from elr_rl.train.loopwise import difficulty_aware_k

            ks = [difficulty_aware_k(k, int(mb["steps"].max()) if "steps" in mb else 0, self.K)
                  for k, mb in zip(ks, micro)]
        stats = self.engine.train_step(micro, ks, lr_at(step, c.run.total_steps, c.optim.lr, c.schedule))
        stats["ks"] = ks
        stats["data_dropped"] = dict(self.packer.dropped)
        stats["data_own_targets"] = dict(self.packer.own_targets)
        gathered = _all_gather(stats, self.world_size)
        tokens = c.engine.micro_batch_size * c.engine.grad_accum_steps * self.world_size * c.data.seq_len
        row = step_metrics(gathered, tokens, time.perf_counter() - t0)
        dropped = sum((Counter(g["data_dropped"]) for g in gathered), Counter())
        for src, n in dropped.items():  # SFT documents longer than a sequence: skipped, never truncated
            row[f"data/dropped_too_long/{src}"] = n
        own = sum((Counter(g["data_own_targets"]) for g in gathered), Counter())
        for src, n in own.items():  # loop_aux per-step/dense targets asked for, the document has none
            row[f"data/no_loop_targets/{src}"] = n
        return row

    def run(self) -> dict[str, Any]:
        """Train to run.total_steps (or run.stop_after_steps); rank 0 returns a summary."""
        c = self.cfg.run
        stop = min(c.total_steps, c.stop_after_steps or c.total_steps)
        bar = None
        if self.rank == 0 and c.progress:
            from tqdm import tqdm

            bar = tqdm(total=stop, initial=self.state.step, desc=f"{self.cfg.stage}", dynamic_ncols=True)
        history, last_eval = [], {}
        if self.state.step == 0 and c.eval_interval:
            self.log(0, self.evaluate())  # the starting point of every held-out curve
        t_start, tokens = time.perf_counter(), 0
        for step in range(self.state.step, stop):
            row = self.train_one_step(step)
            history.append(row)
            tokens += row["perf/tokens"]
            self.state.step = step + 1
            if step + 1 == stop or (c.eval_interval and (step + 1) % c.eval_interval == 0):
                last_eval = self.evaluate()
            if (step + 1) % c.log_interval == 0 or self._pending:
                self.log(step + 1, row)
            if bar is not None:
                bar.update(1)
                bar.set_postfix(loss=f"{row['loss/mean']:.3f}", tok_s=f"{row['perf/tokens_per_s']:.0f}")
            if c.save_interval and (step + 1) % c.save_interval == 0 and step + 1 < stop:
                self.save(step + 1)
        elapsed = time.perf_counter() - t_start  # training steps only (periodic evals/saves included)
        if bar is not None:
            bar.close()
        if not history:  # resumed at the end already: evaluate what was restored
            last_eval = self.evaluate()
            self.log(self.state.step, {})
        ckpt = self.save(self.state.step)
        if self.rank == 0:
            export_final(ckpt, self.out / "final")
        dropped = {k.split("/", 2)[2]: v for k, v in (history[-1] if history else {}).items()
                   if k.startswith("data/dropped_too_long/")}
        if self.rank == 0 and dropped:
            print(f"[data] SFT documents skipped as longer than data.seq_len={self.cfg.data.seq_len}: {dropped}")
        own = {k.split("/", 2)[2]: v for k, v in (history[-1] if history else {}).items()
               if k.startswith("data/no_loop_targets/")}
        if self.rank == 0 and own:
            print(f"[data] documents without loop_aux.targets={self.cfg.loop_aux.targets} targets (their own "
                  f"targets on every loop): {own}")
        return {"step": self.state.step, "checkpoint": str(ckpt), "eval": last_eval,
                "losses": [h["loss/mean"] for h in history], "tokens_per_s": tokens / max(elapsed, 1e-9),
                "dropped_too_long": dropped, "no_loop_targets": own, "preflight": [vars(r) for r in self.preflight]}

    def close(self) -> None:
        """End the run's resources: the TensorBoard writer, the engine, the process groups."""
        from elr_rl.train.engine import release_process_groups

        if self.writer is not None:
            self.writer.close()
            self.writer = None
        self.engine.close()
        release_process_groups()
