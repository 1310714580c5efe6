"""Profiling a real checkpoint with a real vLLM rollout engine (CPU): counts and resume.

The checkpoint is the RL tests' toy: a tiny model briefly fine-tuned on the
answer format of `even_odd` with randomised answers, so its pass rate there is
far from 0 and 1; on `arith_multidigit` it is about 0; `interactive_deduction`
is multi-turn, played as whole episodes.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest

from elr_rl.profile.cli import profile_with_engines
from elr_rl.profile.profiler import EngineSettings, ProfileConfig, ProfileStore
from environments.base import TURN_SEPARATOR
from environments.registry import get_env

pytestmark = pytest.mark.slow

ENVS = ["even_odd", "arith_multidigit", "interactive_deduction"]  # the last is multi-turn
N_PAIRS = len(ENVS) * 4 * 2  # envs x 4 seeds x 2 loop counts


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    from elr_rl.rl.toy import format_sft_checkpoint

    return format_sft_checkpoint(tmp_path_factory.mktemp("toy") / "ckpt", steps=60)


def _cfg(checkpoint, run_dir, **kw) -> ProfileConfig:
    base = dict(checkpoint=str(checkpoint), run_dir=str(run_dir), envs=ENVS, difficulties=[1], seeds_per_difficulty=4,
                loop_counts=[1, 2], samples_per_prompt=4, max_tokens=24, temperature=1.0, chunk_prompts=3,
                save_samples=True, scoring_workers=0, engine=EngineSettings(max_model_len=1024, max_num_seqs=16))
    base.update(kw)
    return ProfileConfig(**base)


@pytest.fixture(scope="module")
def engine(checkpoint, tmp_path_factory):
    import os

    from elr_rl.profile.engines import EngineGenerate

    os.environ.setdefault("OMP_NUM_THREADS", "1")  # in-process vLLM is ~35x slower without it
    gen = EngineGenerate(_cfg(checkpoint, tmp_path_factory.mktemp("unused")))
    yield gen
    gen.close()


class Counting:
    """The shared real engine, recording which prompts it was asked (and failing on demand)."""

    def __init__(self, engine, fail_after: int | None = None) -> None:
        self.engine, self.fail_after, self.calls, self.asked = engine, fail_after, 0, []

    def __call__(self, contexts, k, n):
        from elr_rl.text import TextCodec

        # a chunk's first call holds first turns only (<|bos|> prompt <|sep|>); episode turns carry more <|sep|>s
        tok = TextCodec.byte_level().tokenizer
        if all(tok.decode(c).count("<|sep|>") == 1 for c in contexts):
            if self.fail_after is not None and self.calls >= self.fail_after:
                raise KeyboardInterrupt  # the job is killed as it starts a chunk
            self.calls += 1
            self.asked += [(tok.decode(c, skip_special_tokens=True), k) for c in contexts]  # the prompt text
        return self.engine(contexts, k, n)

    def factory(self, cfg):
        return self, lambda: None  # the module's engine outlives each job


def _samples(cfg: ProfileConfig) -> list[dict]:
    from curriculum.passrates import read_parquet

    out = []
    for f in sorted(ProfileStore(cfg.run_dir, cfg.name).samples.glob("*.parquet")):
        out += read_parquet(f).to_list()
    return out


def test_real_engine_table_equals_direct_count(engine, checkpoint, tmp_path):
    cfg = _cfg(checkpoint, tmp_path)
    rows = profile_with_engines(cfg, [1, 2], factory=Counting(engine).factory, progress=False)
    assert len(rows) == N_PAIRS
    samples = _samples(cfg)
    # the multi-turn environment was played for several turns (model turns joined by the separator)
    assert any(TURN_SEPARATOR in s["text"] for s in samples if s["env"] == "interactive_deduction")
    # Re-score every saved completion directly with its environment (multi-turn: replay the
    # episode's turns) and count again.
    succ, tokens = defaultdict(int), defaultdict(list)
    for s in samples:
        env = get_env(s["env"])
        score = env.score(env.generate(s["seed"], s["difficulty"]), s["text"])
        succ[(s["prompt_id"], s["k"])] += bool(score.accuracy)
        tokens[(s["prompt_id"], s["k"])].append(s["num_tokens"])
    for r in rows:
        key = (r["prompt_id"], r["k"])
        assert len(tokens[key]) == r["samples"] == 4
        assert succ[key] == r["successes"] and r["pass_rate"] == succ[key] / 4
        assert r["mean_response_tokens"] == pytest.approx(sum(tokens[key]) / 4)
        if r["env"] != "interactive_deduction":  # one turn: at most max_tokens
            assert all(1 <= t <= 24 for t in tokens[key])
    even_odd = [r["pass_rate"] for r in rows if r["env"] == "even_odd"]
    assert 0 < sum(even_odd) / len(even_odd) < 1  # the format is learned, the answers are not


def test_real_engine_interrupted_profile_resumes(engine, checkpoint, tmp_path):
    cfg = _cfg(checkpoint, tmp_path, save_samples=False)
    first = Counting(engine, fail_after=3)
    with pytest.raises(KeyboardInterrupt):
        profile_with_engines(cfg, [1, 2], factory=first.factory, progress=False)
    finished = ProfileStore(cfg.run_dir, cfg.name).finished()
    assert len(finished) == 3 * 3  # three chunks of 3 prompts (all at k=1)
    second = Counting(engine)
    rows = profile_with_engines(cfg, [1, 2], factory=second.factory, progress=False)
    assert len(second.asked) == N_PAIRS - 9
    assert len(rows) == N_PAIRS and len({(r["prompt_id"], r["k"]) for r in rows}) == N_PAIRS
    # what the second run generated is exactly what the first had not finished (as prompt texts:
    # two seeds may share one text, so compare multisets)
    def text(r):
        return get_env(r["env"]).generate(r["seed"], r["difficulty"]).prompt

    todo = Counter((text(r), r["k"]) for r in rows if (r["prompt_id"], r["k"]) not in finished)
    assert Counter(second.asked) == todo
