"""The training engine shared by pretraining, SFT and the RL learner: one DeepSpeed data-parallel rank.

    engine = TrainEngine(model_cfg, train_cfg, rank, world_size)
    stats = engine.train_step(microbatches, ks, lr)      # one optimizer step (grad accumulation inside)
    engine.save(dir, client_state); engine.load(dir)     # HF-layout weights + DeepSpeed optimizer state

The same code runs on CPU (DS_ACCELERATOR=cpu, gloo) and CUDA (NCCL): the
accelerator is a config value. DeepSpeed is imported inside functions so that
`import elr_rl` stays light.

Weight surgery (nGPT re-normalisation after each step, zero-initialising the
loop-conditioning heads at the delayed-mixed-depth switch) must reach the fp32
master weights that ZeRO / bf16 keep inside the optimizer, or the next step
would overwrite it: `apply_to_weights_` runs the model's own in-place method
on the masters and copies the result back into the module; `apply_weight_rule_`
does it one parameter at a time (nGPT's re-normalisation, every step), so that no
more than one full fp32 master is gathered at once.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

from elr_rl.train.config import TrainConfig
from elr_rl.train.labels import IGNORE_INDEX

LossFn = Callable[[torch.Tensor, dict], torch.Tensor]


def resolve_accelerator(name: str) -> str:
    """`auto` -> cuda when a GPU is visible, else cpu."""
    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name == "cuda" and not torch.cuda.is_available():
        raise ValueError("config field `engine.accelerator`: cuda requested but no GPU is visible; use cpu or auto")
    return name


def init_distributed(rank: int, world_size: int, accelerator: str, master_addr: str = "127.0.0.1",
                     master_port: int = 29500, local_rank: int | None = None) -> None:
    """Join the torch.distributed group (gloo on CPU, NCCL on CUDA) through DeepSpeed."""
    os.environ["DS_ACCELERATOR"] = accelerator  # read by deepspeed at import: must precede it
    os.environ.update(
        RANK=str(rank), WORLD_SIZE=str(world_size), LOCAL_RANK=str(rank if local_rank is None else local_rank),
        MASTER_ADDR=os.environ.get("MASTER_ADDR", master_addr), MASTER_PORT=os.environ.get("MASTER_PORT", str(master_port)),
    )
    import deepspeed
    import torch.distributed as dist

    if dist.is_initialized():
        return
    if accelerator == "cpu":
        skip_shm_inference_op()
    backend = "gloo" if accelerator == "cpu" else "nccl"
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, rank=rank, world_size=world_size,
                               verbose=False)


def skip_shm_inference_op() -> None:
    """Keep DeepSpeed's CPU backend from JIT-compiling its shared-memory all-reduce kernel at init.

    Only DeepSpeed's tensor-parallel inference calls that kernel (`inference_all_reduce`); a training
    all-reduce goes through torch.distributed (gloo). Compiling it takes 1.5-2 minutes of two cores
    inside the first learner rank's setup, on every node, and again whenever the interpreter's path
    changes (torch keys its extension cache on the build command, which names the venv).
    """
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # probed once per process, then cached


def deepspeed_config(cfg: TrainConfig, world_size: int) -> dict[str, Any]:
    """The DeepSpeed JSON config a TrainConfig describes (the lr is set by us every step)."""
    e, o = cfg.engine, cfg.optim
    # torch's AdamW on both devices: DeepSpeed's FusedAdam would need a JIT-compiled CUDA op.
    adam: dict[str, Any] = {"lr": o.lr, "betas": [o.beta1, o.beta2], "eps": o.eps, "weight_decay": o.weight_decay,
                            "torch_adam": True, "fused": o.fused}
    return {
        "train_micro_batch_size_per_gpu": e.micro_batch_size,
        "gradient_accumulation_steps": e.grad_accum_steps,
        "train_batch_size": e.micro_batch_size * e.grad_accum_steps * world_size,
        "gradient_clipping": o.grad_clip,
        "zero_optimization": {"stage": e.zero_stage},
        "bf16": {"enabled": e.precision == "bf16"},
        "optimizer": {"type": "AdamW", "params": adam},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,
    }


def cross_entropy_loss(logits: torch.Tensor, batch: dict) -> torch.Tensor:
    """Mean next-token cross entropy over positions whose label is not IGNORE_INDEX.

    With the batch's `logit_rows` (`with_label_rows`), `logits` are those positions' only ([1, N, V])."""
    labels = batch["labels"]
    if batch.get("logit_rows") is not None:
        labels = labels.reshape(-1).index_select(0, batch["logit_rows"].reshape(-1)).unsqueeze(0)
    if not bool((labels != IGNORE_INDEX).any()):
        return logits.sum() * 0.0  # no target in this microbatch: zero loss, graph kept for DeepSpeed
    return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=IGNORE_INDEX)


def with_label_rows(batch: dict) -> dict:
    """The batch with `logit_rows`: the flattened positions that have a label, where some have none.

    The model then runs its head (and the output block's sublayers after its last attention) on those
    rows only, and `cross_entropy_loss` takes the same mean: an SFT row's prompt, whose labels are all
    IGNORE_INDEX, costs no head work and no [T, V] logits (at a 151k vocabulary the head is the largest
    matrix product of a step, and its logits the largest activation). A batch with a label everywhere,
    or none anywhere, is returned as it was."""
    labels = batch.get("labels")
    if labels is None or batch.get("logit_rows") is not None:
        return batch
    rows = (labels.reshape(-1) != IGNORE_INDEX).nonzero().squeeze(1)
    if rows.numel() == 0 or rows.numel() == labels.numel():
        return batch
    return {**batch, "logit_rows": rows}


def _grad_norm(params) -> float:
    """Global L2 norm of the (already all-reduced) gradients: sqrt(sum ||g||^2)."""
    sq = [p.grad.detach().float().pow(2).sum() for p in params if p.grad is not None]
    return float(torch.stack(sq).sum().sqrt()) if sq else 0.0


def release_process_groups() -> None:
    """Destroy every process group and drop DeepSpeed's own handle on the world group, so that gloo's
    threads are joined here, while the interpreter is alive, and not in its teardown at exit."""
    import gc

    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
    try:
        import deepspeed.utils.groups as ds_groups

        ds_groups._WORLD_GROUP = None
    except ImportError:
        pass
    gc.collect()


class TrainEngine:
    """One data-parallel rank of a DeepSpeed engine around a LoopedForCausalLM."""

    def __init__(self, model_cfg: Any, train_cfg: TrainConfig, rank: int, world_size: int,
                 model: torch.nn.Module | None = None, local_rank: int | None = None) -> None:
        from elr_rl.model import LoopedForCausalLM

        self.cfg, self.model_cfg = train_cfg, model_cfg
        self.rank, self.world_size = rank, world_size
        self.accelerator = resolve_accelerator(train_cfg.engine.accelerator)
        if train_cfg.engine.torch_threads > 0:
            torch.set_num_threads(train_cfg.engine.torch_threads)
        init_distributed(rank, world_size, self.accelerator, local_rank=local_rank)
        import deepspeed

        if self.accelerator == "cuda":
            torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.manual_seed(train_cfg.run.seed)  # identical initial weights on every rank
        if model is None:
            model = LoopedForCausalLM(model_cfg)
        model.backbone.checkpoint_sublayers = train_cfg.engine.activation_checkpointing
        self._frozen: tuple[str, ...] = ()
        self._hooks = [p.register_hook(self._grad_gate(name)) for name, p in model.named_parameters()]
        ds_cfg = deepspeed_config(train_cfg, world_size)
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=ds_cfg
        )
        self.model = self.engine.module
        self.device = self.engine.device
        self.zero_stage = train_cfg.engine.zero_stage
        self.dtype = torch.bfloat16 if train_cfg.engine.precision == "bf16" else torch.float32
        # ZeRO-0 in fp32 hands the torch optimizer over as is; DeepSpeed then reports no grad norm.
        self._plain_optimizer = self.zero_stage == 0 and self.dtype == torch.float32
        # One data-parallel rank: nothing to average. DeepSpeed's ZeRO-0 all-reduce would still flatten
        # every gradient into one buffer, "reduce" it over the one rank and copy it back (7% of a 47M bf16
        # learner step on one CPU core). ZeRO-1/2/3 move gradients into their partitions in that call, so
        # they keep it.
        if self.zero_stage == 0 and self.engine.dp_world_size == 1:
            self.engine.enable_backward_allreduce = False

    def close(self) -> None:
        """Release the engine: its hooks, DeepSpeed's, and its references to the process groups.

        Tensor hooks live in C++, out of the garbage collector's sight: left in place, they keep the
        DeepSpeed engine and its gloo process groups alive to interpreter exit, whose teardown of gloo's
        threads then aborts the process now and then ("terminate called without an active exception").
        Call once, after the last step, then `release_process_groups` (`Trainer.close` does both). ZeRO 0-2
        end with no gloo thread left; ZeRO-3 still holds its engine (`train.launch.leave_spawned_rank`)."""
        for h in self._hooks:
            h.remove()
        self._hooks = []
        if getattr(self, "engine", None) is not None:
            self.engine.destroy()
            self.engine = self.optimizer = self.model = None

    # ------------------------------------------------------------------ freezing
    def _grad_gate(self, name: str) -> Callable[[torch.Tensor], torch.Tensor]:
        # Zeroes the gradient only: AdamW still moves a frozen parameter by its decoupled weight decay
        # and by moments it gathered before the freeze (use weight_decay 0 and freeze from the start).
        def hook(grad: torch.Tensor) -> torch.Tensor:
            return torch.zeros_like(grad) if name.startswith(self._frozen) else grad  # () matches nothing
        return hook

    def freeze(self, prefixes: tuple[str, ...]) -> None:
        """Zero the gradients of parameters whose names start with one of `prefixes` (() unfreezes)."""
        self._frozen = tuple(prefixes)

    # ------------------------------------------------------------------ steps
    def to_device(self, batch: dict) -> dict:
        return {k: v.to(self.device) if isinstance(v, torch.Tensor) else v for k, v in batch.items()}

    def forward(self, batch: dict, k: int, loop_readouts: bool = False) -> torch.Tensor | list[torch.Tensor]:
        """Logits [B, T, V] (float32) of a packed batch at loop count k (`loop_readouts`: one per loop);
        [1, N, V] where the batch names the N positions it needs (`logit_rows`)."""
        extra = {"loop_readouts": True} if loop_readouts else {}  # the plain call stays as it was
        if batch.get("parent_ids") is not None:  # packed RL groups: a prompt shared by its completions
            extra["parent_ids"] = batch["parent_ids"]
        if batch.get("logit_rows") is not None:  # logits only where a trained token is predicted
            extra["logit_rows"] = batch["logit_rows"]
        return self.engine(batch["input_ids"], k=k, positions=batch.get("positions"),
                           segment_ids=batch.get("segment_ids"), **extra)

    def loop_aux_loss(self, batch: dict, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(loss with the loop-wise auxiliary term, plain loss at k) from one k-loop pass with per-loop
        readouts (`TrainConfig.loop_aux`; elr_rl.train.loopwise)."""
        from elr_rl.train.loopwise import loop_aux_loss

        readouts = self.engine(batch["input_ids"], k=k, positions=batch.get("positions"),
                               segment_ids=batch.get("segment_ids"), loop_readouts=True)
        return loop_aux_loss(readouts, batch, self.cfg.loop_aux.weight, dense=self.cfg.loop_aux.dense)

    def _set_accumulation(self, steps: int) -> None:
        """DeepSpeed's gradient accumulation over `steps` backward passes: each pass's loss is divided by
        it. (Where the optimizer steps is set per pass, `train_step`: DeepSpeed's own boundary counts
        passes since the start modulo the accumulation, which goes wrong once the count changes.)"""
        if steps == self.engine.gradient_accumulation_steps():
            return
        self.engine.set_train_batch_size(steps * self.engine.train_micro_batch_size_per_gpu() * self.engine.dp_world_size)
        if hasattr(self.optimizer, "gradient_accumulation_steps"):  # ZeRO-1/2/3 keep their own copy
            self.optimizer.gradient_accumulation_steps = steps

    def set_lr(self, lr: float) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = lr

    def train_step(self, microbatches: list[dict], ks: list[int], lr: float,
                   loss_fn: LossFn = cross_entropy_loss) -> dict[str, Any]:
        """One optimizer step over this rank's microbatches, microbatch i at loop count ks[i].

        Any number of microbatches: DeepSpeed accumulates over this many (every rank must pass as
        many). Returns the per-microbatch losses, the global gradient norm (before clipping) and the lr.
        """
        if not microbatches or len(ks) != len(microbatches):
            raise ValueError(f"train_step needs one or more microbatches and as many loop counts, "
                             f"got {len(microbatches)} and {len(ks)}")
        self._set_accumulation(len(microbatches))
        self.set_lr(lr)
        self.engine.train()
        losses = []
        norm = None
        for i, (batch, k) in enumerate(zip(microbatches, ks)):
            self.engine.set_gradient_accumulation_boundary(i == len(ks) - 1)  # all-reduce and step after the last
            batch = self.to_device(batch)
            if loss_fn is cross_entropy_loss and self.cfg.loop_aux.enabled:  # pretrain/SFT option, never RL
                loss, logged = self.loop_aux_loss(batch, k)
            else:
                if loss_fn is cross_entropy_loss:  # pretrain/SFT: logits only where a label is
                    batch = with_label_rows(batch)
                loss = logged = loss_fn(self.forward(batch, k, getattr(loss_fn, "loop_readouts", False)), batch)
            self.engine.backward(loss)  # gradients are all-reduced here at the accumulation boundary
            if i == len(ks) - 1 and self._plain_optimizer:
                norm = _grad_norm(self.model.parameters())
            self.engine.step()  # DeepSpeed steps the optimizer only at the accumulation boundary
            losses.append(float(logged.detach()))  # the loss at k (the auxiliary readouts' part is not logged)
        if self.model.backbone.variant.unit_norm_weights:  # nGPT: weights back on the unit sphere
            self.apply_weight_rule_(self.model.backbone.variant.weight_rule)
        if norm is None:
            norm = self.engine.get_global_grad_norm()
        return {"losses": losses, "grad_norm": float(norm) if norm is not None else float("nan"), "lr": lr}

    @torch.no_grad()
    def eval_loss(self, batch: dict, k: int, loss_fn: LossFn = cross_entropy_loss) -> float:
        """Loss of one batch at loop count k, without gradients (all ranks must call it under ZeRO-3)."""
        self.engine.eval()
        batch = self.to_device(batch)
        if loss_fn is cross_entropy_loss:
            batch = with_label_rows(batch)
        return float(loss_fn(self.forward(batch, k), batch))

    # ------------------------------------------------------------------ weight surgery
    def _gathered(self, params: list[torch.nn.Parameter], modifier_rank: int | None):
        if self.zero_stage != 3:
            return contextlib.nullcontext()
        import deepspeed

        return deepspeed.zero.GatheredParameters(params, modifier_rank=modifier_rank)

    def _unfused_masters(self) -> dict[int, torch.Tensor]:
        """id(module param) -> its fp32 master, for DeepSpeed's unfused 16-bit optimizer (ZeRO-0 + bf16),
        which keeps per-parameter masters without the `_hp_mapping` links ZeRO-1/2/3 set."""
        opt = self.optimizer
        out: dict[int, torch.Tensor] = {}
        for low, high in zip(getattr(opt, "fp16_groups", []), getattr(opt, "fp32_groups", [])):
            if isinstance(high, (list, tuple)):
                out.update({id(lp): hp for lp, hp in zip(low, high)})
        return out

    def _masters(self, params: list[torch.nn.Parameter],
                 unfused: dict[int, torch.Tensor] | None = None) -> list[torch.Tensor | None]:
        """Each parameter's full fp32 master (a collective under ZeRO); None when it is its own master.
        `unfused`: `_unfused_masters()`, when the caller already has it."""
        from deepspeed.utils import safe_get_full_fp32_param

        unfused = self._unfused_masters() if unfused is None else unfused
        masters = [unfused[id(p)] if id(p) in unfused else safe_get_full_fp32_param(p) for p in params]
        if self.dtype != torch.float32 and any(m is None for m in masters):
            raise RuntimeError("bf16 engine without fp32 master weights: unknown DeepSpeed optimizer layout")
        return masters

    @torch.no_grad()
    def apply_to_weights_(self, fn: Callable[[torch.nn.Module], None]) -> None:
        """Run an in-place weight function on the fp32 master weights and mirror it into the module.

        Every rank calls it (the master copies are partitioned); all ranks compute the same result.
        """
        from deepspeed.utils import safe_set_full_fp32_param

        params = list(self.model.parameters())
        with self._gathered(params, modifier_rank=0):
            masters = self._masters(params)
            if all(m is None for m in masters):
                fn(self.model)
                return
            unfused = self._unfused_masters()
            working = [p.data for p in params]
            for p, m in zip(params, masters):
                p.data = m.clone() if m is not None else p.data.float()
            try:
                fn(self.model)
                for p, m in zip(params, masters):
                    if id(p) in unfused:
                        unfused[id(p)].copy_(p.data)
                    elif m is not None:
                        safe_set_full_fp32_param(p, p.data)
                new = [p.data for p in params]
            finally:
                for p, w in zip(params, working):
                    p.data = w
            for w, n in zip(working, new):
                w.copy_(n.to(w.dtype))

    @torch.no_grad()
    def apply_weight_rule_(self, rule: Callable[[str, torch.Tensor], Callable[[torch.Tensor], torch.Tensor] | None]
                           ) -> None:
        """`apply_to_weights_` for a function of each parameter alone (`BackboneVariant.weight_rule`), one
        parameter at a time: its fp32 master is gathered, replaced by rule(master) and mirrored into the
        module before the next. Every rank calls it, in the same order (the gathers are collectives); at
        Dory1.0-4B's size holding all the masters at once took ~16 GB, and their copies as much again."""
        from deepspeed.utils import safe_set_full_fp32_param

        unfused = self._unfused_masters()
        for name, p in self.model.named_parameters():
            shape = getattr(p, "ds_shape", p.shape)  # ZeRO-3 keeps an empty placeholder outside a gather
            fn = rule(name, torch.empty(shape, device="meta"))
            if fn is None:
                continue
            with self._gathered([p], modifier_rank=0):
                (master,) = self._masters([p], unfused)
                if master is None:  # the module's weight is its own master
                    p.data.copy_(fn(p.data))
                    continue
                new = fn(master)
                if id(p) in unfused:
                    unfused[id(p)].copy_(new)
                else:
                    safe_set_full_fp32_param(p, new)
                p.data.copy_(new.to(p.dtype))

    def full_state_dict(self, keep: bool = True) -> dict[str, torch.Tensor]:
        """fp32 weights of the whole model on CPU (every rank calls: the gathers are collectives). One
        parameter is gathered at a time, and only where `keep` is its copy kept: a save keeps it on rank 0
        alone (at Dory1.0-4B's size each copy is 16 GB of host memory, eight ranks to a node)."""
        out: dict[str, torch.Tensor] = {}
        unfused = self._unfused_masters()
        for name, p in self.model.named_parameters():
            with self._gathered([p], modifier_rank=None):
                (master,) = self._masters([p], unfused)
                if keep:
                    out[name] = (master if master is not None else p.data).detach().float().to("cpu", copy=True)
        return out

    def serving_is_collective(self, dtype: torch.dtype) -> bool:
        """Whether `state_dict_in(dtype)` gathers across ranks (then every rank must call it)."""
        return self.zero_stage == 3 or self.dtype != dtype

    def state_dict_in(self, dtype: torch.dtype) -> dict[str, torch.Tensor]:
        """The whole model's weights in `dtype`, for serving.

        Where the module's own weights already are `dtype` and whole (ZeRO 0-2), they are the fp32
        masters rounded to it (DeepSpeed copies each updated master into its module weight), so they
        are returned as they are, on the module's device, without a copy, the fp32 masters or a
        collective (shared: do not modify them). Else the gathered masters cast to `dtype`, on CPU
        (every rank calls; every rank gets them): `serving_is_collective` says which."""
        if not self.serving_is_collective(dtype):
            return {n: p.detach() for n, p in self.model.named_parameters()}
        return {n: t.to(dtype) for n, t in self.full_state_dict().items()}

    # ------------------------------------------------------------------ checkpoints
    def save(self, directory: str | Path, client_state: dict, tokenizer: Any = None) -> None:
        """HF-layout weights (config.json, model.safetensors, tokenizer) + DeepSpeed optimizer state.

        Every rank calls it; rank 0 writes the HF files.
        """
        from elr_rl.model import LoopedForCausalLM

        directory = Path(directory)
        state = self.full_state_dict(keep=self.rank == 0)
        if self.rank == 0:
            with torch.device("meta"):
                export = LoopedForCausalLM(self.model_cfg)
            export.load_state_dict(state, assign=True, strict=True)
            export.save_pretrained(directory)
            if tokenizer is not None:
                tokenizer.save_pretrained(str(directory))
        # Under one key: DeepSpeed hands back its own leftovers next to the client state on load.
        self.engine.save_checkpoint(str(directory / "deepspeed"), tag="state", client_state={"elr_rl": client_state})

    def load(self, directory: str | Path) -> dict:
        """Restore weights, fp32 masters and optimizer state; returns the saved client_state."""
        path, client_state = self.engine.load_checkpoint(str(Path(directory) / "deepspeed"), tag="state")
        if path is None:
            raise ValueError(f"no DeepSpeed checkpoint under {str(directory)!r}/deepspeed")
        return client_state["elr_rl"]
