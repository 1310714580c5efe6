"""The depth ladder: golden checks, compact prompts, and per-step targets that follow the chain."""

from __future__ import annotations

import pytest

from environments.checks import check_env
from environments.ladder.automaton import MOVES
from environments.registry import get_env

LADDER = ["ladder_pointer", "ladder_binding", "ladder_automaton", "ladder_nested", "ladder_tail"]


@pytest.mark.parametrize("name", LADDER)
def test_golden_checks_pass(name):
    res = check_env(get_env(name), seeds=list(range(6)))
    assert res.ok, res.failures[:5]
    assert res.reference_ok == res.reference_total == 6 * 8


@pytest.mark.parametrize("name", LADDER)
def test_prompts_are_compact_and_answers_one_symbol(name):
    env = get_env(name)
    for d in (1, 8):
        for seed in range(20):
            task = env.generate(seed, d)
            assert len(task.prompt.encode()) <= 72 and "answer" not in task.prompt, task.prompt
            assert len(task.answer) == 1 and task.answer in env.alphabet


@pytest.mark.parametrize("name", LADDER)
def test_step_targets_end_in_the_answer_and_early_stops_score_zero(name):
    env = get_env(name)
    early_wrong = 0
    for seed in range(30):
        task = env.generate(seed, 5)
        steps = env.step_targets(task)
        assert len(steps) == env.steps_needed(task) == 5 and steps[-1] == task.answer
        assert env.score(task, env.step_solution(task, 5)).reward == 1.0
        for s in range(1, 5):
            if steps[s - 1] != task.answer:
                early_wrong += 1
                assert env.score(task, env.step_solution(task, s)).reward == 0.0
    assert early_wrong > 30  # intermediate states usually differ from the answer


def test_pointer_steps_follow_the_edges_in_the_prompt():
    env = get_env("ladder_pointer")
    task = env.generate(3, 6)
    edges = dict(e.split(">") for e in task.prompt.split(" from ")[0].split())
    node = task.prompt.split(" from ")[1].split()[0]
    for target in env.step_targets(task):
        node = edges[node]
        assert node == target


def test_binding_resolves_through_the_prompt_bindings():
    env = get_env("ladder_binding")
    for seed in range(10):
        task = env.generate(seed, 4)
        body, query = task.prompt.split("?")[0].rsplit(" ", 1)
        binds = dict(b.split("=") for b in body.split())
        x = query
        for target in env.step_targets(task):
            x = binds[x]
            assert x == target
        bound = set()
        for line in body.split():  # a program: every variable is bound before it is used
            var, rhs = line.split("=")
            assert rhs.isdigit() or rhs in bound, task.prompt
            bound.add(var)
        assert len(bound) == 8  # the chain and a distractor chain of the same length


def test_automaton_replays_the_moves():
    env = get_env("ladder_automaton")
    for seed in range(10):
        task = env.generate(seed, 7)
        words = task.prompt.split("?")[0].split()
        p, moves = int(words[1]), words[3]
        for m, target in zip(moves, env.step_targets(task)):
            p = MOVES[m](p)
            assert str(p) == target


def test_tail_follows_the_links_to_a_tail_past_decoys():
    env = get_env("ladder_tail")
    for seed in range(20):
        for D in (1, 3, 6):
            task = env.generate(seed, D)
            cells = task.prompt.removeprefix("tail ").removesuffix("?").split(" ")
            assert len({c[0] for c in cells}) == len(cells)  # every letter names one cell
            assert sum(c[1] == "0" for c in cells) >= 3  # the answer's tail and two decoys at least
            i = len(cells) - 1
            for target in env.step_targets(task):
                assert cells[i][1] != "0"
                i -= int(cells[i][1])
                assert i >= 0 and cells[i][0] == target
            assert cells[i][1] == "0" and cells[i][0] == task.answer


def _postfix_to_infix(text: str) -> str:
    """Our own evaluator of a postfix expression: its bracketed infix form."""
    stack = []
    for ch in text:
        if ch.isdigit():
            stack.append(ch)
        else:
            b, a = stack.pop(), stack.pop()
            stack.append(f"({a}{ch}{b})")
    assert len(stack) == 1, text
    return stack[0]


def test_nested_matches_python_arithmetic():
    env = get_env("ladder_nested")
    for seed in range(10):
        task = env.generate(seed, 6)
        expr = _postfix_to_infix(task.prompt.removesuffix("?"))
        assert expr.count("(") == 7 and expr.endswith("%3)")
        assert str(eval(expr)) == task.answer  # noqa: S307 (our own generated text, never model output)
        assert set(task.prompt) <= set("+-*%?0123456789") and len(task.prompt) == 1 + 2 * 6 + 3
