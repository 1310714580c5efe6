"""Environment-specific checks of the 16 single-turn environments in environments/single/.

The generic golden checks (every registered environment) live in test_all_envs.py;
here each environment is also probed where its checker could be gamed or too strict.
"""

from __future__ import annotations

import contextlib
import io
import itertools
import json
import random

import pytest

from environments.base import Score, Task
from environments.registry import get_env
from environments.single._common import parse_expanded_poly, parse_number, parse_poly, wrap

SINGLE = [
    "arith_multidigit",
    "expr_eval",
    "word_problems",
    "algebra_symbolic",
    "science_mcq",
    "code_output_prediction",
    "function_call_args",
    "ifeval_constraints",
    "schema_extraction",
    "needle_variable_tracking",
    "graphwalks_bfs",
    "grid_constraint_puzzles",
    "graph_algorithms",
    "automata_simulation",
    "logic_deduction",
    "sort_and_sequence_ops",
]
SEEDS = range(6)
LEVELS = (1, 2, 5, 10)

HOSTILE = [
    "",
    "no tags at all",
    "<answer></answer>",
    "<answer>   </answer>",
    "<answer>qzx garbage 123!? {]</answer>",
    "<answer>" + "9" * 5000 + "</answer>",
    "<answer>" + "[" * 5000 + "]" * 5000 + "</answer>",
    "<answer>(x+y+z+w)^40 * (a+b+c)^40</answer>",
    "<answer>__import__('os').system('true')</answer>",
    '<answer>{"name": null, "arguments": []}</answer>',
    "<answer>\u00e9\u4e2d\ud83d\ude00 \x00\x01</answer>",
    "<answer>1/0</answer>",
    "<answer>" + "a" * 30_000 + "</answer>",
]


def span(completion: str) -> str:
    return completion.split("<answer>", 1)[1].rsplit("</answer>", 1)[0]


@pytest.mark.parametrize("name", SINGLE)
def test_golden(name: str) -> None:
    """Same seed same task; reference 1.0; bad, hostile and hedged answers 0.0; a repeated answer still counts."""
    env = get_env(name)
    for d, seed in itertools.product(LEVELS, SEEDS):
        task = env.generate(seed, d)
        assert task == env.generate(seed, d)
        ref = env.reference_solution(task)
        score = env.score(task, ref)
        assert isinstance(score, Score) and score.reward == 1.0 and score.accuracy, (task.id, ref)
        assert env.score(task, f"thinking...\n{ref}\nso again {ref}").reward == 1.0  # same answer twice is fine
        bads = env.bad_answers(task)
        assert bads, task.id
        for bad in bads + HOSTILE + [ref + wrap("qzx-other")]:
            s = env.score(task, bad)
            assert s.reward == 0.0 and not s.accuracy, (task.id, bad[:200])
        worked = env.worked_solution(task)
        assert worked.startswith(task.prompt) and worked.endswith(ref)
        assert worked.isascii()  # byte-level models: one byte per character
        json.dumps([task.answer, task.hidden, task.stats])  # tasks travel to scoring workers and logs
        assert "<answer>" in task.prompt and span(ref).strip() not in ("", task.prompt.strip())


@pytest.mark.parametrize("name", SINGLE)
def test_difficulty_grows(name: str) -> None:
    """Per seed, every stat is non-decreasing in D and at least one grows strictly at each step."""
    env = get_env(name)
    for seed in range(4):
        stats = [env.generate(seed, d).stats for d in range(1, 11)]
        for lo, hi in zip(stats, stats[1:]):
            assert lo.keys() == hi.keys()
            assert all(hi[k] >= lo[k] for k in lo) and any(hi[k] > lo[k] for k in lo), (seed, lo, hi)


@pytest.mark.parametrize("name", SINGLE)
def test_low_difficulty_is_small(name: str) -> None:
    """D=1 texts stay short for a tiny byte-level model; D=10 texts are longer on average."""
    env = get_env(name)
    low = [len(env.worked_solution(env.generate(s, 1))) for s in SEEDS]
    high = [len(env.worked_solution(env.generate(s, 10))) for s in SEEDS]
    assert max(low) < 1300, max(low)
    assert sum(high) > sum(low)


def test_score_never_raises_on_random_text() -> None:
    rng = random.Random(0)
    alphabet = '0123456789+-*/^()[]{}",:. xyzabcr=->#\n'
    for name in SINGLE:
        env = get_env(name)
        task = env.generate(3, 4)
        for _ in range(40):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 60)))
            assert env.score(task, wrap(text)).reward in (0.0, 1.0)


# ---------------------------------------------------------------- math


def test_arith_formats() -> None:
    env = get_env("arith_multidigit")
    task = env.generate(0, 6)  # addsub
    a = task.answer
    assert env.score(task, wrap(f" {a} ")).reward == 1.0
    assert env.score(task, wrap(f"{a}.5")).reward == 0.0
    div = env.generate(2, 5)
    q, r = div.answer
    assert div.hidden["nums"][0] == q * div.hidden["nums"][1] + r and 0 <= r < div.hidden["nums"][1]
    assert env.score(div, wrap(f"{q}R{r}")).reward == 1.0
    assert env.score(div, wrap(f"{q}")).reward == 0.0


def test_expr_eval_exact_and_not_echo() -> None:
    env = get_env("expr_eval")
    for seed in range(0, 30, 3):  # the "frac" kind
        task = env.generate(seed, 6)
        value = parse_number(task.answer)
        if value.denominator in (1, 2, 4, 5, 8):
            assert env.score(task, wrap(str(float(value)))).reward == 1.0  # exact decimal is the same number
        assert env.score(task, wrap(f"{value.numerator * 3}/{value.denominator * 3}")).reward == 1.0
        assert env.score(task, wrap(task.hidden["expr"])).reward == 0.0  # echoing the expression
    mod = env.generate(1, 7)
    assert 0 <= mod.answer < mod.hidden["p"]
    pm = env.generate(2, 7)
    assert pm.answer == pow(pm.hidden["a"], pm.hidden["b"], pm.hidden["m"])


def test_algebra_expanded_form_and_equivalence() -> None:
    env = get_env("algebra_symbolic")
    task = env.generate(1, 3)  # expand
    poly = parse_poly(task.answer)
    terms = task.answer.replace(" - ", " + -").split(" + ")
    assert env.score(task, wrap(" + ".join(reversed(terms)))).reward == 1.0  # any term order
    assert env.score(task, wrap(task.hidden["factored"])).reward == 0.0  # the prompt echoed
    assert env.score(task, wrap(task.answer + " + x - x")).reward == 0.0  # like terms not combined
    assert parse_expanded_poly("3*x*x + 2x") == parse_poly("x(3x+2)")
    with pytest.raises(ValueError):
        parse_expanded_poly("x(3x+2)")
    assert poly == parse_poly(task.hidden["factored"])
    lin = env.generate(0, 7)  # a 3x3 linear system
    pairs = [p.strip() for p in env.answer_text(lin).split(",")]
    assert env.score(lin, wrap(", ".join(reversed(pairs)))).reward == 1.0
    assert env.score(lin, wrap(", ".join(pairs[:-1]))).reward == 0.0
    assert env.score(lin, wrap(", ".join(pairs + pairs[-1:]))).reward == 0.0  # a variable twice
    deriv = env.generate(2, 4)
    assert env.score(deriv, wrap(deriv.hidden["poly"])).reward == 0.0


def test_science_mcq_letter_forms() -> None:
    env = get_env("science_mcq")
    task = env.generate(5, 8)
    letter = task.answer
    for form in (letter, letter.lower(), f"({letter})", f"{letter}."):
        assert env.score(task, wrap(form)).reward == 1.0
    other = next(c for c in "ABCD" if c != letter)
    assert env.score(task, wrap(f"{letter} or {other}")).reward == 0.0
    assert f"{letter}) " in task.prompt and task.stats["options"] == 6


def test_word_problem_distractors_present() -> None:
    env = get_env("word_problems")
    task = env.generate(4, 8)
    assert task.stats == {"steps": 8, "distractors": 4}
    assert int(task.hidden["lines"][-1].split("=")[-1]) == task.answer


# ---------------------------------------------------------------- code, tools, structured output


def test_code_output_matches_python() -> None:
    """Our interpreter agrees with CPython on the programs we generate (trusted code, not model text)."""
    env = get_env("code_output_prediction")
    for d, seed in itertools.product(range(1, 11), range(8)):
        task = env.generate(seed, d)
        buf = io.StringIO()
        with contextlib.redirect_stdout(buf):
            exec(task.hidden["code"], {})  # noqa: S102 - our own generated program
        assert buf.getvalue().rstrip("\n") == task.answer
    assert env.score(task, wrap(task.answer.replace("\n", "  \n") + "\n\n")).reward == 1.0


def test_function_call_schema_strict() -> None:
    env = get_env("function_call_args")
    task = env.generate(7, 9)
    name, args = task.answer["name"], task.answer["arguments"]
    shuffled = dict(reversed(list(args.items())))
    assert env.score(task, wrap(json.dumps({"arguments": shuffled, "name": name}))).reward == 1.0
    assert env.score(task, wrap(json.dumps({"name": name, "arguments": {**args, "extra": 1}}))).reward == 0.0
    assert env.score(task, wrap(json.dumps({"name": name, "arguments": args, "why": "x"}))).reward == 0.0
    for k, v in args.items():  # a value of the wrong JSON type is rejected even when it compares equal
        if type(v) is bool:
            assert env.score(task, wrap(json.dumps({"name": name, "arguments": {**args, k: int(v)}}))).reward == 0.0
        if type(v) is int:
            assert env.score(task, wrap(json.dumps({"name": name, "arguments": {**args, k: str(v)}}))).reward == 0.0
    assert task.stats["tools"] == 10 and task.prompt.count('{"name":"') == 10
    assert json.dumps(args) not in task.prompt


def test_schema_extraction_exact_keys() -> None:
    env = get_env("schema_extraction")
    for seed in range(3):
        task = env.generate(seed, 8)
        rec = task.answer
        assert env.score(task, wrap(json.dumps(dict(reversed(list(rec.items())))))).reward == 1.0
        assert env.score(task, wrap(json.dumps({**rec, "extra": 1}))).reward == 0.0
        assert env.score(task, wrap(json.dumps({k: v for k, v in rec.items() if k != "name"}))).reward == 0.0
        nested = next((k for k, v in rec.items() if isinstance(v, dict)), None)
        if nested:
            bad = {**rec, nested: {**rec[nested], "extra": "x"}}
            assert env.score(task, wrap(json.dumps(bad))).reward == 0.0
    assert any(isinstance(v, dict) for s in range(6) for v in env.generate(s, 10).answer.values())


def test_ifeval_each_rule_is_enforced() -> None:
    env = get_env("ifeval_constraints")
    for seed in range(10):
        task = env.generate(seed, 10)
        cons = task.hidden["constraints"]
        assert len(cons) == 11 and cons[0] == {"kind": "kw", "word": task.hidden["topic"]}
        assert len(env.bad_answers(task)) >= len(cons) - 1  # almost every rule has a violating variant
        s = env.score(task, env.bad_answers(task)[0])
        assert 0.0 < s.components["constraints_frac"] < 1.0 and s.reward == 0.0


# ---------------------------------------------------------------- long context


def test_needle_distractor_values_score_zero() -> None:
    env = get_env("needle_variable_tracking")
    task = env.generate(1, 6)
    assert task.stats["filler_lines"] == 72 and len(task.hidden["trace"]) == 7
    assert env.score(task, wrap(str(task.answer + 2))).reward == 0.0


def test_graphwalks_set_semantics() -> None:
    env = get_env("graphwalks_bfs")
    for seed in range(4):
        task = env.generate(seed, 7)
        assert env.score(task, wrap(", ".join(reversed(task.answer)))).reward == 1.0
        extra = env.score(task, env.bad_answers(task)[0])
        assert extra.reward == 0.0 and 0.0 < extra.components["f1"] < 1.0


# ---------------------------------------------------------------- logic and algorithms


def test_grid_puzzles_accept_any_valid_grid_and_reject_clue_echo() -> None:
    env = get_env("grid_constraint_puzzles")
    task = env.generate(0, 8)  # a 9x9 sudoku
    sol = task.answer
    assert env.score(task, wrap("\n".join("".join(map(str, row)) for row in sol))).reward == 1.0
    echo = "\n".join(" ".join(str(v) if v else "." for v in row) for row in task.hidden["puzzle"])
    assert env.score(task, wrap(echo)).reward == 0.0
    # With every cell blank, a relabelled solution is another valid grid and must be accepted.
    open_task = Task(
        task.env,
        task.seed,
        task.difficulty,
        task.prompt,
        sol,
        {**task.hidden, "puzzle": [[0] * 9 for _ in range(9)]},
        task.stats,
    )
    relabel = [[v % 9 + 1 for v in row] for row in sol]
    assert env.score(open_task, wrap("\n".join(" ".join(map(str, r)) for r in relabel))).reward == 1.0
    assert env.score(task, wrap("\n".join(" ".join(map(str, r)) for r in relabel))).reward == 0.0  # clues broken
    fut = env.generate(1, 9)
    assert fut.hidden["kind"] == "futoshiki" and fut.hidden["n"] == 7 and fut.stats["blanks"] == 36
    assert env.score(fut, wrap(echo)).reward == 0.0


def test_shortest_path_optimality() -> None:
    env = get_env("graph_algorithms")
    checked_longer = 0
    for seed in range(0, 40, 4):  # the shortest_path kind
        task = env.generate(seed, 6)
        paths = env._simple_paths(task, limit=500)
        weight = {frozenset((u, v)): w for u, v, w in task.hidden["edges"]}
        for p in paths:
            nodes = p.split(" -> ")
            cost = sum(
                weight[frozenset(("ABCDEFGHIJKLMNOP".index(a), "ABCDEFGHIJKLMNOP".index(b)))]
                for a, b in zip(nodes, nodes[1:])
            )
            expect = 1.0 if cost == task.hidden["best"] else 0.0
            checked_longer += expect == 0.0
            assert env.score(task, wrap(p)).reward == expect, (p, cost, task.hidden["best"])
            assert env.score(task, wrap(p.replace(" -> ", ", "))).reward == expect
    assert checked_longer > 0  # some valid-but-longer paths were seen and scored 0


def test_topological_orders_all_accepted() -> None:
    env = get_env("graph_algorithms")
    task = env.generate(1, 3)  # topo_order on 6 nodes
    n, edges = task.hidden["n"], task.hidden["edges"]
    labels = "ABCDEFGHIJKLMNOP"[:n]
    seen = {True: 0, False: 0}
    for perm in itertools.permutations(range(n)):
        pos = {v: i for i, v in enumerate(perm)}
        ok = all(pos[u] < pos[v] for u, v in edges)
        seen[ok] += 1
        assert env.score(task, wrap(", ".join(labels[i] for i in perm))).reward == float(ok)
    assert seen[True] >= 1 and seen[False] > 0


def test_automata_known_patterns() -> None:
    from environments.single.automata_simulation import eca_step, life_step, run_register

    assert eca_step("0001000", 90) == "0010100"
    blinker = [".....", "..#..", "..#..", "..#..", "....."]
    assert life_step(blinker) == [".....", ".....", ".###.", ".....", "....."]
    assert life_step(life_step(blinker)) == blinker
    regs, lines = run_register([["inc", "a"], ["dec", "b"], ["jnz", "b", 1]], {"a": 0, "b": 3, "c": 0}, 100)
    assert regs == {"a": 3, "b": 0, "c": 0} and lines[-1].endswith("halted")


def test_logic_any_consistent_assignment_accepted() -> None:
    env = get_env("logic_deduction")
    for seed in (0, 1, 3, 4):  # knights, sat, knights, sat
        task = env.generate(seed, 3)
        names = task.hidden["names"]
        n_ok = 0
        for bits in itertools.product([False, True], repeat=len(names)):
            world = dict(zip(names, bits))
            ok = env._consistent(task, world)
            n_ok += ok
            assert env.score(task, wrap(env._render(task, world))).reward == float(ok)
        assert n_ok >= 1


def test_sort_and_sequence_ops_against_python() -> None:
    env = get_env("sort_and_sequence_ops")
    task = env.generate(0, 9)  # multikey sort
    assert len(task.answer) == 11
    perm = env.generate(1, 9)
    assert sorted(perm.answer) == sorted("ABCDEFGH")
    stack = env.generate(2, 9)
    assert env.score(stack, wrap(" , ".join(stack.answer))).reward == 1.0
    assert env.score(stack, wrap(", ".join(stack.answer[:-1]))).reward == 0.0


def test_zebra_any_consistent_arrangement_accepted() -> None:
    env = get_env("logic_deduction")
    task = env.generate(2, 4)  # zebra: 3 houses, 2 categories
    h = task.hidden
    assert h["kind"] == "zebra" and h["houses"] == 3
    n_ok = 0
    for rows in itertools.product(*(itertools.permutations(h["values"][c]) for c in h["cats"])):
        sol = {c: list(r) for c, r in zip(h["cats"], rows)}
        ok = env._consistent(task, sol)
        n_ok += ok
        assert env.score(task, wrap(env._render(task, sol))).reward == float(ok)
    assert n_ok >= 1
    lines = env.answer_text(task).splitlines()
    assert env.score(task, wrap("\n".join(reversed(lines)))).reward == 1.0  # house lines in any order
    assert env.score(task, wrap("\n".join(lines[:-1]))).reward == 0.0
