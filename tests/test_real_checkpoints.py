"""Checkpoints whose token ids are NOT the bytes, end to end with real vLLM, DeepSpeed and Ray.

1. A BPE tokenizer trained here (ChatML template, thinking tokens, two stop ids): SFT -> profile ->
   RL -> eval run on it; vLLM/PyTorch logprob parity holds; rollout prompts are exactly the rendered
   chat prompts; completions end at the end-of-turn id and the reward sees the text without it.
2. Dory1.0-4B's released layout (507 tensors, vocab 131,072, 16/40/16 sublayers) at tiny widths, with
   the same tokenizer: rollouts, a learner step, a weight sync and the parity check.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from elr_rl.model import DoryConfig, LoopedForCausalLM
from elr_rl.text import TextCodec
from tests.rl.helpers import make_config
from tests.rollout.helpers import TOL, randomize_, sampled_vs_teacher_forced
from tests.test_text import corpus

pytestmark = pytest.mark.slow


def run_cli(args: list[str]) -> None:
    from elr_rl.cli import main

    assert main(args) == 0, args


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    from elr_rl.model.bpe import train_bpe

    d = tmp_path_factory.mktemp("bpe")
    train_bpe(corpus(), d, vocab_size=3000)
    return d


@pytest.fixture(scope="module")
def sft_checkpoint(bpe_dir, tmp_path_factory):
    """A tiny ELR model with the BPE tokenizer, SFT'd on even_odd through `elr-rl sft`."""
    root = tmp_path_factory.mktemp("bpe_run")
    run_cli(["model", "init", str(root / "init"), "--tokenizer", str(bpe_dir), "loop_conditioning=true"])
    # Its own process, as a user runs it (DeepSpeed's process group does not outlive the stage).
    subprocess.run([sys.executable, "-m", "elr_rl.cli", "sft", "configs/sft_tiny.yaml", f"model.init_from={root / 'init'}",
                    f"run.output_dir={root / 'sft'}", "data.generators=[env:even_odd]", "data.max_difficulty=1",
                    "data.seq_len=128", "run.total_steps=40", "run.eval_interval=0", "run.progress=false",
                    "optim.lr=0.003"], check=True)
    return root / "sft" / "final"


def test_bpe_checkpoint_through_every_stage(sft_checkpoint, tmp_path):
    from elr_rl.eval.evaluate import EvalConfig, evaluate
    from elr_rl.rl.driver import Driver
    from elr_rl.rollout.engine import EngineOptions, RolloutEngine
    from environments.registry import get_env

    codec = TextCodec.load(sft_checkpoint)
    env = get_env("even_odd")
    tasks = [env.generate(s, 1) for s in range(6)]
    prompts = [codec.prompt_ids(t.prompt) for t in tasks]
    engine = RolloutEngine(sft_checkpoint, k=2, cache_mode="per_loop", seed=0,
                           options=EngineOptions(max_model_len=192, max_num_seqs=16))
    try:
        groups = engine.generate(prompts, n=2, max_tokens=24, temperature=1.0, stop_token_ids=codec.stop_token_ids,
                                 return_prompt_logprobs=True)
    finally:
        engine.shutdown()
    model = LoopedForCausalLM.from_pretrained(sft_checkpoint).eval()
    prompt_gap, sampled_gap = sampled_vs_teacher_forced(model, groups, 2)
    assert prompt_gap <= TOL and sampled_gap <= TOL  # vLLM and PyTorch agree on BPE ids
    stopped = 0
    for task, g in zip(tasks, groups):
        assert codec.tokenizer.decode(g.prompt_token_ids) == codec.render_prompt(task.prompt)  # no raw bytes fed
        for c in g.completions:
            if c.finish_reason == "stop":  # ended at a stop id of generation_config.json, which the reward never sees
                stopped += 1
                assert c.token_ids[-1] in codec.stop_token_ids
                text = codec.decode(c.token_ids)
                assert "<|im_end|>" not in text and text == codec.tokenizer.decode(c.token_ids[:-1])
    assert stopped >= len(tasks)  # SFT taught the end of the turn

    run_cli(["profile", "configs/profile_tiny.yaml", f"checkpoint={sft_checkpoint}", f"run_dir={tmp_path / 'rl'}",
             "envs=[even_odd]", "difficulties=[1]", "loop_counts=[1,2]", "seeds_per_difficulty=4",
             "samples_per_prompt=4", "max_tokens=24", "engine.max_model_len=192"])
    profile = tmp_path / "rl" / "profile"
    cfg = make_config(sft_checkpoint, tmp_path / "rl", run={"total_steps": 2}, rollout={"max_model_len": 192},
                      algo={"groups_per_step": 4})
    cfg.curriculum.profile_table = str(profile)
    cfg.curriculum.loop_counts = [1, 2]
    summary = Driver(cfg).run()
    assert summary["step"] == 2
    final = summary["final_checkpoint"]
    assert TextCodec.load(final).stop_token_ids == codec.stop_token_ids  # the RL checkpoint keeps the tokenizer
    rows = evaluate(final, EvalConfig(envs=["even_odd"], ks=[1, 2], num_tasks=8, max_new_tokens=24,
                                      max_model_len=192), progress=False)
    assert {r["k"] for r in rows} == {1, 2} and all(0 <= r["pass_at_1"] <= 1 for r in rows)
    assert all(r["response_tokens"] < 24 for r in rows)  # greedy answers stop at the end of the turn


def dory_4b_layout(vocab_size: int) -> DoryConfig:
    """The released config's fields and layout (72 sublayers as 16 + 40 + 16, S-S-S-*- x 9, GQA 16/4,
    vocab 131,072, loops 4) with tiny widths."""
    return DoryConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=96, attention_head_dim=8,
                      swa_window_size=32, max_position_embeddings=512)


def test_dory_4b_layout_rollouts_learner_step_weight_sync_and_parity(bpe_dir, tmp_path):
    from safetensors import safe_open

    from elr_rl.rl.driver import Driver
    from elr_rl.rollout.engine import EngineOptions, RolloutEngine

    ckpt = tmp_path / "dory"
    cfg = dory_4b_layout(131072)
    assert (cfg.num_hidden_layers, cfg.n_input_layers, cfg.n_recurrent_layers, cfg.n_output_layers) == (72, 16, 40, 16)
    torch.manual_seed(0)
    model = randomize_(LoopedForCausalLM(cfg), seed=3)
    model.save_pretrained(ckpt)
    TextCodec.load(bpe_dir).save_pretrained(ckpt)
    with safe_open(str(ckpt / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert len(names) == 507 and "backbone.layers.71.mlp_alpha" in names and "lm_head.logit_scale" in names
    assert json.loads((ckpt / "config.json").read_text())["model_type"] == "dory"

    rl = make_config(ckpt, tmp_path / "rl", run={"total_steps": 2}, rollout={"group_size": 2, "max_new_tokens": 8},
                     algo={"groups_per_step": 2, "dynamic_sampling": False})
    rl.curriculum.loop_counts = [1, 2]
    rl.curriculum.batch_size = 4
    summary = Driver(rl).run()
    assert summary["step"] == 2 and summary["version"] == 2
    rows = [json.loads(line) for line in open(tmp_path / "rl" / "metrics.jsonl")]
    assert all(r["timing_s/weight_sync"] > 0 for r in rows)  # the new weights went out after each step
    final = summary["final_checkpoint"]
    trained = LoopedForCausalLM.from_pretrained(final).eval()
    assert not torch.equal(trained.lm_head.weight, model.lm_head.weight)  # the learner step changed the weights

    codec = TextCodec.load(final)
    prompts = [codec.prompt_ids("What is 2 + 2?"), codec.prompt_ids("Sort 3 1 2.")]
    engine = RolloutEngine(final, k=2, cache_mode="per_loop", seed=0,
                           options=EngineOptions(max_model_len=96, max_num_seqs=4))
    try:
        for k in (1, 2):
            engine.set_k(k)
            groups = engine.generate(prompts, n=1, max_tokens=6, stop_token_ids=codec.stop_token_ids,
                                     return_prompt_logprobs=True)
            gaps = sampled_vs_teacher_forced(trained, groups, k)
            assert max(gaps) <= TOL, (k, gaps)
    finally:
        engine.shutdown()
