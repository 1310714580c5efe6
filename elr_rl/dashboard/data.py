"""Read a run directory into the JSON the dashboard page draws (format: elr_rl/metrics.py).

Every reader here tolerates a run that is still being written or is broken:
a missing file is "no data yet", a half-written line is left for the next
poll, an unreadable parquet file becomes a message. Messages are plain
sentences for the page; nothing here raises on bad run contents.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from curriculum.passrates import PROFILE_COLUMNS  # the profiler's columns, shown first in this order
from elr_rl.metrics import (
    CONFIG_FILE,
    METRICS_FILE,
    PROFILE_DIR,
    ROUTING_FILE,
    SAMPLES_FILE,
    canonical_row,
    read_jsonl,
    to_json_value,
)

HIST_BINS = 20
"""Bins over [0, 1] for routing-score, q and pass-rate histograms."""
CURRICULUM_STATE = "curriculum/state.json"
"""The curriculum service's state (live pass-rate counts per prompt and k), rewritten atomically."""
MAX_RUN_DEPTH = 3
"""How deep below a folder of runs to look for run directories."""


def _message(level: str, text: str) -> dict[str, str]:
    return {"level": level, "text": text}


def profile_files(run_dir: Path) -> list[Path]:
    """Profile tables, oldest first by modification time (then name); the last one is the current profile.

    Only `profile/*.parquet`: the profiler's `{name}.parts/` and `{name}.samples/` folders are not tables.
    """
    folder = run_dir / PROFILE_DIR
    if not folder.is_dir():
        return []
    stamped = []
    for p in folder.glob("*.parquet"):
        try:
            stamped.append((p.stat().st_mtime_ns, p.name, p))
        except FileNotFoundError:  # renamed away between glob and stat
            continue
    return [p for _, _, p in sorted(stamped)]


def run_status(run_dir: Path) -> dict[str, Any]:
    """What the run directory holds now, plus messages for anything missing.

    `signature` changes whenever a profile table or the config changes, so the
    page re-fetches those only then.
    """
    run_dir = Path(run_dir)
    messages: list[dict[str, str]] = []
    if not run_dir.exists():
        messages.append(_message(
            "error", f"Run directory {str(run_dir)!r} does not exist (yet). "
            "Check the path; the page keeps polling and shows the run once it appears."))
        return {"run_dir": str(run_dir), "exists": False, "messages": messages, "signature": "missing"}
    if not run_dir.is_dir():
        messages.append(_message("error", f"{str(run_dir)!r} is a file, not a run directory."))
        return {"run_dir": str(run_dir), "exists": False, "messages": messages, "signature": "not-a-dir"}
    metrics = run_dir / METRICS_FILE
    runs = [] if is_run_dir(run_dir) else list_runs(run_dir)
    if runs:
        messages.append(_message("info", f"{str(run_dir)!r} is a folder of {len(runs)} runs: pick one below."))
    elif not metrics.is_file():
        messages.append(_message(
            "warning", f"No {METRICS_FILE} in this run directory yet: the run has not logged a step."))
    profiles = profile_files(run_dir)
    sig_parts = []
    for p in profiles:
        try:
            st = p.stat()
        except FileNotFoundError:
            continue
        sig_parts.append(f"{p.name}:{st.st_mtime_ns}:{st.st_size}")
    config = run_dir / CONFIG_FILE
    if config.is_file():
        sig_parts.append(f"config:{config.stat().st_mtime_ns}")
    return {
        "run_dir": str(run_dir),
        "exists": True,
        "name": run_dir.resolve().name,
        "has_metrics": metrics.is_file(),
        "has_routing": (run_dir / ROUTING_FILE).is_file(),
        "profile_files": [p.name for p in profiles],
        "has_config": config.is_file(),
        "runs": runs,
        "messages": messages,
        "signature": "|".join(sig_parts),
        "passrate_signature": _mtime(run_dir / CURRICULUM_STATE),
    }


def _mtime(path: Path) -> str:
    try:
        return str(path.stat().st_mtime_ns)
    except OSError:
        return ""


def load_metrics(run_dir: Path, offset: int = 0) -> dict[str, Any]:
    """Metric rows appended since byte `offset` (rows without an integer step are dropped)."""
    chunk = read_jsonl(Path(run_dir) / METRICS_FILE, offset)
    rows = []
    dropped = chunk.skipped
    for row in chunk.rows:
        step = row.get("step")
        if isinstance(step, bool) or not isinstance(step, (int, float)) or not math.isfinite(step):
            dropped += 1
            continue
        rows.append(to_json_value(canonical_row(row)))  # old RL names read as the current scheme
    messages = []
    if dropped:
        messages.append(_message("warning", f"{METRICS_FILE}: skipped {dropped} line(s) that are not metric rows."))
    return {"rows": rows, "offset": chunk.next_offset, "reset": chunk.reset, "messages": messages}


def histogram(values: list[Any], bins: int = HIST_BINS) -> list[int]:
    """Counts of `values` in `bins` equal bins over [0, 1]; bin i holds [i/bins, (i+1)/bins), 1.0 goes last."""
    counts = [0] * bins
    for v in values:
        if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
            counts[min(bins - 1, max(0, int(v * bins)))] += 1
    return counts


def routing_histograms(record: dict[str, Any], bins: int = HIST_BINS) -> dict[str, Any] | None:
    """One routing.jsonl record as histograms per loop count: `{step, edges, score: {k: counts}, q, pass_rate, n}`.

    Accepts the raw form (`"k": {k: {"score": [...], ...}}`) and the binned
    form (`"hist": {"edges": [...], "score": {k: counts}}`); None if neither.
    """
    step = record.get("step")
    if not isinstance(step, (int, float)) or isinstance(step, bool):
        return None
    out: dict[str, Any] = {"step": step, "score": {}, "q": {}, "pass_rate": {}, "n": {}}
    if isinstance(record.get("k"), dict):
        out["edges"] = [i / bins for i in range(bins + 1)]
        for k, fields in record["k"].items():
            if not isinstance(fields, dict):
                continue
            for name in ("score", "q", "pass_rate"):
                if isinstance(fields.get(name), list):
                    out[name][str(k)] = histogram(fields[name], bins)
            sizes = [len(v) for v in fields.values() if isinstance(v, list)]
            out["n"][str(k)] = max(sizes, default=0)
        return out
    hist = record.get("hist")
    if isinstance(hist, dict) and isinstance(hist.get("edges"), list):
        out["edges"] = to_json_value(hist["edges"])
        for name in ("score", "q", "pass_rate"):
            if isinstance(hist.get(name), dict):
                out[name] = {str(k): to_json_value(c) for k, c in hist[name].items() if isinstance(c, list)}
        for k, counts in out["score"].items():
            out["n"][k] = int(sum(c for c in counts if isinstance(c, (int, float))))
        return out
    return None


def load_routing(run_dir: Path, offset: int = 0) -> dict[str, Any]:
    """Routing records appended since byte `offset`, as histograms."""
    chunk = read_jsonl(Path(run_dir) / ROUTING_FILE, offset)
    records, dropped = [], chunk.skipped
    for row in chunk.rows:
        hist = routing_histograms(row)
        if hist is None:
            dropped += 1
        else:
            records.append(hist)
    messages = []
    if dropped:
        messages.append(_message("warning", f"{ROUTING_FILE}: skipped {dropped} line(s) that are not routing records."))
    return {"records": records, "offset": chunk.next_offset, "reset": chunk.reset, "messages": messages}


def load_profile(run_dir: Path) -> dict[str, Any]:
    """The newest readable profile table, column-oriented: `{file, columns, data: {col: [...]}, messages}`."""
    import pyarrow.parquet as pq  # pyarrow comes with `datasets`

    files = profile_files(Path(run_dir))
    messages: list[dict[str, str]] = []
    if not files:
        messages.append(_message("info", f"No {PROFILE_DIR}/*.parquet pass-rate table in this run yet."))
        return {"file": None, "columns": [], "data": {}, "messages": messages}
    for path in reversed(files):
        try:
            table = pq.read_table(path)
        except Exception as exc:  # a table still being written or a corrupt file: say so, try the older one
            messages.append(_message("warning", f"{PROFILE_DIR}/{path.name} could not be read "
                                     f"(still being written or corrupt): {type(exc).__name__}: {exc}"))
            continue
        names = table.column_names
        columns = [c for c in PROFILE_COLUMNS if c in names] + [c for c in names if c not in PROFILE_COLUMNS]
        missing = [c for c in ("env", "k", "pass_rate") if c not in names]
        if missing:
            messages.append(_message("warning", f"{PROFILE_DIR}/{path.name} lacks columns {missing}: "
                                     "the pass-rate panels need them."))
        data = {c: to_json_value(table.column(c).to_pylist()) for c in columns}
        return {"file": path.name, "columns": columns, "data": data, "rows": table.num_rows, "messages": messages}
    return {"file": None, "columns": [], "data": {}, "messages": messages}


def load_config_text(run_dir: Path, limit: int = 200_000) -> dict[str, Any]:
    """The run's config.yaml as text (shown verbatim), or a note that there is none."""
    path = Path(run_dir) / CONFIG_FILE
    if not path.is_file():
        return {"text": None, "messages": [_message("info", f"No {CONFIG_FILE} in this run directory.")]}
    text = path.read_text(encoding="utf-8", errors="replace")
    return {"text": text[:limit], "messages": []}


def snapshot(run_dir: Path) -> dict[str, Any]:
    """Everything the page shows, in one object (the static export inlines it)."""
    run_dir = Path(run_dir)
    profile = load_profile(run_dir)
    return {
        "status": run_status(run_dir),
        "metrics": load_metrics(run_dir),
        "routing": load_routing(run_dir),
        "profile": profile,
        "passrates": load_passrates(run_dir, profile),
        "samples": load_samples(run_dir),
        "config": load_config_text(run_dir),
    }


def is_run_dir(path: Path) -> bool:
    """A run directory holds metrics.jsonl or a profile table."""
    return (path / METRICS_FILE).is_file() or bool(profile_files(path))


def list_runs(root: Path, depth: int = MAX_RUN_DEPTH) -> list[str]:
    """Run directories at or below `root` (up to `depth` levels), as paths relative to it ("." for root itself).

    A folder such as runs/quickstart holds several runs (pretrain, sft, rl): the page lists them.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    found: list[str] = []

    def walk(folder: Path, level: int) -> None:
        if is_run_dir(folder):
            found.append(folder.relative_to(root).as_posix() or ".")
        if level >= depth:
            return
        try:
            children = sorted(p for p in folder.iterdir() if p.is_dir() and not p.name.startswith("."))
        except OSError:
            return
        for child in children:
            if child.name in ("tensorboard", "profile", "curriculum") or child.name.startswith("step_"):
                continue  # a run's own folders and checkpoints hold no runs
            walk(child, level + 1)

    walk(root, 0)
    return found


def resolve_run(root: Path, name: str | None) -> Path:
    """The run directory `name` (relative to `root`, as `list_runs` gives it); None or "" is root itself.

    Raises ValueError for a name outside `root` (the page only ever sends listed names).
    """
    root = Path(root)
    if not name or name == ".":
        return root
    path = (root / name).resolve()
    if root.resolve() not in path.parents:
        raise ValueError(f"run {name!r} is not inside {str(root)!r}")
    return path


def load_samples(run_dir: Path, offset: int = 0) -> dict[str, Any]:
    """Sample completions (rollouts.jsonl) appended since byte `offset`; old runs' `text` reads as `completion`."""
    chunk = read_jsonl(Path(run_dir) / SAMPLES_FILE, offset)
    rows = []
    for row in chunk.rows:
        if "completion" not in row and "text" in row:
            row["completion"] = row.pop("text")
        rows.append(to_json_value(row))
    messages = []
    if chunk.skipped:
        messages.append(_message("warning", f"{SAMPLES_FILE}: skipped {chunk.skipped} line(s) that are not samples."))
    return {"rows": rows, "offset": chunk.next_offset, "reset": chunk.reset, "messages": messages}


def _profile_counts(profile: dict[str, Any]) -> dict[tuple[str, int], tuple[str, float, float]]:
    """(prompt_id, k) -> (env, samples, successes) of a column-oriented profile table."""
    d = profile.get("data") or {}
    need = ("prompt_id", "env", "k", "samples", "successes")
    if not all(c in d for c in need):
        return {}
    out = {}
    for pid, env, k, n, s in zip(*(d[c] for c in need)):
        if isinstance(k, (int, float)) and isinstance(n, (int, float)) and isinstance(s, (int, float)):
            out[(str(pid), int(k))] = (str(env), float(n), float(s))
    return out


def load_passrates(run_dir: Path, profile: dict[str, Any] | None = None) -> dict[str, Any]:
    """The current pass rate of every (prompt, k) the run trains on: `{source, env, k, pass_rate, samples}`.

    The profile table is the starting point; the curriculum's live counts
    (curriculum/state.json: samples and successes per prompt and k since the run
    started) are added to it. Only environments the curriculum has routed are kept
    once live counts exist, so an environment profiled but not trained on drops out.
    """
    import json

    run_dir = Path(run_dir)
    profile = profile if profile is not None else load_profile(run_dir)
    counts = _profile_counts(profile)
    live: dict[str, list] = {}
    path = run_dir / CURRICULUM_STATE
    messages: list[dict[str, str]] = []
    if path.is_file():
        try:
            state = json.loads(path.read_text())
            live = state.get("tracker", {}).get("per_k", {})
        except (OSError, ValueError, AttributeError) as exc:
            messages.append(_message("warning", f"{CURRICULUM_STATE} could not be read: {exc}"))
    merged = dict(counts)
    envs_live = set()
    for key, pair in live.items():
        pid, _, k = key.rpartition("|")
        if not pid or not k.isdigit() or not isinstance(pair, list) or len(pair) != 2:
            continue
        env = counts.get((pid, int(k)), (pid.split("/")[0], 0.0, 0.0))[0]
        envs_live.add(env)
        _, n0, s0 = merged.get((pid, int(k)), (env, 0.0, 0.0))
        merged[(pid, int(k))] = (env, n0 + float(pair[0]), s0 + float(pair[1]))
    cols: dict[str, list] = {"env": [], "k": [], "pass_rate": [], "samples": []}
    for (_, k), (env, n, s) in sorted(merged.items()):
        if n <= 0 or (envs_live and env not in envs_live):
            continue
        cols["env"].append(env)
        cols["k"].append(k)
        cols["pass_rate"].append(s / n)
        cols["samples"].append(n)
    source = "live" if envs_live else ("profile" if counts else None)
    return {"source": source, "file": profile.get("file"), "data": cols, "messages": messages}
