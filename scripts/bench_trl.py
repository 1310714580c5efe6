"""Benchmark: TRL's GRPOTrainer on the same tiny config as scripts/bench_rl.py (samples/s baseline).

Runs inside the separate venv made by scripts/setup_bench_trl.sh (TRL is never installed in
the project's .venv):

    bash scripts/setup_bench_trl.sh
    .venv-bench-trl/bin/python scripts/bench_trl.py [--steps 10] [--threads 1]

What matches bench_rl.py:
  * tokenizer: our byte-level tokenizer (elr_rl/model/tokenizer.py, loaded by file path so the
    torch-heavy elr_rl.model package is not imported), prompts rendered by its own chat template
    (`<|bos|> prompt <|sep|>`, what elr_rl.text.TextCodec feeds our rollouts); its EOS ends a
    completion.
  * model: a `LlamaForCausalLM` of our k = 1 size (--size toy: hidden 64, 3 layers = 1 input + 1
    recurrent + 1 output, 4 heads, 2 KV heads, SwiGLU 176; 12m / 50m: hidden 512 / 1024, 4 layers,
    bench_rl.py's shapes; vocab 260, untied embeddings), RANDOMLY
    INITIALISED (no checkpoint is loaded: timing only, rewards stay near 0).
  * data and reward: the even_odd environment (difficulty 1, seeds 0..63, like the bench's
    prompt pool); reward 1 when the `<answer>` span is the right word (the environment's own
    `score`).
  * batch: 8 prompts x 8 generations = 64 completions per optimizer step, max 24 new tokens,
    temperature 1, lr 5e-4, one gradient step per batch (num_iterations 1), beta 0 (no
    reference model), token-level (DAPO) aggregation, clip 0.2 / 0.28, group std scaling.
  * device: CPU, fp32 (`--dtype bfloat16`: TRL's bf16 mixed precision, as bench_rl.py's learner uses
    where bf16 is the faster dtype), no gradient checkpointing (TRL's defaults are bf16 and gradient
    checkpointing on: both are set explicitly), plain `model.generate` (no vLLM), 1 torch thread by
    default (`--threads`): our learner and our vLLM worker use 1 thread each.

Timing: the end of each optimizer step is stamped; the first step (warm-up) is skipped, and
samples/s = 64 x (steps - 1) / (last end - first end), as bench_rl.py measures its runs.

Fairness: a random model rarely emits EOS, so TRL's completions run to ~24 tokens while our
trained toy policy answers in ~22; the mean completion length (EOS included) is reported so
the comparison can also be read per token.

Prints one final JSON line: trl_version, trl_samples_per_s, trl_step_s,
trl_completion_tokens_mean, steps (timed steps), threads.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPTS, GROUP, MAX_NEW, LR = 8, 8, 24, 5e-4
# bench_rl.py's --size: the k = 1 shape of our model (toy: 1 + 1 + 1 blocks; 12m / 50m: 1 + 2 + 1)
SIZES = {
    "toy": {"hidden_size": 64, "intermediate_size": 176, "num_attention_heads": 4, "num_key_value_heads": 2, "layers": 3},
    "12m": {"hidden_size": 512, "intermediate_size": 1408, "num_attention_heads": 8, "num_key_value_heads": 2, "layers": 4},
    "50m": {"hidden_size": 1024, "intermediate_size": 2816, "num_attention_heads": 16, "num_key_value_heads": 4,
            "layers": 4},
}


def _load_tokenizer_module():
    """elr_rl/model/tokenizer.py by path (stdlib at import; tokenizers + transformers when built)."""
    spec = importlib.util.spec_from_file_location("elr_bench_tokenizer", ROOT / "elr_rl" / "model" / "tokenizer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps (the first is warm-up, not timed)")
    p.add_argument("--threads", type=int, default=1, help="torch threads (ours: 1 per learner / vLLM worker)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32",
                   help="bfloat16: TRL's bf16 mixed precision (bench_rl.py passes the dtype it picked)")
    p.add_argument("--size", choices=sorted(SIZES), default="toy", help="bench_rl.py's --size (the k = 1 shape)")
    p.add_argument("--layers", type=int, default=None,
                   help="decoder layers (default: the size's k = 1 count; toy: 2 + k matches our compute at k loops)")
    args = p.parse_args()
    if args.steps < 2:
        p.error("--steps must be >= 2 (the first step is not timed)")
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(args.threads)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    sys.path.insert(0, str(ROOT))

    import torch
    import transformers
    import trl
    from datasets import Dataset
    from transformers import LlamaConfig, LlamaForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from environments.toy.even_odd import EvenOdd

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    transformers.logging.set_verbosity_error()

    tk = _load_tokenizer_module()
    tokenizer = tk.build_tokenizer()

    env = EvenOdd()
    tasks = [env.generate(seed, 1) for seed in range(64)]
    by_seed = {t.seed: t for t in tasks}
    texts = [tokenizer.apply_chat_template([{"role": "user", "content": t.prompt}], tokenize=False,
                                           add_generation_prompt=True) for t in tasks]
    dataset = Dataset.from_dict({"prompt": texts, "seed": [t.seed for t in tasks]})

    lengths: list[list[int]] = []  # completion lengths (EOS included) of each generation batch
    rewards: list[float] = []

    def even_odd_reward(prompts, completions, completion_ids, seed, **kwargs):
        if len(completion_ids) != PROMPTS * GROUP:
            raise RuntimeError(f"expected {PROMPTS * GROUP} completions per batch, got {len(completion_ids)}")
        lengths.append([len(c) for c in completion_ids])
        out = [env.score(by_seed[s], c).reward for s, c in zip(seed, completions)]
        rewards.extend(out)
        return out

    shape = dict(SIZES[args.size])
    layers = args.layers or shape.pop("layers")
    shape.pop("layers", None)
    model = LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tokenizer), num_hidden_layers=layers, **shape, hidden_act="silu", tie_word_embeddings=False, rms_norm_eps=1e-6, rope_theta=10000.0,
        max_position_embeddings=2048, initializer_range=0.02, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    ))  # random init
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id

    class StepTimer(TrainerCallback):
        def __init__(self) -> None:
            self.ends: list[float] = []

        def on_step_end(self, args, state, control, **kwargs):
            self.ends.append(time.perf_counter())

    timer = StepTimer()
    out_dir = tempfile.mkdtemp(prefix="bench_trl_")
    cfg = GRPOConfig(
        output_dir=out_dir, max_steps=args.steps, seed=args.seed, use_cpu=True,
        per_device_train_batch_size=PROMPTS * GROUP, gradient_accumulation_steps=1, num_generations=GROUP,
        max_completion_length=MAX_NEW, temperature=1.0, top_p=1.0, top_k=0, learning_rate=LR,
        beta=0.0, num_iterations=1, loss_type="dapo", epsilon=0.2, epsilon_high=0.28, scale_rewards="group",
        use_vllm=False, bf16=args.dtype == "bfloat16", fp16=False, gradient_checkpointing=False,
        eval_strategy="no", save_strategy="no", report_to="none", logging_steps=1, disable_tqdm=True,
        dataloader_num_workers=0, log_completions=False,
    )
    trainer = GRPOTrainer(model=model, reward_funcs=even_odd_reward, args=cfg, train_dataset=dataset,
                          processing_class=tokenizer, callbacks=[timer])
    trainer.remove_callback(transformers.trainer_callback.PrinterCallback)  # keep stdout to the JSON line
    try:
        trainer.train()
    finally:
        shutil.rmtree(out_dir, ignore_errors=True)

    ends = timer.ends
    timed = len(ends) - 1
    span = ends[-1] - ends[0]
    steady = [n for batch in lengths[1:] for n in batch] or [n for batch in lengths for n in batch]
    result = {
        "trl_version": trl.__version__,
        "transformers_version": transformers.__version__,
        "torch_version": torch.__version__,
        "trl_samples_per_s": round(PROMPTS * GROUP * timed / span, 3) if span > 0 else 0.0,
        "trl_step_s": round(span / timed, 4) if timed else 0.0,
        "trl_completion_tokens_mean": round(sum(steady) / max(1, len(steady)), 2),
        "trl_reward_mean": round(sum(rewards) / max(1, len(rewards)), 4),
        "trl_params": sum(t.numel() for t in model.parameters()),
        "steps": timed,
        "layers": layers,
        "size": args.size,
        "threads": args.threads,
        "dtype": args.dtype,
    }
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
