"""`elr-rl eval`: held-out pass@1 per environment and loop count, with a real vLLM engine."""

from __future__ import annotations

import json

import pytest
import torch

from elr_rl.eval.cli import main as eval_main

pytestmark = pytest.mark.slow


def _pytorch_greedy_pass_at_1(ckpt, k: int, seeds: range, difficulty: int = 1) -> list[bool]:
    """The same held-out tasks decoded greedily by the PyTorch model and scored by the environment."""
    from elr_rl.model import LoopedForCausalLM
    from elr_rl.text import TextCodec
    from environments.registry import get_env

    env = get_env("even_odd")
    codec = TextCodec.load(ckpt)
    model = LoopedForCausalLM.from_pretrained(ckpt).eval()
    right = []
    for seed in seeds:
        task = env.generate(seed, difficulty)
        prompt = torch.tensor([codec.prompt_ids(task.prompt)])
        out = model.generate(prompt, 32, k=k, cache_mode="per_loop", eos_token_id=codec.stop_token_ids)
        right.append(bool(env.score(task, codec.decode(out.new_tokens[0].tolist())).accuracy))
    return right


def test_eval_reports_pass_at_1_per_k_as_table_and_json(toy_checkpoint, tmp_path, capsys):
    out = tmp_path / "eval.json"
    rc = eval_main([str(toy_checkpoint), "--envs", "even_odd", "--k", "1,3", "--difficulty", "1,2", "-n", "16",
                    "--max-new-tokens", "32", "--seed-offset", "5000", "--samples", "4", "--max-num-seqs", "5",
                    "--json", str(out)])  # a batch smaller than the tasks: the engine queues the rest
    assert rc == 0
    printed = capsys.readouterr().out
    assert "k=1" in printed and "k=3" in printed and "sampled pass@1" in printed
    assert "even_odd (D=1)" in printed and "even_odd (D=2)" in printed  # one line per difficulty
    rows = json.loads(out.read_text())
    assert [(r["env"], r["difficulty"], r["k"]) for r in rows] == [
        ("even_odd", 1, 1), ("even_odd", 2, 1), ("even_odd", 1, 3), ("even_odd", 2, 3)]
    for r in rows:
        assert r["tasks"] == 16 and 0.0 <= r["pass_at_1"] <= 1.0 and 0.0 <= r["pass_at_1_sampled"] <= 1.0
        assert 5 <= r["response_tokens"] <= 32  # "<answer>even</answer>" and its EOS, give or take
        # greedy vLLM decoding agrees with the PyTorch model's greedy decoding on the same held-out seeds
        expected = _pytorch_greedy_pass_at_1(toy_checkpoint, r["k"], range(5000, 5016), r["difficulty"])
        assert abs(r["pass_at_1"] - sum(expected) / 16) <= 1 / 16 + 1e-9, (r, expected)


def test_eval_of_several_checkpoints_shares_one_run_and_labels_the_rows(toy_checkpoint, tmp_path, capsys):
    """Two checkpoints in one `elr-rl eval`: a table each, rows labelled by checkpoint; the same weights under
    two names give the same greedy rows (one task set, nothing carried from the first engine to the next)."""
    import shutil

    twin = tmp_path / "twin"
    shutil.copytree(toy_checkpoint, twin)
    out = tmp_path / "eval.json"
    assert eval_main([str(toy_checkpoint), str(twin), "--envs", "even_odd", "--k", "1,2", "-n", "8",
                      "--max-new-tokens", "24", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"held-out pass@1 of {toy_checkpoint}" in printed and f"held-out pass@1 of {twin}" in printed
    rows = json.loads(out.read_text())
    assert [r["checkpoint"] for r in rows] == [str(toy_checkpoint)] * 2 + [str(twin)] * 2
    strip = [{k: v for k, v in r.items() if k != "checkpoint"} for r in rows]
    assert strip[:2] == strip[2:]
    assert eval_main([str(toy_checkpoint), str(tmp_path / "missing"), "--envs", "even_odd"]) == 2  # checked first
    assert "not a checkpoint folder" in capsys.readouterr().out


def test_eval_rejects_a_folder_that_is_not_a_checkpoint(tmp_path, capsys):
    assert eval_main([str(tmp_path)]) == 2
    assert "not a checkpoint folder" in capsys.readouterr().out


@pytest.mark.parametrize("flag, value", [("--difficulty", "1,two"), ("--difficulty", "0"), ("--k", "1;2"),
                                         ("--max-num-seqs", "0")])
def test_eval_rejects_bad_lists_before_any_engine_starts(toy_checkpoint, capsys, flag, value):
    assert eval_main([str(toy_checkpoint), flag, value]) == 2
    out = capsys.readouterr().out
    assert flag in out or "must be >= 1" in out


def test_eval_plays_multi_turn_environments_as_episodes():
    """A scripted policy that needs several turns scores 1 only if eval plays the episode turn by turn
    (scoring its first turn alone gives 0). A stand-in engine: the unit here is eval's episode loop."""
    from dataclasses import dataclass

    from elr_rl.eval.evaluate import EvalConfig, _run
    from elr_rl.text import TextCodec
    from environments.pool import ScoringPool
    from environments.registry import get_env

    codec = TextCodec.byte_level()
    env = get_env("interactive_deduction")
    stop = codec.stop_token_ids[0]
    scripts, tasks = {}, []  # prompt -> the turns that solve its task: three tasks of distinct prompts
    for t in (env.generate(s, 1) for s in range(100)):
        key = tuple(codec.prompt_ids(t.prompt))
        if key not in scripts and len(env.reference_turns(t)) > 1 and len(tasks) < 3:
            scripts[key] = env.reference_turns(t)
            tasks.append(t)

    @dataclass
    class Completion:
        token_ids: list
        finish_reason: str = "stop"

    @dataclass
    class Out:
        completions: list

    class Engine:
        def generate(self, contexts, n, max_tokens, temperature, stop_token_ids):
            outs = []
            for ctx in contexts:
                prompt = next(p for p in scripts if tuple(ctx[: len(p)]) == p)
                turn = scripts[prompt][ctx.count(stop)]  # each model turn so far ended in the stop id
                outs.append(Out([Completion(codec.encode_text(turn) + [stop]) for _ in range(n)]))
            return outs

    with ScoringPool(1) as pool:
        got = _run(Engine(), pool, codec, EvalConfig(max_model_len=4096), env, tasks, n=2, temperature=1.0)
        first_turn_only = pool.score_many([(env.name, t, scripts[tuple(codec.prompt_ids(t.prompt))][0]) for t in tasks])
    assert [s.reward for s, _ in got] == [1.0] * 6
    assert all(tokens > len(codec.encode_text(scripts[tuple(codec.prompt_ids(t.prompt))][0])) + 1
               for t, (_, tokens) in zip([t for t in tasks for _ in range(2)], got))  # every turn's tokens
    assert all(s.reward == 0.0 for s in first_turn_only)
