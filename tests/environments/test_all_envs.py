"""Golden checks for EVERY registered environment (entry-point group `elr_rl.environments`).

Same seed gives the same task; the reference solution scores 1.0; empty, garbage,
hedged and known-bad (wrong but well-formed) answers score 0.0; difficulty D+1 is
harder than D by a task statistic; worked solutions are usable as SFT targets.
"""

from __future__ import annotations

import pytest

from environments.base import TURN_SEPARATOR, split_worked
from environments.checks import bad_completions, harder_stats, task_fingerprint
from environments.registry import entry_point, get_env, list_envs
from tests.environments import plugin_pkg


def _project_envs() -> list[str]:
    # The pip-installed test plugin (with deliberately broken verifiers) is tested on its own.
    return [n for n in list_envs() if getattr(entry_point(n).dist, "name", None) != plugin_pkg.DIST]


ENVS = _project_envs()


def _levels(env) -> list[int]:
    return sorted({env.min_difficulty, env.max_difficulty})


def test_every_issue_environment_is_registered():
    expected = {
        "arith_multidigit", "expr_eval", "word_problems", "algebra_symbolic", "science_mcq",
        "code_function_synthesis", "code_stdio_algorithms", "code_output_prediction", "scicode_numerical",
        "tool_db_workflow", "function_call_args", "interactive_deduction", "shell_fs_tasks", "repo_repair",
        "ifeval_constraints", "schema_extraction", "needle_variable_tracking", "graphwalks_bfs",
        "grid_constraint_puzzles", "graph_algorithms", "automata_simulation", "logic_deduction",
        "sort_and_sequence_ops",
    }  # fmt: skip
    assert len(expected) == 23
    assert expected <= set(ENVS), sorted(expected - set(ENVS))


@pytest.mark.parametrize("name", ENVS)
def test_same_seed_same_task(name):
    env = get_env(name)
    for d in _levels(env):
        tasks = [env.generate(seed, d) for seed in range(3)]
        assert [task_fingerprint(t) for t in tasks] == [task_fingerprint(env.generate(s, d)) for s in range(3)]
        assert len({repr(task_fingerprint(t)[3:]) for t in tasks}) > 1, "different seeds should give different tasks"
        assert all(t.env == name and t.difficulty == d for t in tasks)


@pytest.mark.parametrize("name", ENVS)
def test_reference_solution_scores_one(name):
    env = get_env(name)
    for d in _levels(env):
        for seed in (0, 1):
            task = env.generate(seed, d)
            score = env.score(task, env.reference_solution(task))
            assert score.reward == 1.0 and score.accuracy, (task.id, score)


@pytest.mark.parametrize("name", ENVS)
def test_empty_garbage_hedged_and_wrong_answers_score_zero(name):
    env = get_env(name)
    for d in sorted({env.min_difficulty, (env.min_difficulty + env.max_difficulty) // 2}):
        task = env.generate(0, d)
        bad = bad_completions(env, task)
        assert any(label.startswith("bad[") for label, _ in bad), "needs at least one known-bad answer"
        for label, completion in bad:
            score = env.score(task, completion)
            assert score.reward == 0.0 and not score.accuracy, (task.id, label, completion[:200])


@pytest.mark.parametrize("name", ENVS)
def test_each_difficulty_level_is_harder_by_a_task_stat(name):
    env = get_env(name)
    for d in range(env.min_difficulty, env.max_difficulty):
        assert harder_stats(env, d, seeds=[0, 1, 2, 3]), f"{name}: D={d + 1} is not harder than D={d} by any stat"


@pytest.mark.parametrize("name", ENVS)
def test_worked_solution_is_a_usable_sft_target(name):
    env = get_env(name)
    task = env.generate(0, env.min_difficulty)
    prompt, worked = split_worked(task, env.worked_solution(task))
    assert env.worked_solution(task).startswith(task.prompt)
    assert worked.strip() and task.prompt not in worked
    if env.multi_turn:
        # The transcript carries every reference turn.
        assert all(turn.strip() in worked for turn in env.reference_turns(task))
    else:
        assert TURN_SEPARATOR not in worked
        assert env.score(task, worked).reward == 1.0, "the worked solution should end in a correct answer"


def _fingerprints(names: list[str]) -> dict[str, str]:
    import hashlib

    out = {}
    for name in names:
        env = get_env(name)
        tasks = [env.generate(s, d) for d in _levels(env) for s in (0, 1)]
        out[name] = hashlib.sha256(repr([task_fingerprint(t) for t in tasks]).encode()).hexdigest()
    return out


@pytest.fixture(scope="module")
def other_process_fingerprints() -> dict[str, str]:
    """Task fingerprints computed in another interpreter with a different hash seed."""
    import json
    import os
    import subprocess
    import sys

    code = (
        "import json, sys\nfrom tests.environments.test_all_envs import _fingerprints\n"
        "print(json.dumps(_fingerprints(json.loads(sys.argv[1]))))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    res = subprocess.run([sys.executable, "-c", code, json.dumps(ENVS)], capture_output=True, text=True, env=env,
                         cwd=root, timeout=300)  # fmt: skip
    assert res.returncode == 0, res.stderr[-2000:]
    return json.loads(res.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", ENVS)
def test_same_seed_same_task_across_processes(name, other_process_fingerprints):
    """Generation must not depend on the process (string-hash randomisation, set order, global RNG)."""
    assert other_process_fingerprints[name] == _fingerprints([name])[name]
