"""Dataset environments: the user's files (parquet, jsonl, json, csv, a saved `datasets` folder) as
an environment, with a named verifier (environments/verifiers.py). No code needed:

    envs:
      - {name: gsm8k, data: data/gsm8k_train.parquet, prompt_key: question, answer_key: answer,
         answer_regex: "####\\s*(.+)$", verifier: math}

A row's task seed is a 63-bit hash of its content (prompt, answer, difficulty), so prompt ids
(`gsm8k/d1/s<hash>`), pass-rate tables, the curriculum and checkpoints survive reordering the
file, adding rows and resuming. Bad rows (a null or non-string prompt, an answer the verifier
cannot use) are an error naming the file, the row and the column, raised when the dataset is
loaded (before any engine starts), or with `on_bad_row: skip` they are skipped and counted.
Scoring needs only the task (its answer and row travel inside it): scoring processes never
read the files.
"""

from __future__ import annotations

import glob
import hashlib
import json
import logging
import os
import re
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Optional

from environments.base import ANSWER_INSTRUCTION, Environment, Score, Task, extract_answer

log = logging.getLogger(__name__)

_BUILDERS = {".parquet": "parquet", ".jsonl": "json", ".json": "json", ".csv": "csv"}
SEED_BITS = 63


@dataclass
class DatasetSpec:
    """One dataset environment, as written in an `envs` entry (a mapping with a `data` key)."""

    name: str
    """Environment name (prompt ids are `name/d<difficulty>/s<row hash>`); must not be a registered one."""
    data: Any = None
    """A file, a glob, a list of files (parquet, jsonl, json, csv: one kind) or a `save_to_disk` folder; a relative
    path is taken from the working directory where the spec is registered (the RL driver's), and kept absolute
    for the processes that read the rows (Ray actors run in working directories of their own)."""
    split: str = "train"
    """Split of a saved DatasetDict folder (files are one split: point `data` at the held-out file instead)."""
    prompt_key: str = "prompt"
    """Column holding the prompt text."""
    answer_key: str = "answer"
    """Column holding what the verifier checks against (an answer, a pattern, a schema, tests)."""
    verifier: str = "math"
    """math, exact, regex, json_schema, code_tests, or a user function module:function."""
    system_prompt: Optional[str] = None
    """Text put before every prompt of this dataset (e.g. an instruction on the answer format)."""
    difficulty_key: Optional[str] = None
    """Integer column giving each row's difficulty (None: every row has difficulty 1)."""
    response_key: Optional[str] = None
    """Column holding a full solution: the SFT target, and the reference response of `envs check`."""
    answer_regex: Optional[str] = None
    """Regex whose first group extracts the answer from the answer column (GSM8K: `####\\s*(.+)$`); `$` ends a
    line and `.` stops at a newline (start the pattern with `(?s)` to let it cross lines)."""
    answer_tag: bool = True
    """True: the prompt asks for <answer>...</answer> and only that span is checked; False: the whole
    completion goes to the verifier (math-verify then finds the last \\boxed{} or stated answer)."""
    on_bad_row: str = "error"
    """error: a bad row stops the run with its file, row and column; skip: skip it and count it."""
    max_rows: Optional[int] = None
    """Use at most this many rows (the lowest row hashes: a stable subset)."""
    weight: Optional[float] = None
    """Share of this source in an RL or profile prompt pool, relative to the other entries' weights."""
    score_timeout_s: float = 10.0
    """Seconds one scoring may take in the scoring pool before it counts as reward 0 (error flagged)."""
    max_concurrency: int = 8
    """Scoring jobs of this dataset that may run at once in the scoring pool."""

    def validate(self) -> None:
        where = f"dataset environment {self.name!r}"
        if not re.fullmatch(r"[A-Za-z0-9_.-]+", self.name or ""):
            raise ValueError(f"{where}: name must be letters, digits, _ . - (it is part of every prompt id)")
        if not self.data:
            raise ValueError(f"{where}: set data to a file, a glob, a list of files or a saved dataset folder")
        if self.on_bad_row not in ("error", "skip"):
            raise ValueError(f"{where}: on_bad_row must be error or skip, got {self.on_bad_row!r}")
        from environments.verifiers import VERIFIERS

        if self.verifier not in VERIFIERS and ":" not in self.verifier:
            raise ValueError(f"{where}: unknown verifier {self.verifier!r}: use one of {sorted(VERIFIERS)} "
                             "or a user function module:function")
        if self.weight is not None and self.weight <= 0:
            raise ValueError(f"{where}: weight must be > 0, got {self.weight}")
        if self.answer_regex is not None:
            try:
                if re.compile(self.answer_regex).groups < 1:
                    raise ValueError(f"{where}: answer_regex needs one (group) around the answer")
            except re.error as exc:
                raise ValueError(f"{where}: answer_regex is not a regular expression ({exc})") from None

    @classmethod
    def from_mapping(cls, entry: dict[str, Any]) -> "DatasetSpec":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(entry) - known)
        if unknown:
            raise ValueError(f"dataset environment {entry.get('name')!r}: unknown keys {unknown}; "
                             f"known keys: {sorted(known)}")
        if "name" not in entry:
            raise ValueError(f"a dataset environment entry needs a name: {entry}")
        spec = cls(**entry)
        if isinstance(spec.data, (list, tuple)):
            spec.data = [os.path.abspath(str(p)) for p in spec.data]
        elif spec.data is not None:
            spec.data = os.path.abspath(str(spec.data))
        spec.validate()
        return spec

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class Row:
    """One usable row: where it came from and what a task is made of."""

    seed: int
    difficulty: int
    prompt: str
    expected: Any  # the verifier's prepared form of the answer column
    answer_text: str  # the answer column after answer_regex
    response: Optional[str]
    columns: dict[str, Any] = field(default_factory=dict)
    file: str = ""
    index: int = 0


@dataclass
class LoadReport:
    """What loading a dataset found."""

    rows: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows skipped
    duplicates: int = 0
    first_skipped: list[str] = field(default_factory=list)  # "file row N column C: why"


def row_seed(prompt: str, answer: str, difficulty: int) -> int:
    """A 63-bit hash of a row's content (stable across files, orders and processes)."""
    blob = json.dumps([prompt, answer, difficulty], ensure_ascii=False).encode("utf-8")
    return int.from_bytes(hashlib.sha256(blob).digest()[:8], "big") & ((1 << SEED_BITS) - 1)


def data_files(spec: DatasetSpec) -> list[str]:
    """The files (or the one saved-dataset folder) `spec.data` names; ValueError if none exist."""
    items = spec.data if isinstance(spec.data, list) else [spec.data]
    out: list[str] = []
    for item in map(str, items):
        matches = sorted(glob.glob(item)) if any(c in item for c in "*?[") else [item]
        if not matches or not all(Path(m).exists() for m in matches):
            raise ValueError(f"dataset environment {spec.name!r}: data {item!r} does not exist")
        out.extend(matches)
    dirs = [p for p in out if Path(p).is_dir()]
    if dirs and len(out) > 1:
        raise ValueError(f"dataset environment {spec.name!r}: give one saved dataset folder or files, not both")
    if not dirs:
        kinds = {_BUILDERS.get(Path(p).suffix.lower()) for p in out}
        if None in kinds or len(kinds) != 1:
            raise ValueError(f"dataset environment {spec.name!r}: use files of one kind among "
                             f"{sorted(_BUILDERS)} (got {[Path(p).name for p in out]})")
    return out


def _read_tables(spec: DatasetSpec) -> list[tuple[str, Any]]:
    """(file label, datasets.Dataset) per file, read through `datasets` (never the hub)."""
    import datasets

    paths = data_files(spec)
    if Path(paths[0]).is_dir():
        ds = datasets.load_from_disk(paths[0])
        if isinstance(ds, datasets.DatasetDict):
            if spec.split not in ds:
                raise ValueError(f"dataset environment {spec.name!r}: {paths[0]} has splits {sorted(ds)}, "
                                 f"not {spec.split!r}: set split")
            ds = ds[spec.split]
        return [(paths[0], ds)]
    builder = _BUILDERS[Path(paths[0]).suffix.lower()]
    out = []
    for p in paths:
        try:
            out.append((p, datasets.load_dataset(builder, data_files=[p], split="train", **_csv_as_text(builder, p))))
        except Exception as exc:  # an unreadable or empty file: say which
            raise ValueError(f"dataset environment {spec.name!r}: cannot read {p} ({type(exc).__name__}: "
                             f"{str(exc)[:200]})") from None
    return out


def _csv_as_text(builder: str, path: str) -> dict[str, Any]:
    """A CSV's columns read as the text they are: inferred types would turn an answer "2" into "2.0" in a
    column with an empty cell, and "007" into "7", before an exact verifier sees them."""
    if builder != "csv":
        return {}
    import csv

    import datasets

    with open(path, newline="", encoding="utf-8", errors="replace") as f:
        header = next(csv.reader(f), [])
    return {"features": datasets.Features({name: datasets.Value("string") for name in header})} if header else {}


def _check_columns(spec: DatasetSpec, label: str, columns: list[str]) -> None:
    need = {"prompt_key": spec.prompt_key, "answer_key": spec.answer_key}
    if spec.difficulty_key:
        need["difficulty_key"] = spec.difficulty_key
    if spec.response_key:
        need["response_key"] = spec.response_key
    for key, col in need.items():
        if col not in columns:
            raise ValueError(f"dataset environment {spec.name!r}: {label} has no column {col!r} ({key}); "
                             f"its columns are {columns}")


def load_rows(spec: DatasetSpec, verifier: Any) -> tuple[dict[int, Row], LoadReport]:
    """seed -> Row for every usable row, and a report of what was skipped."""
    report, rows = LoadReport(), {}
    tables = _read_tables(spec)
    # MULTILINE: `$` ends a line; no DOTALL, so `(.+)` stops at the line's end (`(?s)` in the pattern turns it on)
    answer_re = re.compile(spec.answer_regex, re.MULTILINE) if spec.answer_regex else None
    for label, table in tables:
        _check_columns(spec, label, list(table.column_names))
        for index, record in enumerate(table):
            try:
                row = _make_row(spec, verifier, answer_re, record, label, index)
            except _BadRow as bad:
                msg = f"{label} row {index} column {bad.column!r}: {bad.why}"
                if spec.on_bad_row == "error":
                    raise ValueError(f"dataset environment {spec.name!r}: {msg} (fix the row, or set "
                                     "on_bad_row: skip to skip and count such rows)") from None
                report.skipped[bad.reason] = report.skipped.get(bad.reason, 0) + 1
                if len(report.first_skipped) < 5:
                    report.first_skipped.append(msg)
                continue
            if row.seed in rows:
                report.duplicates += 1
                continue
            rows[row.seed] = row
    if spec.max_rows is not None:
        rows = {s: rows[s] for s in sorted(rows)[: spec.max_rows]}
    report.rows = len(rows)
    if not rows:
        where = ", ".join(label for label, _ in tables)
        raise ValueError(f"dataset environment {spec.name!r}: no usable rows in {where}"
                         + (f" (skipped: {report.skipped}; first: {report.first_skipped[:2]})" if report.skipped else ""))
    if report.skipped or report.duplicates:
        log.warning("dataset %s: %d rows, skipped %s, %d duplicate rows kept once", spec.name, report.rows,
                    report.skipped, report.duplicates)
    return rows, report


class _BadRow(Exception):
    def __init__(self, column: str, reason: str, why: str) -> None:
        super().__init__(why)
        self.column, self.reason, self.why = column, reason, why


def _text(record: dict[str, Any], column: str) -> str:
    value = record.get(column)
    if value is None:
        raise _BadRow(column, "null", "is null")
    if not isinstance(value, str):
        raise _BadRow(column, "not_string", f"is {type(value).__name__}, not a string")
    if not value.strip():
        raise _BadRow(column, "empty", "is empty")
    return value


def _make_row(spec: DatasetSpec, verifier: Any, answer_re: re.Pattern | None, record: dict[str, Any],
              label: str, index: int) -> Row:
    prompt = _text(record, spec.prompt_key)
    raw = record.get(spec.answer_key)
    if raw is None:
        raise _BadRow(spec.answer_key, "null", "is null")
    answer = raw if isinstance(raw, str) else json.dumps(raw, sort_keys=True, default=str)
    if answer_re is not None:
        m = answer_re.search(answer)
        found = (m.group(1) if answer_re.groups else m.group(0)) if m else None
        if not found or not found.strip():  # no match, or an optional group that took no part in it
            raise _BadRow(spec.answer_key, "answer_regex", f"answer_regex {spec.answer_regex!r} finds nothing")
        answer = found.strip()
    try:
        # numbers become text ("72"); lists and mappings (tests, schemas) reach the verifier as they are
        expected = verifier.prepare(raw if isinstance(raw, (dict, list)) and answer_re is None else answer)
    except (ValueError, TypeError) as exc:
        raise _BadRow(spec.answer_key, "verifier", f"the {spec.verifier} verifier cannot use it: {exc}") from None
    difficulty = 1
    if spec.difficulty_key:
        d = record.get(spec.difficulty_key)
        try:
            text = str(d).strip().removeprefix("Level ").strip()  # MATH's "Level 3"
            number = float(text)  # 3.0: a numeric column with nulls is read as floats
            if not number.is_integer():
                raise ValueError(text)
            difficulty = int(number)
        except (TypeError, ValueError, OverflowError):
            raise _BadRow(spec.difficulty_key, "difficulty", f"is {d!r}, not an integer") from None
        if difficulty < 1:
            raise _BadRow(spec.difficulty_key, "difficulty", f"is {difficulty}, difficulties start at 1")
    response = _text(record, spec.response_key) if spec.response_key else None
    columns = {k: v for k, v in record.items() if k != spec.response_key}
    return Row(row_seed(prompt, answer, difficulty), difficulty, prompt, expected, answer, response, columns,
               label, index)


class DatasetEnvironment(Environment):
    """Tasks are rows (seed = row hash); scoring runs the spec's verifier on the answer span.

    `dataset_class(spec)` makes one subclass per spec so that class attributes (name,
    timeouts, concurrency) are what the registry and the scoring pool read.
    """

    spec: DatasetSpec
    domain = "dataset"

    def __init__(self) -> None:
        from environments.verifiers import make_verifier

        self.verifier = make_verifier(self.spec.verifier, whole_completion=not self.spec.answer_tag)
        self._rows: dict[int, Row] | None = None
        self.report: LoadReport | None = None

    # -- rows (read on first use: scoring processes never need them) ----------
    @property
    def rows(self) -> dict[int, Row]:
        if self._rows is None:
            self._rows, self.report = load_rows(self.spec, self.verifier)
        return self._rows

    def prompt_keys(self) -> list[tuple[int, int]]:
        """(difficulty, seed) of every row, in row-hash order (independent of the file's order)."""
        return [(self.rows[s].difficulty, s) for s in sorted(self.rows)]

    def sft_pair(self, index: int) -> tuple[str, str]:
        """(prompt, response) of the index-th row (in row-hash order, cycling) for SFT. Where the prompt asks
        for <answer>...</answer> (answer_tag) and the solution has no such span (GSM8K's ends in `#### 72`),
        the row's answer follows it in one: SFT teaches the format the reward reads."""
        if not self.spec.response_key:
            raise ValueError(f"dataset environment {self.name!r}: SFT needs response_key (a solution column)")
        seeds = sorted(self.rows)
        row = self.rows[seeds[index % len(seeds)]]
        response = row.response or ""
        if self.spec.answer_tag and extract_answer(response) is None:
            response = f"{response.rstrip()}\n\n{self._wrap(row.answer_text)}" if response.strip() else \
                self._wrap(row.answer_text)
        return self._prompt_text(row), response, self.spec.system_prompt or None

    def _prompt_text(self, row: Row) -> str:
        parts = [row.prompt.strip()]  # the system prompt travels as Task.system (a chat system message)
        if self.spec.answer_tag:
            parts.append(ANSWER_INSTRUCTION)
        return "\n\n".join(parts)

    # -- the Environment API ---------------------------------------------------
    def check_difficulty(self, difficulty: int) -> None:
        levels = {r.difficulty for r in self.rows.values()}
        if difficulty not in levels:
            raise ValueError(f"{self.name}: no row has difficulty {difficulty} (rows have {sorted(levels)})")

    def generate(self, seed: int, difficulty: int) -> Task:
        row = self.rows.get(int(seed))
        if row is None:
            raise ValueError(f"{self.name}: seed {seed} is not the hash of a row of {self.spec.data} "
                             "(was the file changed since the pool or profile was made?)")
        if int(difficulty) != row.difficulty:
            raise ValueError(f"{self.name}: row {seed} has difficulty {row.difficulty}, not {difficulty}")
        hidden = {"expected": row.expected, "row": row.columns, "file": row.file, "index": row.index}
        return Task(self.name, row.seed, row.difficulty, self._prompt_text(row), row.answer_text, hidden,
                    {"prompt_chars": float(len(row.prompt))}, system=self.spec.system_prompt or None)

    def _generate(self, rng, seed, difficulty):  # pragma: no cover - generate() is overridden
        raise NotImplementedError

    def score(self, task: Task, completion: str) -> Score:
        if not isinstance(completion, str):
            return Score.zero(format=0.0)
        response = extract_answer(completion) if self.spec.answer_tag else completion
        if response is None:
            return Score.zero(format=0.0)
        try:
            result = self.verifier.verify(response, task.hidden["expected"], task.hidden["row"])
        except Exception as exc:  # untrusted text or a user verifier's bug: reward 0, flagged, never a crash
            return Score.zero(error=f"verifier {self.spec.verifier} raised {type(exc).__name__}: {exc}",
                              format=1.0, verifier_error=1.0)
        if isinstance(result, bool) or result in (0, 1):
            return Score.binary(bool(result), format=1.0)
        try:
            reward = float(result)
        except (TypeError, ValueError):
            return Score.zero(error=f"verifier {self.spec.verifier} returned {type(result).__name__}, "
                              "not a bool or a float in [0, 1]", format=1.0, verifier_error=1.0)
        if not 0.0 <= reward <= 1.0:
            return Score.zero(error=f"verifier {self.spec.verifier} returned {reward}, outside [0, 1]",
                              format=1.0, verifier_error=1.0)
        return Score(reward, reward == 1.0, {"accuracy": float(reward == 1.0), "format": 1.0})

    def _wrap(self, response: str) -> str:
        return f"<answer>{response}</answer>" if self.spec.answer_tag else response

    def reference_solution(self, task: Task) -> str:
        row = self.rows[task.seed]
        ref = self.verifier.reference(row.expected)
        if ref is None:
            if row.response is None:
                raise ValueError(f"{self.name}: the {self.spec.verifier} verifier has no reference answer; "
                                 "set response_key to a solution column")
            ref = extract_answer(row.response) or row.response
        return self._wrap(ref)

    def bad_answers(self, task: Task) -> list[str]:
        return [self._wrap(c) for c in self.verifier.counterfactuals(task.hidden["expected"])]

    def worked_response(self, task: Task) -> str:
        row = self.rows[task.seed]
        return row.response if row.response is not None else self.reference_solution(task)


def dataset_class(spec: DatasetSpec) -> type[DatasetEnvironment]:
    """A DatasetEnvironment subclass bound to `spec`."""
    return type(f"Dataset[{spec.name}]", (DatasetEnvironment,), {
        "name": spec.name, "spec": spec, "score_timeout_s": float(spec.score_timeout_s),
        "max_concurrency": int(spec.max_concurrency), "min_difficulty": 1, "max_difficulty": 10**6,
        "sandboxed": spec.verifier == "code_tests",  # the answer is a program run against the tests
        "__module__": __name__,
    })
