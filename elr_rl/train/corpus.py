"""Document sources for pretraining and SFT.

Every source answers `document(index, difficulty) -> Document` deterministically,
so a data cursor is just an integer and resume is exact. Three kinds:

* built-in procedural generators (a problem with a worked, step-by-step solution);
* registered environments (`env:<name>`, entry-point group `elr_rl.environments`):
  a generated task's prompt plus `Environment.worked_solution(task)`;
* local text / jsonl / json / parquet files read through `datasets` (never the hub).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np


@dataclass(frozen=True)
class Document:
    """One training document. Pretraining trains on prompt + response; SFT on the response only."""

    prompt: str
    response: str
    source: str = ""  # the generator, environment or files it came from (for per-source counts)
    system: str | None = None  # a system message (a dataset environment's system_prompt)
    steps: int = 0  # serial steps the task needs (ladder environments), for difficulty-aware loop sampling
    step_responses: tuple[str, ...] = ()  # the response after each step (the last is `response`), for loop_aux
    dense_targets: tuple[tuple[int, int, str], ...] = ()  # (prompt chars, depth, value), for loop_aux dense
    partial_targets: tuple[tuple[int, int, str], ...] = ()  # (prompt chars, loop, value), for loop_aux chain


class DocumentSource(Protocol):
    name: str

    def document(self, index: int, difficulty: int) -> Document:
        """The `index`-th document of this source at `difficulty` (deterministic)."""
        ...


# --- built-in procedural generators: small problems whose solutions are chains of steps ---


def gen_addition(rng: random.Random, difficulty: int) -> Document:
    """Multi-digit addition, solved column by column with carries (least significant first)."""
    n = 1 + difficulty
    a, b = rng.randrange(10 ** (n - 1), 10**n), rng.randrange(10 ** (n - 1), 10**n)
    steps, carry = [], 0
    for da, db in zip(reversed(str(a).zfill(n)), reversed(str(b).zfill(n))):
        s = int(da) + int(db) + carry
        steps.append(f"{da}+{db}+{carry}={s}")
        carry = s // 10
    return Document(f"Q: {a}+{b}=?\n", f"A: {' '.join(steps)}; so {a + b}\n")


def gen_sorting(rng: random.Random, difficulty: int) -> Document:
    """Sort a list of numbers; the worked solution picks the minimum one at a time."""
    xs = [rng.randrange(100) for _ in range(2 + 2 * difficulty)]
    order = sorted(range(len(xs)), key=lambda i: (xs[i], i))  # selection: where the next minimum sits
    steps = " ".join(f"{xs[i]}@{i}" for i in order)
    return Document(f"Q: sort {' '.join(map(str, xs))}\n", f"A: {steps}; so {' '.join(str(xs[i]) for i in order)}\n")


def gen_pointer_chase(rng: random.Random, difficulty: int) -> Document:
    """Follow a linked list for h hops; the worked solution lists every node visited."""
    names = rng.sample("abcdefghijklmnopqrstuvwxyz", 4 + 2 * difficulty)
    nxt = {n: rng.choice(names) for n in names}
    start, hops = rng.choice(names), 1 + difficulty
    path = [start]
    for _ in range(hops):
        path.append(nxt[path[-1]])
    edges = " ".join(f"{k}>{v}" for k, v in nxt.items())
    return Document(f"Q: {edges}; from {start} go {hops}\n", f"A: {'>'.join(path)}; so {path[-1]}\n")


def gen_counting(rng: random.Random, difficulty: int) -> Document:
    """Count a letter in a string, keeping a running count."""
    s = "".join(rng.choice("ab") for _ in range(4 + 4 * difficulty))
    c, run = 0, []
    for ch in s:
        c += ch == "a"
        run.append(str(c))
    return Document(f"Q: count a in {s}\n", f"A: {' '.join(run)}; so {c}\n")


GENERATORS: dict[str, Callable[[random.Random, int], Document]] = {
    "addition": gen_addition,
    "sorting": gen_sorting,
    "pointer_chase": gen_pointer_chase,
    "counting": gen_counting,
}


@dataclass
class GeneratorSource:
    """A built-in generator as a DocumentSource."""

    name: str
    seed: int

    def document(self, index: int, difficulty: int) -> Document:
        rng = random.Random(f"{self.name}:{self.seed}:{index}:{difficulty}")
        return GENERATORS[self.name](rng, difficulty)


class EnvironmentSource:
    """Worked solutions of a registered environment (`environments.registry`, entry-point group
    `elr_rl.environments`): the task's prompt, then the environment's worked response."""

    def __init__(self, env_name: str, seed: int, wrong_answer_fraction: float = 0.0) -> None:
        from environments.registry import get_env, resolve_envs

        try:  # a name, or the YAML file of a dataset environment (env:data/gsm8k.yaml)
            env_name = resolve_envs([env_name])[0]
            self.env = get_env(env_name)
        except ValueError as exc:
            raise ValueError(
                f"config field `data.generators`: {exc}; built-in generators: {sorted(GENERATORS)}"
            ) from None
        self.name, self.seed = f"env:{env_name}", seed
        self.wrong_answer_fraction = wrong_answer_fraction

    def document(self, index: int, difficulty: int) -> Document:
        if hasattr(self.env, "sft_pair"):  # a dataset environment: its prompt and response_key columns
            prompt, response, system = self.env.sft_pair(index)
            return Document(prompt, response, system=system)
        lo, hi = self.env.min_difficulty, self.env.max_difficulty
        second = False
        if self.wrong_answer_fraction:  # documents 2i and 2i + 1 share a task (MixedSource pairs them)
            index, second = divmod(index, 2)
        task = self.env.generate(seed=self.seed * 1_000_003 + index, difficulty=min(max(difficulty, lo), hi))
        wrong = second and random.Random(f"{self.seed}:{index}").random() < 2 * self.wrong_answer_fraction
        return task_document(self.env, task, self.env.bad_answers(task)[0] if wrong else None)  # wrong: scores 0


def task_document(env, task, response: str | None = None) -> Document:
    """A generated task as an SFT document: its prompt and the environment's worked response (or
    `response`); a ladder task answered correctly also carries its per-step and dense targets."""
    from environments.base import split_worked
    from environments.ladder.base import LadderEnvironment

    prompt, worked = split_worked(task, env.worked_solution(task))
    response = worked if response is None else response
    # Rendered by the chat template as a user turn and an assistant turn, exactly as rollouts render
    # prompts (elr_rl.text), so no newline padding on either side.
    doc = Document(prompt.rstrip("\n"), response.strip("\n"))
    if isinstance(env, LadderEnvironment) and response == env.reference_solution(task):
        n = env.steps_needed(task)  # per-step targets for loop_aux and difficulty-aware sampling
        doc = replace(doc, steps=n, step_responses=tuple(env.step_solution(task, s) for s in range(1, n + 1)),
                      dense_targets=tuple(env.dense_targets(task)),
                      partial_targets=tuple(env.partial_targets(task)))
    return doc


_BUILDERS = {".txt": "text", ".jsonl": "json", ".json": "json", ".parquet": "parquet"}


def check_jsonl_rows(path: str | Path, fields: list[str]) -> None:
    """Every line of a JSON-lines file is an object holding `fields` as strings; else a ValueError naming file and line."""
    if Path(path).suffix != ".jsonl":
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for lineno, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise ValueError(f"config field `data.files`: {path} line {lineno} is not valid JSON ({exc}); "
                                 "fix or remove that row") from None
            if not isinstance(row, dict):
                raise ValueError(f"config field `data.files`: {path} line {lineno} is a {type(row).__name__}, "
                                 "not a JSON object; write one object per line")
            bad = [k for k in fields if not isinstance(row.get(k), str)]
            if bad:
                raise ValueError(f"config field `data.files`: {path} line {lineno} has no text in {bad} "
                                 f"(keys: {sorted(row)[:8]}); fix the row or set the field names in data")


def check_text_columns(rows: Any, fields: list[str], paths: list[str], nonempty: bool) -> None:
    """Every row holds text in `fields` (and, with `nonempty`, not an empty string: an SFT row without a prompt
    would be trained as plain text, one without a response on nothing); else a ValueError naming the column,
    how many rows and the first."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = rows.data.table if hasattr(rows.data, "table") else rows.data
    for field in fields:
        col = table.column(field)
        if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_null(col.type)):
            raise ValueError(f"config field `data.files`: column {field!r} of {paths} holds {col.type}, not text; "
                             "point the field at a text column or convert it")
        bad = pc.is_null(col)
        if nonempty:
            bad = pc.or_(bad, pc.equal(pc.utf8_length(col), 0)) if not pa.types.is_null(col.type) else bad
        count = int(pc.sum(pc.cast(pc.fill_null(bad, True), pa.int64())).as_py() or 0)
        if count:
            first = int(pc.index(pc.fill_null(bad, True), True).as_py())
            what = "null or empty" if nonempty else "null"
            raise ValueError(f"config field `data.files`: {count} row(s) of {paths} have a {what} {field!r} "
                             f"(the first: row {first}); fix or remove them")


class FileSource:
    """Rows of local files through `datasets`, visited in a fresh permutation every epoch."""

    def __init__(self, paths: list[str], stage: str, text_field: str, prompt_field: str, response_field: str,
                 seed: int) -> None:
        import datasets

        exts = {Path(p).suffix for p in paths}
        if len(exts) != 1 or next(iter(exts)) not in _BUILDERS:
            raise ValueError(f"config field `data.files`: use files of one type among {sorted(_BUILDERS)}, got {sorted(exts)}")
        builder = _BUILDERS[exts.pop()]
        need = [text_field] if stage == "pretrain" else [prompt_field, response_field]
        if builder == "json":  # a bad row is named by file and line here, not deep inside `datasets`
            for path in paths:
                check_jsonl_rows(path, need)
        self.rows = datasets.load_dataset(builder, data_files=[str(p) for p in paths], split="train")
        if builder == "text":
            need = ["text"] if stage == "pretrain" else need
            text_field = "text"
        missing = [c for c in need if c not in self.rows.column_names]
        if missing:
            raise ValueError(
                f"config field `data.{'text_field' if stage == 'pretrain' else 'prompt_field'}`: columns {missing} "
                f"not in {paths}; the files have {self.rows.column_names}"
            )
        if len(self.rows) == 0:
            raise ValueError(f"config field `data.files`: {paths} hold no rows")
        if builder != "text":  # .json / .parquet rows skip check_jsonl_rows: a null would become the text "None"
            check_text_columns(self.rows, need, paths, nonempty=stage != "pretrain")
        self.stage, self.seed, self.name = stage, seed, "files"
        self.text_field, self.prompt_field, self.response_field = text_field, prompt_field, response_field

    def document(self, index: int, difficulty: int) -> Document:
        n = len(self.rows)
        epoch, pos = divmod(index, n)
        row = self.rows[int(np.random.default_rng([self.seed, epoch]).permutation(n)[pos])]
        if self.stage == "pretrain":
            return Document("", str(row[self.text_field]))
        return Document(str(row[self.prompt_field]), str(row[self.response_field]))


class MixedSource:
    """Document j: from the files with probability `file_weight`, else from a uniformly chosen generator.

    The choice and the difficulty are pure functions of (seed, j).
    """

    def __init__(self, generators: list[DocumentSource], files: FileSource | None, file_weight: float,
                 min_difficulty: int, max_difficulty: int, seed: int, pair_documents: bool = False) -> None:
        self.generators, self.files = generators, files
        self.pair_documents = pair_documents  # documents 2i, 2i + 1 from the same source and difficulty
        self.file_weight = file_weight if (files is not None and generators) else (1.0 if files else 0.0)
        self.lo, self.hi, self.seed = min_difficulty, max_difficulty, seed

    def document(self, index: int) -> Document:
        rng = np.random.default_rng([self.seed, index // 2 if self.pair_documents else index, 7])
        use_file = rng.random() < self.file_weight
        difficulty = int(rng.integers(self.lo, self.hi + 1))
        if use_file:
            assert self.files is not None
            src = self.files
        else:
            src = self.generators[int(rng.integers(len(self.generators)))]
        return replace(src.document(index, difficulty), source=src.name)

    def sample_by_source(self, n: int) -> dict[str, list[Document]]:
        """n documents of every source (difficulties cycling over the range), for pre-flight checks."""
        sources = [*self.generators, *([self.files] if self.files is not None else [])]
        span = self.hi - self.lo + 1
        return {src.name: [replace(src.document(i, self.lo + i % span), source=src.name) for i in range(n)]
                for src in sources}


def build_source(data_cfg, stage: str, heldout: bool = False) -> MixedSource:
    """The document stream a DataConfig describes; held-out uses a disjoint seed."""
    seed = data_cfg.seed + (1_000_003 if heldout else 0)
    gens: list[DocumentSource] = []
    for name in data_cfg.generators:
        if name.startswith("env:"):
            gens.append(EnvironmentSource(name[4:], seed, data_cfg.env_wrong_answer_fraction))
        elif name in GENERATORS:
            gens.append(GeneratorSource(name, seed))
        else:
            raise ValueError(
                f"config field `data.generators`: unknown generator {name!r}; use one of {sorted(GENERATORS)} "
                "or env:<registered environment>"
            )
    files = None
    if data_cfg.files:
        files = FileSource(list(data_cfg.files), stage, data_cfg.text_field, data_cfg.prompt_field,
                           data_cfg.response_field, seed)
    return MixedSource(gens, files, data_cfg.file_weight, data_cfg.min_difficulty, data_cfg.max_difficulty, seed,
                       pair_documents=data_cfg.env_wrong_answer_fraction > 0)
