"""Typed configuration of the pretraining / SFT stages (and the RL learner's engine).

Schema defaults live here and only here; YAML files under `configs/` hold values.
`TrainConfig.validate()` runs at start-up (from `elr_rl.config.load_config`) so a
user mistake fails before any process group or model is built, with a message
that names the field and says what to change.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from elr_rl.metrics import MetricsConfig
from elr_rl.text import ChatOptions

STAGES = ("pretrain", "sft")
FAMILIES = ("elr", "dory")
PRECISIONS = ("fp32", "bf16")
ACCELERATORS = ("auto", "cpu", "cuda")
LAUNCHERS = ("local", "env", "ray")
LOOP_MODES = ("independent", "synchronized", "fixed")
SCHEDULES = ("constant", "cosine", "linear", "minus_sqrt")


def _fail(field_name: str, problem: str, fix: str) -> None:
    raise ValueError(f"config field `{field_name}`: {problem}; {fix}")


@dataclass
class ModelSpec:
    """Which looped model to train."""

    family: str = "elr"
    """`elr` (ElrConfig, ELR tensor names) or `dory` (DoryConfig, Dory1.0-4B format)."""
    preset: str = "tiny"
    """Name of a config constructor on the family's config class (e.g. `tiny`); ignored with init_from."""
    init_from: Optional[str] = None
    """Directory of a Hugging Face-layout checkpoint to start from (config.json + model.safetensors)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """Model config fields to override (e.g. {hidden_size: 128, truncated_backprop: 2})."""
    tokenizer: Optional[str] = None
    """Folder with tokenizer files (tokenizer.json, tokenizer_config.json with a chat template, optional
    generation_config.json) for a model trained from scratch; None: init_from's tokenizer, else the
    byte-level one. The model's vocab_size must cover it."""

    def validate(self) -> None:
        if self.family not in FAMILIES:
            _fail("model.family", f"got {self.family!r}", f"use one of {FAMILIES}")
        if self.init_from is not None and not Path(self.init_from).is_dir():
            _fail("model.init_from", f"directory {self.init_from!r} does not exist", "pass a checkpoint directory")
        if self.tokenizer is not None and not Path(self.tokenizer).is_dir():
            _fail("model.tokenizer", f"directory {self.tokenizer!r} does not exist", "pass a tokenizer folder")


@dataclass
class OptimConfig:
    """AdamW hyper-parameters and gradient clipping."""

    lr: float = 3e-3
    """Peak learning rate (reached at the end of warm-up)."""
    beta1: float = 0.9
    """Adam first-moment decay."""
    beta2: float = 0.95
    """Adam second-moment decay."""
    eps: float = 1e-8
    """Adam epsilon."""
    weight_decay: float = 0.0
    """Decoupled weight decay (nGPT models normally use 0: their weights are re-normalised)."""
    grad_clip: float = 1.0
    """Clip the global gradient norm to this value; 0 disables clipping."""
    fused: bool = True
    """torch's fused AdamW kernel: one pass over each tensor's weights, gradients and moments (CPU and CUDA;
    on one CPU core 34 ms against about 190 ms for its per-tensor loop over 47M fp32 masters). False: the
    per-tensor loop (what torch picks for CPU tensors when not told)."""

    def validate(self) -> None:
        if not self.lr > 0:
            _fail("optim.lr", f"got {self.lr}", "use a positive learning rate")
        for name, b in (("optim.beta1", self.beta1), ("optim.beta2", self.beta2)):
            if not 0.0 <= b < 1.0:
                _fail(name, f"got {b}", "use a value in [0, 1)")
        if self.grad_clip < 0:
            _fail("optim.grad_clip", f"got {self.grad_clip}", "use 0 (off) or a positive norm")


@dataclass
class ScheduleConfig:
    """Learning-rate schedule: linear warm-up, then one of the decay shapes."""

    name: str = "cosine"
    """constant | cosine | linear | minus_sqrt (warm-up, stable, then the 1 - sqrt cooldown Dory used)."""
    warmup_steps: int = 10
    """Optimizer steps of linear warm-up from 0 to the peak lr."""
    decay_fraction: float = 0.2
    """minus_sqrt only: fraction of all steps spent in the final 1 - sqrt cooldown."""
    min_lr_ratio: float = 0.1
    """Final lr as a fraction of the peak (cosine, linear, minus_sqrt)."""

    def validate(self) -> None:
        if self.name not in SCHEDULES:
            _fail("schedule.name", f"got {self.name!r}", f"use one of {SCHEDULES}")
        if self.warmup_steps < 0:
            _fail("schedule.warmup_steps", f"got {self.warmup_steps}", "use 0 or more")
        if not 0.0 < self.decay_fraction <= 1.0:
            _fail("schedule.decay_fraction", f"got {self.decay_fraction}", "use a value in (0, 1]")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            _fail("schedule.min_lr_ratio", f"got {self.min_lr_ratio}", "use a value in [0, 1]")


@dataclass
class EngineConfig:
    """DeepSpeed engine set-up: ZeRO stage, precision, batch shape, device."""

    zero_stage: int = 0
    """ZeRO stage 0 (plain data parallel), 1 (optimizer states), 2 (+gradients) or 3 (+parameters)."""
    precision: str = "fp32"
    """fp32, or bf16 (bf16 weights/activations, fp32 master weights in the optimizer)."""
    micro_batch_size: int = 4
    """Packed sequences per microbatch per rank."""
    grad_accum_steps: int = 2
    """Microbatches accumulated per optimizer step on each rank."""
    accelerator: str = "auto"
    """cpu (gloo), cuda (NCCL), or auto: cuda when a GPU is visible, else cpu."""
    torch_threads: int = 0
    """torch intra-op threads per rank; 0 keeps torch's default (OMP_NUM_THREADS)."""
    activation_checkpointing: bool = False
    """Keep only each sublayer's input for the backward pass and recompute the rest there (about a third
    more compute). Needed at real sizes: Dory1.0-4B's 8,192-token row at k = 4 runs 192 sublayers, whose
    intermediates would take hundreds of GB; checkpointed, one [T, d] state each."""

    def validate(self) -> None:
        if self.zero_stage not in (0, 1, 2, 3):
            _fail("engine.zero_stage", f"got {self.zero_stage}", "use a ZeRO stage in 0, 1, 2, 3")
        if self.precision not in PRECISIONS:
            _fail("engine.precision", f"got {self.precision!r}", f"use one of {PRECISIONS}")
        if self.accelerator not in ACCELERATORS:
            _fail("engine.accelerator", f"got {self.accelerator!r}", f"use one of {ACCELERATORS}")
        if self.micro_batch_size < 1:
            _fail("engine.micro_batch_size", f"got {self.micro_batch_size}", "use 1 or more")
        if self.grad_accum_steps < 1:
            _fail("engine.grad_accum_steps", f"got {self.grad_accum_steps}", "use 1 or more")


@dataclass
class DistConfig:
    """How the data-parallel ranks are started."""

    world_size: int = 1
    """Number of data-parallel ranks."""
    launcher: str = "local"
    """local: spawn ranks on this machine; env: already launched (torchrun sets RANK/WORLD_SIZE);
    ray: one Ray actor per rank, with a torch.distributed rendezvous on rank 0's node."""
    master_port: int = 0
    """Rendezvous port for local/ray launch; 0 picks a free port."""
    ray_address: Optional[str] = None
    """Ray cluster address for launcher=ray ("auto": the running local cluster; None: start a new local Ray)."""
    ray_num_cpus_per_rank: float = 1.0
    """CPUs reserved by each rank actor."""
    ray_num_gpus_per_rank: float = 0.0
    """GPUs reserved by each rank actor (1 for CUDA training on a cluster)."""

    def validate(self) -> None:
        if self.world_size < 1:
            _fail("dist.world_size", f"got {self.world_size}", "use 1 or more ranks")
        if self.launcher not in LAUNCHERS:
            _fail("dist.launcher", f"got {self.launcher!r}", f"use one of {LAUNCHERS}")


@dataclass
class LoopConfig:
    """Mixed-depth loop sampling: k ~ Uniform{1..K} with a rotating fraction f of ranks forced to k = 1."""

    max_loops: Optional[int] = None
    """K: loop counts are drawn from 1..K. None uses the model's max_loops; a preset model is built with it."""
    mode: str = "independent"
    """independent: each rank draws its own k per microbatch; synchronized: all ranks share k per
    microbatch; fixed: always `fixed_k` (no mixed depth)."""
    force_one_fraction: float = 0.25
    """f: fraction of data-parallel ranks forced to k = 1 for a whole optimizer step, rotating over ranks.
    p1 = 1/K + (1 - 1/K) f; k_bar = f + (1 - f)(K + 1)/2."""
    delay_fraction: float = 0.0
    """rho: train at k = 1 for this fraction of all tokens, then switch to mixed depth and zero-init the
    loop-conditioning heads (delayed mixed depth). 0 starts mixed depth at once."""
    fixed_k: int = 1
    """Loop count for mode=fixed."""
    truncated_backprop: Optional[int] = None
    """Only the last n loops carry gradients (sets the model's truncated_backprop); None backpropagates
    through every loop."""
    difficulty_aware: bool = False
    """Difficulty-aware loop sampling, for small models where depth must be taught: a microbatch runs at
    least as many loops as the serial steps its hardest document needs (capped at K; documents from
    ladder environments carry that count), so no instance is trained at a depth that cannot solve it.
    Off: k is drawn as `mode` says, whatever the documents."""

    def validate(self) -> None:
        if self.max_loops is not None and self.max_loops < 1:
            _fail("loops.max_loops", f"K = {self.max_loops}", "use K >= 1 (or null for the model's max_loops)")
        if self.mode not in LOOP_MODES:
            _fail("loops.mode", f"got {self.mode!r}", f"use one of {LOOP_MODES}")
        if not 0.0 <= self.force_one_fraction <= 1.0:
            _fail("loops.force_one_fraction", f"f = {self.force_one_fraction}", "use a fraction in [0, 1]")
        if not 0.0 <= self.delay_fraction <= 1.0:
            _fail("loops.delay_fraction", f"rho = {self.delay_fraction}", "use a fraction in [0, 1]")
        if self.fixed_k < 1:
            _fail("loops.fixed_k", f"got {self.fixed_k}", "use 1 or more")
        if self.truncated_backprop is not None and self.truncated_backprop < 1:
            _fail("loops.truncated_backprop", f"got {self.truncated_backprop}", "use n >= 1 loops, or null for all")


LOOP_AUX_TARGETS = ("final", "steps", "dense", "chain")


@dataclass
class LoopAuxConfig:
    """Loop-wise auxiliary loss (off by default), for small models where depth must be taught: one forward
    at the microbatch's k reads out logits after every loop (the output block and head applied to each
    loop's state) and adds `weight` x the mean cross entropy of the readouts of loops 1..k-1 to the loss
    of the last one. Without loop conditioning the readout after loop i is exactly the model run at k = i,
    so the loss trains every shallower depth from one pass."""

    weight: float = 0.0
    """Weight of the readouts' mean loss; 0 turns the option off (the plain loss at k)."""
    targets: str = "final"
    """final: every readout predicts the document's own targets. steps: loop i predicts the answer after
    min(i, D) serial steps of a document that carries per-step targets (a ladder environment's task with
    D steps), so each loop learns one more step; other documents keep their own targets. dense (SFT): every
    loop is asked only what it can know: at the prompt tokens where a ladder task lays out its chain (the
    s-th move, the s-th operator, a binding line) loop i targets the value there once i is at least
    its depth, and the answer once i >= D (shallower loops get no target there); the last loop's readout is
    in the mean too. One target per step instead of one per document: at tiny scale it learns the ladder's
    automaton in 1,200 steps, where steps does not (README, elastic depth). chain (SFT): dense, plus at every
    loop below a target's depth the partial value that loop can hold there (the automaton's last moves
    composed into one map, nested's last operations composed into one affine map mod 3, the variable a
    binding line reaches after that many look-ups), so every link of the chain has a target at every loop;
    environments without partial targets get dense ones."""

    def validate(self) -> None:
        if self.weight < 0:
            _fail("loop_aux.weight", f"got {self.weight}", "use 0 (off) or a positive weight")
        if self.targets not in LOOP_AUX_TARGETS:
            _fail("loop_aux.targets", f"got {self.targets!r}", f"use one of {LOOP_AUX_TARGETS}")

    @property
    def enabled(self) -> bool:
        return self.weight > 0

    @property
    def dense(self) -> bool:
        """Targets sit on prompt tokens (dense, chain): SFT only; the last loop's readout is in the mean."""
        return self.targets in ("dense", "chain")


@dataclass
class DataConfig:
    """Training data: procedural generators, registered environments and local files."""

    seq_len: int = 128
    """Tokens per packed sequence."""
    generators: list[str] = field(default_factory=lambda: ["addition", "sorting", "pointer_chase", "counting"])
    """Procedural sources: built-in generator names (see elr_rl.train.corpus) or `env:<name>` for a
    registered environment's worked solutions."""
    files: list[str] = field(default_factory=list)
    """Local .txt / .jsonl / .json / .parquet files read through `datasets` (never the hub)."""
    file_weight: float = 0.5
    """Probability that a document comes from `files` when both files and generators are given."""
    text_field: str = "text"
    """Column of a pretraining file holding the document text."""
    prompt_field: str = "prompt"
    """Column of an SFT file holding the prompt."""
    response_field: str = "response"
    """Column of an SFT file holding the response (the only tokens with a loss)."""
    min_difficulty: int = 1
    """Lowest difficulty drawn from generators/environments."""
    max_difficulty: int = 3
    """Highest difficulty drawn from generators/environments."""
    env_wrong_answer_fraction: float = 0.0
    """f in [0, 0.5]: fraction of `env:` documents answered with one of the environment's wrong answers.
    Each task then comes twice in a row: its worked solution, then (with probability 2f) a wrong
    answer. 0.5 shows every task right and wrong side by side, teaching the answer format but leaving
    each prompt at a coin flip: an SFT start from which RL, not imitation, finds the right answers."""
    seed: int = 0
    """Seed of the document stream (held-out data uses a disjoint stream)."""
    chat: ChatOptions = field(default_factory=ChatOptions)
    """How prompt/response documents are rendered with the chat template (system prompt, thinking switch)."""

    def validate(self) -> None:
        if self.seq_len < 8:
            _fail("data.seq_len", f"got {self.seq_len}", "use at least 8 tokens")
        if not self.generators and not self.files:
            _fail("data.generators", "no data source given", "name generators or add data.files")
        for i, path in enumerate(self.files):
            if not Path(path).exists():
                _fail(f"data.files[{i}]", f"{path!r} does not exist", "fix the path (local files only)")
        if not 0.0 <= self.file_weight <= 1.0:
            _fail("data.file_weight", f"got {self.file_weight}", "use a probability in [0, 1]")
        if not 1 <= self.min_difficulty <= self.max_difficulty:
            _fail("data.min_difficulty", f"{self.min_difficulty}..{self.max_difficulty}", "use 1 <= min <= max")
        if not 0.0 <= self.env_wrong_answer_fraction <= 0.5:
            _fail("data.env_wrong_answer_fraction", f"got {self.env_wrong_answer_fraction}",
                  "use a fraction in [0, 0.5] (every task is shown right, then wrong with probability 2f)")


@dataclass
class TrainRunConfig:
    """Run length, logging, evaluation and checkpoints of a pretraining or SFT run (an RL run's are
    RLRunConfig: there evaluation is validation pass@1, not held-out loss, and save_interval must be >= 1)."""

    output_dir: str = "runs/pretrain-tiny"
    """Run directory: resolved config, metrics.jsonl, checkpoints."""
    total_steps: int = 100
    """Optimizer steps to train."""
    log_interval: int = 1
    """Write a metrics line every this many steps."""
    eval_interval: int = 50
    """Held-out loss at every k every this many steps (0: only at the end)."""
    eval_batches: int = 2
    """Held-out microbatches per evaluation."""
    save_interval: int = 0
    """Checkpoint every this many steps (0: only at the end)."""
    resume: bool = True
    """Continue from the newest checkpoint in output_dir if there is one."""
    stop_after_steps: int = 0
    """Stop (after saving) once this step is reached, as if interrupted; 0 runs to total_steps."""
    seed: int = 0
    """Seed of model initialisation and loop sampling."""
    progress: bool = True
    """Show a tqdm progress bar on rank 0."""

    def validate(self) -> None:
        if self.total_steps < 1:
            _fail("run.total_steps", f"got {self.total_steps}", "use 1 or more")
        for name in ("log_interval",):
            if getattr(self, name) < 1:
                _fail(f"run.{name}", f"got {getattr(self, name)}", "use 1 or more")
        for name in ("eval_interval", "save_interval", "stop_after_steps", "eval_batches"):
            if getattr(self, name) < 0:
                _fail(f"run.{name}", f"got {getattr(self, name)}", "use 0 or more")


def check_rank_uniform_depth(cfg: "TrainConfig", world_size: int) -> None:
    """ZeRO-3 gathers parameters with collectives inside every sublayer's forward, so all ranks must
    run the same number of loops: rank-dependent depth (independent draws, forced ranks) would hang."""
    if cfg.engine.zero_stage != 3 or world_size <= 1 or cfg.loops.mode == "fixed":
        return
    if cfg.loops.mode == "independent":
        _fail("loops.mode", "independent per-rank loop counts under ZeRO-3 would deadlock its parameter gathers",
              "use loops.mode=synchronized (with loops.force_one_fraction=0) or engine.zero_stage <= 2")
    if cfg.loops.force_one_fraction > 0:
        _fail("loops.force_one_fraction", "forcing some ranks to k = 1 under ZeRO-3 would deadlock its gathers",
              "set it to 0 or use engine.zero_stage <= 2")


@dataclass
class TrainConfig:
    """One pretraining or SFT run."""

    stage: str = "pretrain"
    """pretrain (loss on every token) or sft (loss on response tokens only)."""
    model: ModelSpec = field(default_factory=ModelSpec)
    optim: OptimConfig = field(default_factory=OptimConfig)
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    dist: DistConfig = field(default_factory=DistConfig)
    loops: LoopConfig = field(default_factory=LoopConfig)
    loop_aux: LoopAuxConfig = field(default_factory=LoopAuxConfig)
    data: DataConfig = field(default_factory=DataConfig)
    run: TrainRunConfig = field(default_factory=TrainRunConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)

    def validate(self) -> None:
        if self.stage not in STAGES:
            _fail("stage", f"got {self.stage!r}", f"use one of {STAGES}")
        for part in (self.model, self.optim, self.schedule, self.engine, self.dist, self.loops, self.loop_aux,
                     self.data, self.run):
            part.validate()
        if self.loop_aux.enabled and self.loop_aux.dense and self.stage != "sft":
            _fail("loop_aux.targets", f"{self.loop_aux.targets} targets sit on prompt tokens, which pretraining trains as text",
                  "use stage: sft, or loop_aux.targets=steps")
        check_rank_uniform_depth(self, self.dist.world_size)
