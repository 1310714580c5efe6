"""A pip-installed third-party environment is discovered by entry point; the scoring pool
survives raising and hanging verifiers, starts timeouts when a job starts, and respects
per-environment concurrency limits."""

from __future__ import annotations

import time

import pytest

from environments import registry
from environments.pool import ScoringPool
from tests.environments import plugin_pkg


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    plugin_pkg.install(tmp_path_factory.mktemp("plugin") / "pkg")
    registry.refresh()
    yield
    plugin_pkg.uninstall()
    registry.refresh()


@pytest.fixture(scope="module")
def pool(plugin):
    with ScoringPool(num_workers=2) as p:
        yield p


def _job(env_name: str, seed: int = 0, right: bool = True):
    env = registry.get_env(env_name)
    task = env.generate(seed, 1)
    return env_name, task, env.reference_solution(task) if right else env.bad_answers(task)[0]


def test_third_party_env_discovered_by_entry_point(plugin):
    assert {"plugin_add", "plugin_raise", "plugin_hang", "plugin_sleep"} <= set(registry.list_envs())
    assert registry.entry_point("plugin_add").dist.name == plugin_pkg.DIST
    env = registry.get_env("plugin_add")
    task = env.generate(3, 2)
    assert env.score(task, env.reference_solution(task)).reward == 1.0


def test_unknown_env_lists_known_ones():
    with pytest.raises(ValueError, match="registered environments: .*code_function_synthesis"):
        registry.get_env("no_such_env")


def test_raising_and_hanging_verifiers_score_zero_others_finish(pool):
    restarts = pool.restarts
    jobs = [_job("plugin_add", s) for s in range(3)] + [_job("plugin_raise"), _job("plugin_hang")]
    jobs += [_job("plugin_add", s) for s in range(3, 6)]
    start = time.monotonic()
    scores = pool.score_many(jobs)
    assert time.monotonic() - start < 10
    raised, hung = scores[3], scores[4]
    assert raised.reward == 0.0 and not raised.accuracy and "RuntimeError: verifier bug" in raised.error
    assert hung.reward == 0.0 and not hung.accuracy and "timed out" in hung.error
    others = scores[:3] + scores[5:]
    assert all(s.reward == 1.0 and s.error is None for s in others)
    assert pool.restarts == restarts + 1  # the hung worker was replaced...
    assert pool.score_many([_job("plugin_add", 9)])[0].reward == 1.0  # ...and the pool still works


def test_timeout_clock_starts_when_job_starts_and_concurrency_is_limited(pool):
    # Three 0.6 s jobs of an env limited to one at a time take ~1.8 s in all, past its 1.5 s
    # timeout: they only pass if each job's clock starts when it starts running.
    sleepy = [_job("plugin_sleep", s) for s in range(3)]
    futures = [pool.submit(*j) for j in sleepy]
    fast = pool.submit(*_job("plugin_add", 1))  # another env is not held up by the limited one
    assert fast.result(timeout=10).reward == 1.0
    assert not all(f.done() for f in futures)
    scores = [f.result(timeout=20) for f in futures]
    assert all(s.reward == 1.0 and s.error is None for s in scores), [s.error for s in scores]
    spans = sorted((s.components["start"], s.components["end"]) for s in scores)
    assert all(prev_end <= next_start for (_, prev_end), (next_start, _) in zip(spans, spans[1:]))


def test_results_stream_as_they_complete(pool):
    jobs = [_job("plugin_sleep", 7), _job("plugin_add", 1), _job("plugin_add", 2)]
    order = [i for i, score in pool.imap_unordered(jobs)]
    assert sorted(order) == [0, 1, 2]
    assert order[-1] == 0  # the slow job does not block the fast ones


def test_pool_scores_real_sandboxed_and_multi_turn_envs(pool):
    jobs = [_job("code_function_synthesis", 0), _job("code_function_synthesis", 1, right=False),
            _job("interactive_deduction", 1), _job("tool_db_workflow", 2, right=False)]  # fmt: skip
    assert [s.reward for s in pool.score_many(jobs)] == [1.0, 0.0, 1.0, 0.0]


def test_sandboxed_job_cannot_kill_its_scoring_worker(pool):
    from environments.code.harness import fence
    from tests.environments.adversarial import PYTHON

    env_name, task, _ = _job("code_function_synthesis", 4)
    restarts = pool.restarts
    score = pool.submit(env_name, task, fence(PYTHON["kill_parent"])).result(timeout=30)
    assert score.reward == 0.0 and score.error is None  # scored, not "worker died"
    assert pool.restarts == restarts


def test_submit_from_many_threads(pool):
    from concurrent.futures import ThreadPoolExecutor

    jobs = [_job("plugin_add", s) for s in range(40)]
    with ThreadPoolExecutor(4) as ex:
        futures = list(ex.map(lambda j: pool.submit(*j), jobs))
    assert all(f.result(timeout=30).reward == 1.0 for f in futures)


def _play(session, turns):
    results = [session.step(t).result(timeout=30) for t in turns]
    return results, session.finish().result(timeout=30)


def test_episodes_run_in_the_pool_with_its_timeout_and_error_rule(plugin):
    """Multi-turn episodes take the scoring path of single-turn scores: a step that hangs or raises
    ends its episode with reward 0; an episode whose worker was replaced meanwhile is rebuilt
    (its turns replayed) and still scores right."""
    env = registry.get_env("plugin_turns")
    task = env.generate(0, 1)
    good = env.reference_turns(task)
    with ScoringPool(num_workers=1) as pool:  # one worker: every session lives in the same process
        results, score = _play(pool.episode("plugin_turns", task), good)
        assert [r.done for r in results] == [False, False, True] and score.reward == 1.0
        assert results[0].observation == f"total {int(task.answer) - 1}"

        survivor = pool.episode("plugin_turns", task)
        assert survivor.step(good[0]).result(timeout=30).error is None  # its state is on the only worker
        start = time.monotonic()
        hung, hung_score = _play(pool.episode("plugin_turns", task), ["<add>1</add>", "hang", "<add>1</add>"])
        assert time.monotonic() - start < 15
        assert hung[0].error is None and "timed out" in hung[1].error and hung[1].done
        assert hung_score.reward == 0.0 and "timed out" in hung_score.error
        assert pool.restarts == 1
        rest, survivor_score = _play(survivor, good[1:])  # rebuilt on the new worker by replaying its first turn
        assert [r.error for r in rest] == [None, None] and survivor_score.reward == 1.0

        raised, raised_score = _play(pool.episode("plugin_turns", task), ["raise"])
        assert "RuntimeError: step bug" in raised[0].error and raised[0].done
        assert raised_score.reward == 0.0 and "step bug" in raised_score.error
        assert pool.restarts == 1  # a raising step does not cost a worker


def test_play_episodes_through_pool_sessions_matches_in_process_play(plugin):
    from dataclasses import dataclass

    from elr_rl.rollout.episodes import play_episodes
    from elr_rl.text import TextCodec
    from environments.pool import LocalEpisode

    codec = TextCodec.byte_level()
    env = registry.get_env("plugin_turns")
    task = env.generate(3, 1)
    turns = env.reference_turns(task) + ["hang"]  # never reached: the episode ends at its answer
    stop = codec.stop_token_ids[0]

    @dataclass
    class Turn:
        token_ids: list
        logprobs: list
        finish_reason: str = "stop"

    def turn(text):
        ids = codec.encode_text(text) + [stop]
        return Turn(ids, [-0.1] * len(ids))

    def generate(contexts):
        return [turn(turns[ctx.count(stop)]) for ctx in contexts]

    prompt = codec.prompt_ids(task.prompt)
    first = [turn(turns[0]), turn("raise")]
    with ScoringPool(num_workers=2) as pool:
        pooled = play_episodes(generate, codec, [pool.episode(env.name, task) for _ in first], env.max_turns,
                               prompt, first)
    local = play_episodes(generate, codec, [LocalEpisode(env, task)], env.max_turns, prompt, first[:1])
    assert pooled[0].score.reward == local[0].score.reward == 1.0
    assert pooled[0].response_ids == local[0].response_ids and pooled[0].turns == local[0].turns
    assert pooled[1].score.reward == 0.0 and "step bug" in pooled[1].score.error and len(pooled[1].turns) == 1
