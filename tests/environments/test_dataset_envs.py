"""Dataset environments: loading, row hashes, bad input, verifiers, registry resolution (no engines)."""

from __future__ import annotations

import json

import pytest

from environments import registry
from environments.base import Score


@pytest.fixture()
def fresh_registry(monkeypatch):
    """Dataset registrations of one test stay in that test."""
    # setenv (not delenv) so that teardown removes what the test registers into the environment
    monkeypatch.setenv(registry.SPECS_ENV, "")
    registry.refresh()
    yield registry
    registry.refresh()


def write_parquet(path, rows):
    from datasets import Dataset

    Dataset.from_list(rows).to_parquet(str(path))
    return str(path)


MATH_ROWS = [
    {"question": "What is 50 + 5?", "answer": "55", "level": 1},
    {"question": "What is half of 3/2?", "answer": "\\frac{3}{4}", "level": 2},
    {"question": "What is 6 * 7?", "answer": "42", "level": 1},
]


def math_entry(path, **extra):
    return {"name": "tinymath", "data": path, "prompt_key": "question", "answer_key": "answer",
            "difficulty_key": "level", "verifier": "math", **extra}


def test_rows_are_keyed_by_content_hash_and_survive_reordering(tmp_path, fresh_registry):
    a = write_parquet(tmp_path / "a.parquet", MATH_ROWS)
    b = write_parquet(tmp_path / "b.parquet", list(reversed(MATH_ROWS)) + [MATH_ROWS[0]])  # reordered + duplicate
    from environments.dataset import DatasetSpec, dataset_class

    env_a = dataset_class(DatasetSpec.from_mapping(math_entry(a)))()
    env_b = dataset_class(DatasetSpec.from_mapping(math_entry(b)))()
    assert env_a.prompt_keys() == env_b.prompt_keys()  # same (difficulty, seed) list, in hash order
    assert len(env_a.prompt_keys()) == 3 and env_b.report.duplicates == 1
    for d, seed in env_a.prompt_keys():
        ta, tb = env_a.generate(seed, d), env_b.generate(seed, d)
        assert (ta.id, ta.prompt, ta.answer) == (tb.id, tb.prompt, tb.answer)
        assert 0 <= seed < 2**63 and "<answer>" in ta.prompt
    with pytest.raises(ValueError, match="not the hash of a row"):
        env_a.generate(12345, 1)


def test_equivalent_answer_forms_score_one_and_wrong_ones_zero(tmp_path, fresh_registry):
    path = write_parquet(tmp_path / "m.parquet", MATH_ROWS)
    [name] = registry.resolve_envs([math_entry(path)])
    env = registry.get_env(name)
    by_answer = {env.generate(s, d).answer: env.generate(s, d) for d, s in env.prompt_keys()}
    t55, t34 = by_answer["55"], by_answer["\\frac{3}{4}"]
    for good in ["55", "\\boxed{55}", "$55$", "55.0", "55 dollars", "x = 55", "$\\frac{110}{2}$"]:
        assert env.score(t55, f"so <answer>{good}</answer>").reward == 1.0, good
    for bad in ["56", "5 or 55", "55, 56", "qzx 55", "", "\\boxed{55} or \\boxed{56}"]:
        assert env.score(t55, f"<answer>{bad}</answer>").reward == 0.0, bad
    assert env.score(t55, "55").reward == 0.0  # no answer span: answer_tag is on
    for good in ["0.75", "3/4", "\\frac{6}{8}", "$\\dfrac{3}{4}$"]:
        assert env.score(t34, f"<answer>{good}</answer>").reward == 1.0, good
    assert env.score(t34, "<answer>0.7</answer>").reward == 0.0


def test_whole_completion_mode_and_answer_regex(tmp_path, fresh_registry):
    rows = [{"q": "Natalia sold 48 clips ...", "a": "She sold 48/2 = 24 in May.\n#### 72"}]
    path = write_parquet(tmp_path / "g.parquet", rows)
    [name] = registry.resolve_envs([{"name": "gsm", "data": path, "prompt_key": "q", "answer_key": "a",
                                     "answer_regex": r"####\s*(.+)$", "answer_tag": False}])
    env = registry.get_env(name)
    task = env.generate(env.prompt_keys()[0][1], 1)
    assert task.answer == "72" and "<answer>" not in task.prompt
    assert env.score(task, "48 + 24 = 72 clips. The answer is \\boxed{72}.").reward == 1.0
    assert env.score(task, "The answer is \\boxed{71}.").reward == 0.0


def test_answer_regex_reads_one_line_and_an_unmatched_optional_group_is_a_bad_row(tmp_path, fresh_registry):
    """`(.+)$` stops at the line's end (an explanation on the next line is not the answer); an optional group
    that took no part in the match is a counted bad row, not a crash."""
    rows = [{"q": "2 + 5?", "a": "Answer: 7\nExplanation: because"}, {"q": "1 + 1?", "a": "no marker here"},
            {"q": "3 + 3?", "a": "Answer: 6", "level": 2.0}]
    for row in rows[:2]:
        row["level"] = 1.0  # a numeric column with nulls elsewhere comes back as floats
    path = write_parquet(tmp_path / "r.parquet", rows)
    [name] = registry.resolve_envs([{"name": "lines", "data": path, "prompt_key": "q", "answer_key": "a",
                                     "difficulty_key": "level", "answer_regex": r"(?:Answer:\s*(.+)$)?",
                                     "on_bad_row": "skip"}])
    env = registry.get_env(name)
    answers = sorted((d, env.generate(s, d).answer) for d, s in env.prompt_keys())
    assert answers == [(1, "7"), (2, "6")]
    assert env.report.skipped == {"answer_regex": 1}


@pytest.mark.parametrize(
    "rows,entry,match",
    [
        ([], {}, "cannot read|no usable rows"),
        ([{"question": "q", "solution": "1"}], {}, r"no column 'answer' \(answer_key\)"),
        ([{"question": "q", "answer": "1"}, {"question": None, "answer": "2"}], {}, r"row 1 column 'question': is null"),
        ([{"question": 7, "answer": "1"}], {}, r"row 0 column 'question': is int, not a string"),
        ([{"question": "q", "answer": None}], {}, r"row 0 column 'answer': is null"),
        ([{"question": "q", "answer": "not a schema"}], {"verifier": "json_schema"}, r"row 0 column 'answer'"),
    ],
)
def test_bad_input_names_file_row_and_column(tmp_path, fresh_registry, rows, entry, match):
    path = tmp_path / "bad.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {"name": "bad", "data": str(path), "prompt_key": "question", **entry}
    with pytest.raises(ValueError, match=match) as info:
        registry.resolve_envs([spec])
        registry.get_env("bad").prompt_keys()
    assert "bad" in str(info.value)


def test_bad_rows_can_be_skipped_and_counted(tmp_path, fresh_registry):
    rows = [{"question": "q1", "answer": "1"}, {"question": None, "answer": "2"}, {"question": "q3", "answer": None}]
    path = write_parquet(tmp_path / "s.parquet", rows)
    registry.resolve_envs([{"name": "skippy", "data": path, "prompt_key": "question", "on_bad_row": "skip"}])
    env = registry.get_env("skippy")
    assert len(env.prompt_keys()) == 1
    assert env.report.skipped == {"null": 2} and "row 1 column 'question'" in env.report.first_skipped[0]


def test_config_mistakes_are_clear(tmp_path, fresh_registry):
    path = write_parquet(tmp_path / "m.parquet", MATH_ROWS)
    with pytest.raises(ValueError, match="unknown keys \\['promt_key'\\]"):
        registry.resolve_envs([{"name": "x", "data": path, "promt_key": "question"}])
    with pytest.raises(ValueError, match="unknown verifier 'maths'"):
        registry.resolve_envs([math_entry(path, verifier="maths")])
        registry.get_env("tinymath")
    with pytest.raises(ValueError, match="name of a registered environment"):
        registry.resolve_envs([math_entry(path, name="arith_multidigit")])
    with pytest.raises(ValueError, match="does not exist"):
        registry.resolve_envs([math_entry(str(tmp_path / "nope.parquet"))])
    with pytest.raises(ValueError, match="unknown environment 'no_such_env'"):
        registry.resolve_envs(["no_such_env"])


def test_specs_travel_to_spawned_processes(tmp_path, fresh_registry):
    """A scoring-pool worker (a spawned process) resolves the dataset by name and scores it."""
    from environments.pool import ScoringPool

    path = write_parquet(tmp_path / "m.parquet", MATH_ROWS)
    registry.resolve_envs(["even_odd", math_entry(path)])
    env = registry.get_env("tinymath")
    tasks = [env.generate(s, d) for d, s in env.prompt_keys()]
    with ScoringPool(num_workers=1) as pool:
        scores = pool.score_many([("tinymath", t, f"<answer>{t.answer}</answer>") for t in tasks]
                                 + [("tinymath", tasks[0], "<answer>-1</answer>")])
    assert [s.reward for s in scores] == [1.0, 1.0, 1.0, 0.0]


def user_verifier(response: str, expected: str, row: dict) -> float:
    """Used by the tests below: half credit for the right answer in lower case."""
    if response == expected:
        return 1.0
    if response.lower() == expected.lower():
        return 0.5
    if response == "raise":
        raise RuntimeError("user verifier bug")
    if response == "hang":
        while True:
            pass
    return 0.0


def test_user_function_verifier_in_the_pool(tmp_path, fresh_registry):
    from environments.pool import ScoringPool

    rows = [{"prompt": "Say HELLO", "answer": "HELLO"}]
    path = write_parquet(tmp_path / "u.parquet", rows)
    registry.resolve_envs([{"name": "shout", "data": path, "verifier": f"{__name__}:user_verifier",
                            "score_timeout_s": 8.0}])
    env = registry.get_env("shout")
    task = env.generate(env.prompt_keys()[0][1], 1)
    with ScoringPool(num_workers=1) as pool:
        good, half, wrong, raised, hung, after = pool.score_many(
            [("shout", task, f"<answer>{x}</answer>") for x in ["HELLO", "hello", "bye", "raise", "hang", "HELLO"]])
    assert (good.reward, half.reward, wrong.reward, after.reward) == (1.0, 0.5, 0.0, 1.0), after.error
    assert raised.reward == 0.0 and "user verifier bug" in raised.error and raised.components["verifier_error"] == 1.0
    assert hung.reward == 0.0 and "timed out" in hung.error


def test_regex_exact_and_json_schema_verifiers(tmp_path, fresh_registry):
    schema = json.dumps({"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
                         "additionalProperties": False})
    rows = [{"prompt": "p1", "answer": r"\d{3}-\d{4}", "kind": "regex"}]
    registry.resolve_envs([
        {"name": "rx", "data": write_parquet(tmp_path / "r.parquet", rows), "verifier": "regex"},
        {"name": "ex", "data": write_parquet(tmp_path / "e.parquet", [{"prompt": "p", "answer": "Paris  France"}]),
         "verifier": "exact"},
        {"name": "js", "data": write_parquet(tmp_path / "j.parquet", [{"prompt": "p", "answer": schema}]),
         "verifier": "json_schema"},
    ])
    score = lambda env, text: registry.get_env(env).score(  # noqa: E731
        registry.get_env(env).generate(registry.get_env(env).prompt_keys()[0][1], 1), f"<answer>{text}</answer>")
    assert score("rx", "555-1234").reward == 1.0 and score("rx", "555-12345").reward == 0.0
    assert score("ex", "Paris France").reward == 1.0 and score("ex", "Paris").reward == 0.0
    assert score("js", '{"n": 3}').reward == 1.0
    assert score("js", '{"n": "3"}').reward == 0.0 and score("js", '{"n": 3, "m": 1}').reward == 0.0
    assert score("js", "not json").reward == 0.0


def test_weighted_pool_mixes_sources_in_proportion(tmp_path, fresh_registry):
    from environments.sources import pool_keys, weighted_counts

    assert weighted_counts({"a": 100, "b": 10}, {"a": 1.0, "b": 1.0}) == {"a": 10, "b": 10}
    assert weighted_counts({"a": 100, "b": 10}, {"a": 3.0, "b": 1.0}) == {"a": 30, "b": 10}
    path = write_parquet(tmp_path / "m.parquet", MATH_ROWS)
    unweighted = pool_keys(["even_odd", math_entry(path)], [1], range(8))
    assert sum(e == "even_odd" for e, _, _ in unweighted) == 8 and sum(e == "tinymath" for e, _, _ in unweighted) == 3
    weighted = pool_keys([{"name": "even_odd", "weight": 2}, math_entry(path, weight=1)], [1], range(8))
    assert sum(e == "even_odd" for e, _, _ in weighted) == 6 and sum(e == "tinymath" for e, _, _ in weighted) == 3


def test_saved_dataset_folder_with_splits(tmp_path, fresh_registry):
    from datasets import Dataset, DatasetDict

    DatasetDict({"train": Dataset.from_list(MATH_ROWS[:2]), "test": Dataset.from_list(MATH_ROWS[2:])}).save_to_disk(
        str(tmp_path / "saved"))
    registry.resolve_envs([math_entry(str(tmp_path / "saved"), split="test", name="m_test")])
    assert len(registry.get_env("m_test").prompt_keys()) == 1
    with pytest.raises(ValueError, match="has splits \\['test', 'train'\\], not 'dev'"):
        registry.resolve_envs([math_entry(str(tmp_path / "saved"), split="dev", name="m_dev")])
        registry.get_env("m_dev").prompt_keys()


def test_score_is_total_on_any_text(tmp_path, fresh_registry):
    path = write_parquet(tmp_path / "m.parquet", MATH_ROWS)
    registry.resolve_envs([math_entry(path)])
    env = registry.get_env("tinymath")
    task = env.generate(*reversed(env.prompt_keys()[0]))
    for text in ["<answer>\ud800</answer>", "<answer>" + "(" * 5000 + "</answer>", "<answer>9^9^9^9^9</answer>",
                 "<answer>\\frac{1}{0}</answer>", None, "<answer>" + "1" * 100_000 + "</answer>"]:
        assert isinstance(env.score(task, text), Score)


def test_code_tests_run_in_the_sandbox_and_compare_in_the_parent(tmp_path, fresh_registry):
    rows = [
        {"prompt": "Read n, print n squared.", "answer": json.dumps({"inputs": ["3\n", "12\n"], "outputs": ["9", "144"]}),
         "solution": "n = int(input())\nprint(n * n)\n"},
        {"prompt": "Write add(a, b).", "answer": json.dumps({"fn_name": "add", "inputs": [[1, 2], [5, -5]], "outputs": [3, 0]}),
         "solution": "```python\ndef add(a, b):\n    return a + b\n```"},
    ]
    path = write_parquet(tmp_path / "c.parquet", rows)
    registry.resolve_envs([{"name": "tinycode", "data": path, "verifier": "code_tests", "response_key": "solution"}])
    env = registry.get_env("tinycode")
    for d, seed in env.prompt_keys():
        task = env.generate(seed, d)
        assert env.score(task, env.reference_solution(task)).reward == 1.0
        assert all(env.score(task, bad).reward == 0.0 for bad in env.bad_answers(task))
        # a program that prints the banner a naive checker would trust still fails
        assert env.score(task, "<answer>print('PASSED')\nimport sys; sys.exit(0)</answer>").reward == 0.0


def test_builtin_math_environments_share_the_math_checker():
    """One answer format means the same everywhere: 55 = 55.0 = $55$ = \\boxed{55}; hedges and wrong values are 0."""
    from environments.registry import get_env

    env = get_env("arith_multidigit")
    task = next(t for t in (env.generate(s, 2) for s in range(10)) if t.hidden["kind"] != "divmod")
    a = task.answer
    for good in [f"{a}", f"\\boxed{{{a}}}", f"${a}$", f"{a}.0", f"$\\boxed{{{a}}}$"]:
        assert env.score(task, f"<answer>{good}</answer>").reward == 1.0, good
    for bad in [f"{a + 1}", f"{a + 1} or {a}", f"{a}, {a + 1}", f"about {a}", f"{a}.5"]:
        assert env.score(task, f"<answer>{bad}</answer>").reward == 0.0, bad
    expr = get_env("expr_eval")
    frac = next(t for t in (expr.generate(s, 2) for s in range(40)) if t.hidden["kind"] == "frac" and "/" in str(
        expr.answer_text(t)))
    num, den = expr.answer_text(frac).split("/")
    assert expr.score(frac, f"<answer>\\frac{{{num}}}{{{den}}}</answer>").reward == 1.0
    words = get_env("word_problems").generate(0, 2)
    assert get_env("word_problems").score(words, f"<answer>{words.answer}.0</answer>").reward == 1.0


def never_right(response: str, expected: str, row: dict) -> bool:
    return False


def test_envs_check_reports_failing_rows_with_their_index(tmp_path, fresh_registry):
    from environments.checks import check_dataset

    path = write_parquet(tmp_path / "m.parquet", MATH_ROWS)
    registry.resolve_envs([math_entry(path), math_entry(path, name="broken", verifier=f"{__name__}:never_right")])
    good = check_dataset(registry.get_env("tinymath"))
    assert good.ok and good.reference_ok == 3 and good.bad_ok == good.bad_total > 3
    bad = check_dataset(registry.get_env("broken"))
    assert not bad.ok and bad.reference_ok == 0
    assert {f.split(":")[0] for f in bad.failures} == {f"{path} row {i}" for i in range(3)}


def test_sft_documents_come_from_the_response_column(tmp_path, fresh_registry):
    from elr_rl.train.corpus import EnvironmentSource

    rows = [dict(r, solution=f"work... <answer>{r['answer']}</answer>") for r in MATH_ROWS]
    path = write_parquet(tmp_path / "m.parquet", rows)
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(math_entry(path, response_key="solution")))  # JSON is YAML
    source = EnvironmentSource(str(spec).replace(".yaml", "") + ".yaml", seed=0)
    docs = [source.document(i, 1) for i in range(3)]
    assert source.name == "env:tinymath"
    assert {d.response for d in docs} == {r["solution"] for r in rows}
    assert all(d.prompt.startswith("What is") and "<answer>" in d.prompt for d in docs)

    # a solution without the answer span the prompt asks for (GSM8K's `#### 72`) gets the row's answer in one
    gsm = [{"q": "Natalia sold 48 clips ...", "a": "She sold 48/2 = 24 in May.\n#### 72"}]
    gpath = write_parquet(tmp_path / "g.parquet", gsm)
    [name] = registry.resolve_envs([{"name": "gsm8k_sft", "data": gpath, "prompt_key": "q", "answer_key": "a",
                                     "response_key": "a", "answer_regex": r"####\s*(.+)$"}])
    prompt, response, _ = registry.get_env(name).sft_pair(0)
    assert "<answer>" in prompt and response == "She sold 48/2 = 24 in May.\n#### 72\n\n<answer>72</answer>"


def test_system_prompt_is_a_chat_system_message_in_every_stage(tmp_path, fresh_registry):
    """A dataset's system_prompt is not glued to the user text: the chat template renders it as a
    system message, in rollouts/profile/eval (Task.system) and in SFT (Document.system)."""
    from elr_rl.text import TextCodec
    from elr_rl.train.corpus import EnvironmentSource
    from elr_rl.train.data import tokenize_document
    from environments.dataset import DatasetSpec, dataset_class

    rows = [dict(r, solution=f"<answer>{r['answer']}</answer>") for r in MATH_ROWS]
    path = write_parquet(tmp_path / "m.parquet", rows)
    entry = math_entry(path, system_prompt="You are terse.", response_key="solution")
    env = dataset_class(DatasetSpec.from_mapping(entry))()
    d, seed = env.prompt_keys()[0]
    task = env.generate(seed, d)
    assert task.system == "You are terse." and "terse" not in task.prompt
    codec = TextCodec.byte_level()
    assert codec.render_prompt(task.prompt, system=task.system) == f"<|bos|>system: You are terse.<|sep|>{task.prompt}<|sep|>"
    spec = tmp_path / "tiny.yaml"
    spec.write_text(json.dumps(entry))
    doc = EnvironmentSource(str(spec), seed=0).document(0, 1)
    ids, _ = tokenize_document(doc, codec, "sft")
    assert codec.tokenizer.decode(ids).startswith("<|bos|>system: You are terse.<|sep|>What is")


def test_csv_answers_keep_their_text(tmp_path, fresh_registry):
    """A CSV column with an empty cell is not read as floats: "2" stays "2" and "007" stays "007"."""
    path = tmp_path / "t.csv"
    path.write_text("q,a,level\nwhat is 1+1?,2,1\nwho?,,2\nbond?,007,1\n")
    [name] = registry.resolve_envs([{"name": "csvtext", "data": str(path), "prompt_key": "q", "answer_key": "a",
                                     "difficulty_key": "level", "verifier": "exact", "on_bad_row": "skip"}])
    env = registry.get_env(name)
    assert sorted(env.generate(s, d).answer for d, s in env.prompt_keys()) == ["007", "2"]
    assert env.report.skipped == {"null": 1}


def test_relative_data_paths_are_kept_absolute_for_other_working_directories(tmp_path, fresh_registry, monkeypatch):
    """Ray actors run in working directories of their own: a spec registered with a relative path carries
    the absolute one to them (through the environment), and its rows load from anywhere."""
    (tmp_path / "data").mkdir()
    write_parquet(tmp_path / "data" / "m.parquet", MATH_ROWS)
    monkeypatch.chdir(tmp_path)
    [name] = registry.resolve_envs([math_entry("data/m.parquet")])
    assert str(tmp_path / "data" / "m.parquet") in registry.os.environ[registry.SPECS_ENV]
    other = tmp_path / "elsewhere"
    other.mkdir()
    monkeypatch.chdir(other)
    registry.refresh()  # as a spawned actor: the specs come from the environment
    assert len(registry.get_env(name).prompt_keys()) == 3
