"""Profiling bookkeeping with a scripted policy: counting, Parquet parts, resume, summary, errors.

The scripted policy answers with the environment's reference solution for a
known subset of samples, so the expected pass rates are known exactly; the
real-engine test is in test_profile_engine.py.
"""

from __future__ import annotations

import zlib

import pytest

from elr_rl.profile.cli import checkpoint_loop_counts, main
from elr_rl.profile.engines import local_runner
from curriculum.passrates import PROFILE_COLUMNS, read_parquet, read_profile_rows
from elr_rl.profile.profiler import Completion, ProfileConfig, ProfileStore, profile_pool, run_profile, summarize
from curriculum.routing import CurriculumConfig, LoopRouter, pool_from_profile
from elr_rl.model import save_tokenizer
from elr_rl.text import TextCodec
from environments.agentic.tool_db_workflow import ToolDbWorkflow
from environments.single.arith_multidigit import ArithMultidigit
from environments.single.expr_eval import ExprEval

ENVS = {"arith_multidigit": ArithMultidigit(), "expr_eval": ExprEval(), "tool_db_workflow": ToolDbWorkflow()}
E = len(ENVS)  # pools below: E envs x 2 difficulties x seeds
WRONG_TURN = "I am not sure what to do."  # not an action: the environment answers with a format message
CODEC = TextCodec.byte_level()  # the checkpoints below carry the byte tokenizer and its chat template


def _turns(context: list[int]) -> tuple[str, list[str]]:
    """(prompt, model turns so far) of a context rendered by the byte chat template:
    <|bos|> prompt <|sep|> (model turn <|eos|> tool: observation <|sep|>)*"""
    text = CODEC.tokenizer.decode(context, skip_special_tokens=False)
    prompt, *rest = text.removeprefix("<|bos|>").split("<|sep|>")
    return prompt, [part.split("<|eos|>")[0] for part in rest[:-1]]


def _correct(prompt: str, k: int, i: int) -> bool:
    """Sample i at loop count k is correct iff this deterministic hash says so (about k/5 of them)."""
    return zlib.crc32(f"{prompt}|{k}|{i}".encode()) % 5 < k


class ScriptedPolicy:
    """A GenerateFn that answers from a prompt->task table and records the prompts it was asked.

    Single-turn: the reference solution or a known-bad answer. Multi-turn: an episode
    whose first turn is the reference's plays the reference turns on; others play
    WRONG_TURN until the environment stops them.
    """

    def __init__(self, cfg: ProfileConfig) -> None:
        self.tasks = {}
        for p in profile_pool(cfg):
            t = ENVS[p.env].generate(p.seed, p.difficulty)
            self.tasks[t.prompt] = t
        self.asked: list[tuple[str, int]] = []

    def _first(self, task, k: int, i: int) -> str:
        env, ok = ENVS[task.env], _correct(task.prompt, k, i)
        if env.multi_turn:
            return env.reference_turns(task)[0] if ok else WRONG_TURN
        return env.reference_solution(task) if ok else env.bad_answers(task)[0]

    def _later(self, task, model_turns: list[str], turn: int) -> str:
        ref = ENVS[task.env].reference_turns(task)
        return ref[turn] if model_turns[0] == ref[0] and turn < len(ref) else WRONG_TURN

    def __call__(self, contexts: list[list[int]], k: int, n: int) -> list[list[Completion]]:
        out = []
        for ctx in contexts:
            prompt, model_turns = _turns(ctx)
            task, turn = self.tasks[prompt], len(model_turns)
            if turn == 0:
                self.asked.append((task.id, k))
                texts = [self._first(task, k, i) for i in range(n)]
            else:
                texts = [self._later(task, model_turns, turn)] * n
            out.append([Completion(CODEC.encode_text(t) + [CODEC.stop_token_ids[0]]) for t in texts])
        return out


def _cfg(tmp_path, **kw) -> ProfileConfig:
    save_tokenizer(tmp_path)  # the "checkpoint" folder: what the profile reads is its tokenizer
    base = dict(checkpoint=str(tmp_path), run_dir=str(tmp_path / "run"), envs=list(ENVS), difficulties=[1, 2],
                seeds_per_difficulty=5, samples_per_prompt=6, chunk_prompts=4, save_samples=True)
    base.update(kw)
    return ProfileConfig(**base)


def test_table_counts_equal_direct_count(tmp_path):
    cfg = _cfg(tmp_path)
    policy = ScriptedPolicy(cfg)
    rows = run_profile(cfg, [1, 3], local_runner(policy, ENVS, cfg.samples_per_prompt, CODEC), progress=False)
    assert len(rows) == E * 2 * 5 * 2
    table = read_profile_rows(tmp_path / "run" / "profile" / "profile.parquet")
    assert read_profile_rows(tmp_path / "run") == table  # a run directory means its newest table
    assert table == rows and all(set(PROFILE_COLUMNS) <= set(r) for r in table)
    by_id = {t.id: t for t in policy.tasks.values()}
    for r in table:
        expected = sum(_correct(by_id[r["prompt_id"]].prompt, r["k"], i) for i in range(6))
        assert (r["samples"], r["successes"]) == (6, expected)
        assert r["pass_rate"] == pytest.approx(expected / 6)
    assert 0 < sum(r["successes"] for r in table) < 6 * len(table)
    # the saved samples re-count to the same table
    samples = ProfileStore(cfg.run_dir, cfg.name)
    recount: dict[tuple[str, int], int] = {}
    for f in sorted(samples.samples.glob("*.parquet")):
        for s in read_parquet(f).to_list():
            recount[(s["prompt_id"], s["k"])] = recount.get((s["prompt_id"], s["k"]), 0) + s["success"]
    assert recount == {(r["prompt_id"], r["k"]): r["successes"] for r in table}
    text = summarize(table)
    assert all(name in text for name in ENVS) and len(text.splitlines()) == 2 + E * 2
    # a router built from the table routes exactly these prompts
    router = LoopRouter(CurriculumConfig(batch_size=8, profile_k=1), pool_from_profile(table), table)
    assert router.stats()["unprofiled"] == 0 and len(router.pool) == E * 10


def test_interrupted_profile_resumes_without_repeating(tmp_path):
    cfg = _cfg(tmp_path)
    first = ScriptedPolicy(cfg)
    runner = local_runner(first, ENVS, cfg.samples_per_prompt, CODEC)

    def interrupted(chunks):
        for i, out in enumerate(runner(chunks)):
            if i == 3:
                raise KeyboardInterrupt  # the 4th chunk was generated but never written
            yield out

    with pytest.raises(KeyboardInterrupt):
        run_profile(cfg, [1, 2], interrupted, progress=False)
    store = ProfileStore(cfg.run_dir, cfg.name)
    finished = store.finished()
    assert len(finished) == 3 * 4 and not store.table_path.exists()

    second = ScriptedPolicy(cfg)
    rows = run_profile(cfg, [1, 2], local_runner(second, ENVS, cfg.samples_per_prompt, CODEC), progress=False)
    assert not finished & set(second.asked)
    assert len(second.asked) == E * 20 - 12
    assert {(r["prompt_id"], r["k"]) for r in rows} == {(p.prompt_id, k) for p in profile_pool(cfg) for k in (1, 2)}
    assert len(rows) == E * 20
    # a third run finds nothing to do
    third = ScriptedPolicy(cfg)
    assert run_profile(cfg, [1, 2], local_runner(third, ENVS, 6, CODEC), progress=False) == rows and not third.asked


def test_resume_with_other_settings_is_refused_but_growing_is_fine(tmp_path):
    cfg = _cfg(tmp_path, seeds_per_difficulty=2)
    run_profile(cfg, [1], local_runner(ScriptedPolicy(cfg), ENVS, 6, CODEC), progress=False)
    other = _cfg(tmp_path, seeds_per_difficulty=2, samples_per_prompt=4)
    with pytest.raises(ValueError, match="samples_per_prompt"):
        run_profile(other, [1], local_runner(ScriptedPolicy(other), ENVS, 4, CODEC), progress=False)
    # the CLI refuses it too, before touching the run directory's config record
    (tmp_path / "config.json").write_text('{"max_loops": 2}')
    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text(f"envs: {list(ENVS)}\n")
    assert main([str(cfg_file), f"checkpoint={tmp_path}", f"run_dir={tmp_path / 'run'}", "samples_per_prompt=4"]) == 2
    assert not (tmp_path / "run" / "profile" / "profile.config.yaml").exists()
    # growing the job (more seeds, another k) profiles only the new pairs
    grown = _cfg(tmp_path, seeds_per_difficulty=3)
    policy = ScriptedPolicy(grown)
    rows = run_profile(grown, [1, 2], local_runner(policy, ENVS, 6, CODEC), progress=False)
    assert len(rows) == E * 2 * 3 * 2 and len(policy.asked) == len(rows) - E * 2 * 2


def test_profile_table_missing_column_is_a_clear_error(tmp_path):
    from datasets import Dataset

    path = tmp_path / "bad.parquet"
    Dataset.from_list([dict(prompt_id="a/d1/s0", env="a", difficulty=1, seed=0, k=1, samples=2,
                            successes=1, pass_rate=0.5)]).to_parquet(str(path))
    with pytest.raises(ValueError, match=r"lacks column\(s\) \['mean_response_tokens'\]"):
        read_profile_rows(path)
    with pytest.raises(ValueError, match="not found"):
        read_profile_rows(tmp_path / "nothing.parquet")


def test_cli_errors_and_loop_counts(tmp_path, capsys):
    (tmp_path / "config.json").write_text('{"max_loops": 3}')
    assert checkpoint_loop_counts(str(tmp_path)) == [1, 2, 3]
    cfg_file = tmp_path / "p.yaml"
    cfg_file.write_text("envs: [arith_multidigit]\n")
    assert main([str(cfg_file)]) == 2
    assert "set checkpoint=PATH" in capsys.readouterr().err
    assert main([str(cfg_file), f"checkpoint={tmp_path}", "samples_per_prompt=0"]) == 2
    assert "samples_per_prompt must be positive" in capsys.readouterr().err
    assert main([str(cfg_file), f"checkpoint={tmp_path}", "engine.gpu_memory_utilization=1.2"]) == 2
    assert "engine.gpu_memory_utilization must be a share in (0, 1]" in capsys.readouterr().err
    assert main([str(cfg_file), "nonsense_key=1", f"checkpoint={tmp_path}"]) == 2
    assert "nonsense_key" in capsys.readouterr().err


@pytest.mark.parametrize("name", ["profile.yaml", "profile_tiny.yaml"])
def test_shipped_profile_configs_load(tmp_path, name):
    from pathlib import Path

    from elr_rl.config import load_config

    path = Path(__file__).resolve().parents[2] / "configs" / name
    cfg = load_config(ProfileConfig, path, [f"checkpoint={tmp_path}"])
    assert cfg.envs and cfg.samples_per_prompt > 0


def _scripted_factory(cfg: ProfileConfig):
    return ScriptedPolicy(cfg), lambda: None


@pytest.mark.slow
def test_ray_workers_share_the_chunks(tmp_path, ray_local):
    """Several Ray workers (scripted engines here; the vLLM one is in test_profile_engine.py)."""
    import sys

    from elr_rl.profile.engines import ray_runner

    ray_local.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # workers need not import tests/
    small = dict(envs=["arith_multidigit", "expr_eval"], seeds_per_difficulty=3)
    cfg = _cfg(tmp_path, num_engines=2, engine_cpus=0.5, **small)
    runner, shutdown = ray_runner(cfg, _scripted_factory)
    try:
        rows = run_profile(cfg, [1, 2], runner, progress=False)
    finally:
        shutdown()
    local_cfg = _cfg(tmp_path / "local", **small)
    local = run_profile(local_cfg, [1, 2], local_runner(ScriptedPolicy(local_cfg), ENVS, 6, CODEC), progress=False)
    strip = lambda rs: sorted((r["prompt_id"], r["k"], r["successes"]) for r in rs)  # noqa: E731
    assert len(rows) == 2 * 2 * 3 * 2 and strip(rows) == strip(local)
