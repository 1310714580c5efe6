"""`elr-rl envs list | sample | check` and the worked-solution corpus."""

from __future__ import annotations

import subprocess
import sys

from environments import cli
from environments.corpus import render_corpus
from environments.registry import get_env


def test_envs_list_shows_every_environment(capsys):
    assert cli.main(["list"]) == 0
    out = capsys.readouterr().out
    for name in ("arith_multidigit", "code_function_synthesis", "repo_repair", "shell_fs_tasks"):
        assert name in out


def test_envs_sample_is_deterministic_and_shows_solutions(capsys):
    assert cli.main(["sample", "interactive_deduction", "--difficulty", "3", "-n", "2", "--seed", "4", "--solution"]) == 0
    first = capsys.readouterr().out
    assert cli.main(["sample", "interactive_deduction", "--difficulty", "3", "-n", "2", "--seed", "4", "--solution"]) == 0
    assert capsys.readouterr().out == first
    assert first.count("=== interactive_deduction/d3/") == 2 and "--- worked solution ---" in first


def test_envs_check_prints_a_table_and_passes(capsys):
    assert cli.main(["check", "tool_db_workflow", "code_function_synthesis", "--seeds", "1", "--difficulties", "2"]) == 0
    out = capsys.readouterr().out
    assert "reference=1" in out and "D+1 harder" in out and "seconds" in out
    assert "tool_db_workflow" in out and "2 environments checked" in out


def test_envs_check_unknown_name_is_a_clear_error(capsys):
    assert cli.main(["check", "no_such_env"]) == 2
    err = capsys.readouterr().err
    assert "unknown environment 'no_such_env'" in err and "registered environments:" in err


def test_elr_rl_entry_point_dispatches_to_envs():
    res = subprocess.run([sys.executable, "-m", "elr_rl.cli", "envs", "list"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0 and "code_stdio_algorithms" in res.stdout


def test_render_corpus_pairs_prompts_with_worked_solutions():
    names = ["arith_multidigit", "repo_repair", "code_function_synthesis"]
    records = list(render_corpus(names, n=2, difficulties=[1, 2], seed=7))
    assert len(records) == 3 * 2 * 2
    assert records == list(render_corpus(names, n=2, difficulties=[1, 2], seed=7))  # deterministic
    for r in records:
        assert r["text"] == r["prompt"] + "\n\n" + r["response"]
        assert r["prompt"] not in r["response"] and r["response"].strip()
    # A single-turn response ends in an answer its environment scores 1.0.
    rec = next(r for r in records if r["env"] == "code_function_synthesis")
    env = get_env("code_function_synthesis")
    seed, d = int(rec["id"].split("/s")[1]), int(rec["id"].split("/d")[1].split("/")[0])
    assert env.score(env.generate(seed, d), rec["response"]).reward == 1.0
