"""The learner: DeepSpeed data-parallel ranks as Ray actors (one actor per rank).

Each rank wraps the training stages' `TrainEngine`; one GRPO step is one
optimizer step over microbatches, one per loop count, so every sample is
trained at the k that produced it and all depths are averaged in the same step.
"""

from __future__ import annotations

import contextlib
import os
import time
from typing import Any

import numpy as np
import torch

from elr_rl.rl import grpo
from elr_rl.rl.config import RLConfig
from elr_rl.rl.messages import StepResult


_MODEL_INPUTS = ("positions", "segment_ids", "parent_ids", "logit_rows")


def model_inputs(batch: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The layout a microbatch gives the model besides its ids (a packed row's positions and segments)."""
    return {name: batch[name] for name in _MODEL_INPUTS if batch.get(name) is not None}


def targets(batch: dict[str, Any]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(loss mask, predictor index) of a microbatch: a packed row says which logits predict each token
    (`logit_index` into the rows the model computed logits for, `logit_rows`, where it has them; else
    `pred_index` into the whole row); in a row of its own, a token is predicted by the one before it
    and the first token is never trained."""
    mask = batch["loss_mask"]
    if batch.get("logit_rows") is not None:
        return mask, batch["logit_index"]
    if batch.get("pred_index") is None:
        mask = torch.cat([torch.zeros_like(mask[:, :1]), mask[:, 1:]], dim=1)
    return mask, batch.get("pred_index")


def place_like(ref: torch.nn.Module, policy: torch.nn.Module, device: torch.device | str) -> None:
    """Move the frozen reference model to `device`, each parameter in the dtype of the policy's namesake
    (the engine's: bf16 under bf16 precision); buffers (rotary tables) keep their dtype."""
    dtypes = {n: p.dtype for n, p in policy.named_parameters()}
    ref.to(device)
    for name, param in ref.named_parameters():
        param.data = param.data.to(dtypes.get(name, param.dtype))


def make_loss_fn(cfg: RLConfig, ref_model: torch.nn.Module | None, sink: list[dict[str, float]]):
    """The GRPO objective as a TrainEngine loss function: (logits, microbatch) -> loss."""
    a = cfg.algo

    def engine_divisor(batch: dict[str, Any]) -> float:
        """The step's microbatches x ranks: what the engine divides each microbatch's gradient by."""
        return float(batch["accum_steps"]) * cfg.learner.world_size

    def loss_fn(logits: torch.Tensor | list[torch.Tensor], batch: dict[str, Any]) -> torch.Tensor:
        readouts = logits if isinstance(logits, list) else [logits]  # loop_credit: one per loop, the last at k
        logits = readouts[-1]
        ids = batch["input_ids"]
        mask, pred = targets(batch)
        logp = grpo.token_logprobs(logits, ids, pred)
        old = batch["old_logp"] if "old_logp" in batch else logp.detach()
        ref = None
        if ref_model is not None and a.kl_coef > 0:
            with torch.no_grad():
                ref = grpo.token_logprobs(ref_model(ids, k=batch["k"], **model_inputs(batch)), ids, pred)
        with torch.set_grad_enabled(bool(a.entropy_coef) and torch.is_grad_enabled()):  # else logged only
            entropy = grpo.at_predictors(grpo.entropy_from_logits(logits), pred)
        loss, stats = grpo.grpo_loss(
            logp, old, batch["rollout_logp"], batch["advantages"], mask,
            clip_low=a.clip_low, clip_high=a.clip_high, aggregation=a.aggregation, tis_cap=a.tis_cap,
            ref_logp=ref, kl_coef=a.kl_coef, entropy=entropy, entropy_coef=a.entropy_coef,
            global_denominator=float(batch["global_denominator"]),
            engine_divisor=engine_divisor(batch), sequence_ids=batch.get("sequence_ids"),
        )
        if len(readouts) > 1 and a.loop_credit > 0:
            loss = loss + a.loop_credit * loop_credit_term(readouts[:-1], ids, pred, old, batch, mask, stats)
        stats["k"] = float(batch["k"])
        stats["tokens"] = float(mask.sum())
        sink.append(stats)
        return loss

    def loop_credit_term(shallow: list[torch.Tensor], ids: torch.Tensor, pred: torch.Tensor | None,
                         old: torch.Tensor, batch: dict[str, Any], mask: torch.Tensor,
                         stats: dict[str, float]) -> torch.Tensor:
        """Mean over loops i < k of -A log pi_i(x) (times the sampling loop's truncated importance weights),
        aggregated as the main term is."""
        weights = (grpo.truncated_is_weights(old, batch["rollout_logp"], cap=a.tis_cap)
                   if a.tis_cap is not None else 1.0)
        terms = []
        for z in shallow:
            per_token = -batch["advantages"] * grpo.token_logprobs(z, ids, pred) * weights
            terms.append(grpo.aggregate(per_token, mask, a.aggregation, float(batch["global_denominator"]),
                                        engine_divisor(batch), batch.get("sequence_ids")))
        term = torch.stack(terms).mean()
        stats["loop_credit_loss"] = float(term.detach())
        return term

    loss_fn.loop_readouts = a.loop_credit > 0  # TrainEngine passes every loop's readout
    return loss_fn


def lending_checkpoints() -> tuple[type, ...]:
    """The modules before whose forward, and before whose gradient flows back, a borrowing learner checks
    for lent cores (`CoreBorrower.install`): every sublayer and every projection, so that a lent core is
    taken, and a core its worker wants back is given back, within one matrix product rather than one
    sublayer (with sublayers alone, a timeline of the 12M k = 1 bench found the learner still on the
    worker's core for 5% of the time, after the worker had taken it back)."""
    from elr_rl.model.layers import NgptSublayer, PrenormSublayer

    return (PrenormSublayer, NgptSublayer, torch.nn.Linear)


class LearnerRank:
    """One DeepSpeed rank. Created by `LearnerGroup`; call `setup` on all ranks together."""

    def __init__(self, rank: int, world_size: int, cfg: RLConfig) -> None:
        from elr_rl.rl.cores import actor_core_budget

        self.rank, self.world_size, self.cfg = rank, world_size, cfg
        self.engine = None
        self._wire: np.ndarray | None = None  # the published weights' buffer, packed again each step
        self._ended: float | None = None  # when the last train_step returned (the next one's wait starts)
        self.cores = actor_core_budget()  # threads and cores from this rank's Ray CPUs, not the caller's env

    def node_id(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def sees(self, path: str) -> bool:
        """Whether `path` exists where this rank runs (the run folder must be shared storage)."""
        return os.path.exists(path)

    def rendezvous_address(self) -> tuple[str, int]:
        """This node's IP as Ray knows it (the hostname can resolve to a loopback address, 127.0.1.1 on
        Debian, which ranks on other nodes cannot reach) and a free port on it."""
        import ray

        from elr_rl.train.rank import free_port

        return ray.util.get_node_ip_address(), free_port()

    def setup(self, master_addr: str, master_port: int, resume_dir: str | None = None) -> dict | None:
        from elr_rl.model import LoopedForCausalLM
        from elr_rl.train.config import TrainConfig, TrainRunConfig
        from elr_rl.train.engine import TrainEngine

        os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = master_addr, str(master_port)
        c = self.cfg
        engine_cfg = c.learner.engine
        # the starting accumulation; each step sets it to that step's microbatch count (TrainEngine.train_step)
        engine_cfg.grad_accum_steps = len(c.curriculum.loop_counts)
        train_cfg = TrainConfig(engine=engine_cfg, optim=c.learner.optim, run=TrainRunConfig(seed=c.run.seed))
        model = LoopedForCausalLM.from_pretrained(c.model_path)
        self.depth = model.spec.effective_depth
        self.ref_model = None
        if c.algo.kl_coef > 0:
            self.ref_model = LoopedForCausalLM.from_pretrained(c.model_path).eval().requires_grad_(False)
        # Ray shows each rank only its own GPU(s) (CUDA_VISIBLE_DEVICES): its local rank is 0 on every node
        self.engine = TrainEngine(model.config, train_cfg, self.rank, self.world_size, model=model, local_rank=0)
        if self.ref_model is not None:  # on the policy's device, in its dtype: KL 0 before the first update
            place_like(self.ref_model, self.engine.model, self.engine.device)
        self.borrower = self._borrow_idle_cores(model)
        if resume_dir is not None:
            return self.engine.load(resume_dir)
        return None

    def _borrow_idle_cores(self, model: torch.nn.Module):
        """learner.borrow_idle_cores: check for lent rollout cores at each of `lending_checkpoints`."""
        from elr_rl.rl.cores import borrower_for

        borrower = borrower_for(self.cores)
        if borrower is not None:
            borrower.install(model, lending_checkpoints())
        return borrower

    def train_step(self, microbatches: list[dict], ks: list[int], lr: float,
                   parity: tuple[list[list[int]], int] | None = None) -> StepResult:
        """One optimizer step (updates_per_batch > 1: several, against fixed old logprobs). `parity`:
        (sequences, k) that rank 0 scores with the new weights (the sync spot-check's learner side: a
        step queued behind this one must not change the weights before they are scored)."""
        n_updates = self.cfg.algo.updates_per_batch
        wall0, cpu0 = time.perf_counter(), time.process_time()
        wait_s = wall0 - self._ended if self._ended is not None else None
        borrow = self.borrower.borrowing() if self.borrower is not None else contextlib.nullcontext()
        with borrow:  # learner.borrow_idle_cores: lent cores only while computing, back after it
            if n_updates > 1:
                with torch.no_grad():
                    self.engine.engine.eval()
                    for mb in microbatches:
                        batch = self.engine.to_device(mb)
                        mb["old_logp"] = grpo.token_logprobs(self.engine.forward(batch, mb["k"]), batch["input_ids"],
                                                             targets(batch)[1])
            stats: list[dict[str, float]] = []
            losses: list[float] = []
            grad_norm = float("nan")
            for update in range(n_updates):
                start = len(stats)
                out = self.engine.train_step(microbatches, ks, lr, loss_fn=make_loss_fn(self.cfg, self.ref_model, stats))
                losses, grad_norm = out["losses"], out["grad_norm"]
                for s in stats[start:]:
                    s["update"] = float(update)
        compute_s, cpu_s = time.perf_counter() - wall0, time.process_time() - cpu0
        borrowed_s = self.borrower.take_stats() if self.borrower is not None else 0.0
        # The new weights go into the object store at once (no extra call from the driver): rank 0
        # returns a ref to them, and the seconds spent, which count as weight-sync time.
        import ray

        from elr_rl.model.safetensors_io import BytesOutOfBand

        t0 = time.perf_counter()
        weights = self.weights()  # one copy into the store; workers get the safetensors file's bytes
        ref = [ray.put(BytesOutOfBand(weights))] if self.rank == 0 else []  # in a list: the caller gets the ref
        serialize_s = time.perf_counter() - t0
        scored = self.logprobs(*parity) if parity is not None and self.rank == 0 else None
        self._ended = time.perf_counter()
        return StepResult(losses, grad_norm, stats, serialize_s, ref, compute_s=compute_s, cpu_s=cpu_s,
                          parity_logprobs=scored, wait_s=wait_s, borrowed_core_s=borrowed_s, ended_unix=time.time())

    def weights(self) -> np.ndarray:
        """The full state dict as the bytes of a safetensors file (what rollout workers load), in a uint8
        array reused from step to step (valid until the next call; `ray.put` copies it): fp32, or bf16 when
        the workers run bf16 (they round to it on load anyway; half the bytes to pack, ship and stage).
        Rank 0 keeps that buffer between steps (the weights' size in host memory: the same peak as building
        a new one each step, which cost more than the copy in fresh pages), and packs it straight from the
        module's weights where they are whole (on a GPU: one device-to-host copy, into the buffer). Other
        ranks return an empty array, and copy nothing unless the weights must be gathered (ZeRO-3, or
        masters in another dtype), where every rank takes part."""
        from elr_rl.model.safetensors_io import pack_safetensors

        dtype = torch.bfloat16 if self.cfg.rollout.dtype == "bfloat16" else torch.float32
        if self.rank != 0 and not self.engine.serving_is_collective(dtype):
            return np.empty(0, dtype=np.uint8)
        state = self.engine.state_dict_in(dtype)
        if self.rank != 0:
            return np.empty(0, dtype=np.uint8)
        self._wire = pack_safetensors(state, out=self._wire)
        return self._wire

    def param_checksum(self) -> float:
        """Sum of squares of this rank's full weights (data-parallel ranks must agree; all ranks call)."""
        return float(sum(t.double().square().sum() for t in self.engine.full_state_dict().values()))

    def save(self, directory: str, client_state: dict) -> None:
        """Weights, optimizer state and the run's own tokenizer, chat template and stop ids (a resumed run,
        its rollout workers and `elr-rl eval` read them from this folder)."""
        from elr_rl.text import TextCodec

        self.engine.save(directory, client_state, tokenizer=TextCodec.load(self.cfg.model_path))

    @torch.no_grad()
    def logprobs(self, sequences: list[list[int]], k: int) -> list[list[float]]:
        """Teacher-forced logprob of every token after the first (parity spot-checks)."""
        model = self.engine.model
        model.eval()
        out = []
        for seq in sequences:
            ids = torch.tensor([seq], device=self.engine.device)
            out.append(model.token_logprobs(ids, k=k)[0].float().cpu().tolist())
        model.train()
        return out

    def shutdown(self) -> None:
        from elr_rl.train.engine import release_process_groups

        if self.engine is not None:
            self.engine.close()
        release_process_groups()


class LearnerGroup:
    """The learner's ranks as Ray actors, called like one local object."""

    def __init__(self, cfg: RLConfig, resume_dir: str | None = None) -> None:
        import ray

        from elr_rl.rl.cores import CORE_OFFSET_ENV, layout_offsets, lend_env
        from elr_rl.rl.ray_env import actor_runtime_env

        n = cfg.learner.world_size
        actor_cls = ray.remote(num_cpus=cfg.learner.num_cpus_per_rank, num_gpus=cfg.learner.num_gpus_per_rank)(
            LearnerRank
        )
        offsets = layout_offsets(n, cfg.learner.num_cpus_per_rank, cfg.rollout.num_workers,
                                 cfg.rollout.num_cpus_per_worker)["learner"]
        threads = str(max(1, int(cfg.learner.num_cpus_per_rank)))  # from the rank's resources, never the caller's
        self.ranks = [
            actor_cls.options(runtime_env=actor_runtime_env(
                {"DS_ACCELERATOR": "cuda" if cfg.learner.num_gpus_per_rank > 0 else "cpu",
                 "OMP_NUM_THREADS": threads, CORE_OFFSET_ENV: str(offsets[r]),
                 **lend_env(cfg.learner.borrow_idle_cores, cfg.run.output_dir)}),
                resources=dict(cfg.learner.resources) or None).remote(r, n, cfg)
            for r in range(n)
        ]
        addr, port = ray.get(self.ranks[0].rendezvous_address.remote())
        states = ray.get([r.setup.remote(addr, port, resume_dir) for r in self.ranks])
        self.client_state = states[0]
        self.cfg = cfg

    def train_step(self, per_rank_mbs: list[list[dict]], per_rank_ks: list[list[int]], lr: float,
                   parity: tuple[list[list[int]], int] | None = None):
        """Ref of the step's per-rank results (asynchronous: the caller waits when it needs them). Calls
        queue on the ranks in order, so the next step may be submitted while this one runs."""
        return [r.train_step.remote(mb, ks, lr, parity if i == 0 else None)
                for i, (r, mb, ks) in enumerate(zip(self.ranks, per_rank_mbs, per_rank_ks))]

    def save(self, directory: str, client_state: dict) -> None:
        import ray

        ray.get([r.save.remote(directory, client_state) for r in self.ranks])

    def node_ids(self) -> list[str]:
        import ray

        return ray.get([r.node_id.remote() for r in self.ranks])

    def sees(self, path: str) -> list[bool]:
        import ray

        return ray.get([r.sees.remote(path) for r in self.ranks])

    def shutdown(self) -> None:
        import ray

        try:
            ray.get([r.shutdown.remote() for r in self.ranks], timeout=30)
        except Exception:  # noqa: BLE001 - a dead rank has nothing left to shut down
            pass
        for r in self.ranks:
            ray.kill(r)
