"""Pass-rate estimates per prompt: the profile table as a prior, refreshed by live rollouts.

Estimator (documented here because routing depends on it). Each prompt keeps
exponentially weighted pseudo-counts `(S, N)`:

    start:        S = p0 * w0,  N = w0        p0 = profiled pass rate (all k pooled,
                                              or one k); if never profiled, the pooled
                                              rate of its profiled group (the prompts
                                              of its environment and difficulty), or
                                              `prior_pass_rate` if none of those was;
                                              w0 = min(profile samples, prior_weight),
                                              or prior_weight
    each report:  S = gamma * S + successes,  N = gamma * N + samples
    estimate:     p = S / N

`gamma = live_decay` forgets old evidence (the profile included) geometrically
per report, so the estimate follows the learning policy instead of averaging
over its whole history; gamma = 1 is plain cumulative counting. Raw,
undecayed counts per (prompt, k) are kept beside it for dashboards.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

import numpy as np

# Columns of the profile table (one row per prompt and loop count). Shared with profile.py.
PROFILE_COLUMNS: tuple[str, ...] = (
    "prompt_id",
    "env",
    "difficulty",
    "seed",
    "k",
    "samples",
    "successes",
    "pass_rate",
    "mean_response_tokens",
)


@dataclass
class RolloutResult:
    """Outcome of one prompt's group of rollouts at loop count `k` (what `report` receives)."""

    prompt_id: str
    k: int
    samples: int
    successes: int
    reward_mean: float | None = None  # mean reward of the group (dashboards only)
    response_tokens_mean: float | None = None  # mean completion length in tokens (dashboards only)

    def __post_init__(self) -> None:
        if self.samples <= 0 or not 0 <= self.successes <= self.samples:
            raise ValueError(
                f"result for {self.prompt_id!r}: need samples > 0 and 0 <= successes <= samples, "
                f"got samples={self.samples}, successes={self.successes}"
            )


def read_parquet(path: str | Path) -> Any:
    """A Parquet file as a `datasets.Dataset`, read straight through pyarrow (no cache files written)."""
    import pyarrow.parquet as pq
    from datasets import Dataset

    return Dataset(pq.read_table(str(path)))


def resolve_profile_path(path: str | Path) -> Path:
    """The table a path names: a Parquet file, a profile folder or a run directory.

    A folder means its newest table by name (`profile/*.parquet`, the order the
    dashboard uses); a run directory means its `profile/` folder.
    """
    p = Path(path)
    if p.is_dir():
        folder = p / "profile" if (p / "profile").is_dir() else p
        tables = sorted(folder.glob("*.parquet"))
        if tables:
            return tables[-1]
    elif p.is_file():
        return p
    raise ValueError(f"profile table {str(p)!r} not found: run `elr-rl profile` first or fix the path")


def read_profile_rows(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a profile table (see resolve_profile_path); ValueError if it lacks a PROFILE_COLUMNS column."""
    table_path = resolve_profile_path(path)
    table = read_parquet(table_path)
    missing = [c for c in PROFILE_COLUMNS if c not in table.column_names]
    if missing:
        raise ValueError(
            f"profile table {str(table_path)!r} lacks column(s) {missing}; expected {list(PROFILE_COLUMNS)} "
            "(re-run `elr-rl profile` to regenerate it)"
        )
    return table.to_list()


def validate_profile_rows(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Check in-memory profile rows have every column; return them as a list."""
    rows = list(rows)
    for i, row in enumerate(rows):
        missing = [c for c in PROFILE_COLUMNS if c not in row]
        if missing:
            raise ValueError(f"profile row {i} lacks column(s) {missing}; expected {list(PROFILE_COLUMNS)}")
    return rows


def pooled_profile(rows: Iterable[dict[str, Any]], k: int | None = None) -> dict[str, tuple[int, int]]:
    """prompt_id -> (successes, samples) summed over the table's loop counts (or only `k`)."""
    out: dict[str, tuple[int, int]] = {}
    for row in rows:
        if k is not None and int(row["k"]) != k:
            continue
        s, n = out.get(row["prompt_id"], (0, 0))
        out[row["prompt_id"]] = (s + int(row["successes"]), n + int(row["samples"]))
    return out


def prompt_group(prompt_id: str) -> str:
    """The (environment, difficulty) part of a prompt id `env/dD/sSEED`: the id without its last field."""
    return prompt_id.rsplit("/", 1)[0]


def pool_fingerprint(prompt_ids: list[str]) -> str:
    """Short identity of an ordered prompt pool (saved states refer to prompts by pool index)."""
    digest = hashlib.sha256("\n".join(prompt_ids).encode()).hexdigest()[:16]
    return f"{len(prompt_ids)}:{digest}"


def pack_array(a: np.ndarray) -> str:
    """float64 array -> base64 text: exact, and ~20x faster to write than a JSON list of floats."""
    return base64.b64encode(np.ascontiguousarray(a, dtype="<f8").tobytes()).decode("ascii")


def unpack_array(text: str) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype="<f8").copy()


class PassRateTracker:
    """The per-prompt pass-rate estimate (see module docstring) over a fixed list of prompt ids."""

    def __init__(
        self,
        prompt_ids: list[str],
        profile: dict[str, tuple[int, int]],
        prior_pass_rate: float,
        prior_weight: float,
        live_decay: float,
    ) -> None:
        self.prompt_ids = list(prompt_ids)
        self.index = {pid: i for i, pid in enumerate(self.prompt_ids)}
        self.decay = live_decay
        n = len(self.prompt_ids)
        self.S = np.full(n, prior_pass_rate * prior_weight, dtype=np.float64)
        self.N = np.full(n, float(prior_weight), dtype=np.float64)
        self.profiled = np.zeros(n, dtype=bool)
        # A prompt the profile never saw starts at its group's pooled rate: the profile samples a few seeds
        # per (environment, difficulty) and the pool may hold thousands, so "hard" must not fall back to 0.5.
        groups: dict[str, list[int]] = {}
        for pid, (succ, samples) in profile.items():
            if samples > 0:
                g = groups.setdefault(prompt_group(pid), [0, 0])
                g[0] += succ
                g[1] += samples
        for i, pid in enumerate(self.prompt_ids):
            g = groups.get(prompt_group(pid))
            if g is not None:
                self.S[i] = g[0] / g[1] * prior_weight
        for pid, (succ, samples) in profile.items():
            i = self.index.get(pid)
            if i is None or samples <= 0:
                continue  # profiled prompts outside the pool do not matter for routing
            w = min(float(samples), prior_weight)
            self.S[i] = succ / samples * w
            self.N[i] = w
            self.profiled[i] = True
        # Raw live counts per (prompt, k): "prompt_id|k" -> [samples, successes].
        self.per_k: dict[str, list[int]] = {}
        self.version = 0  # bumped on every update, so callers can cache quantiles

    def estimates(self) -> np.ndarray:
        """p_i = S_i / N_i for every prompt, in pool order."""
        return self.S / self.N

    def update(self, result: RolloutResult) -> None:
        """Fold one group of rollouts into the estimate: S = g*S + succ, N = g*N + samples."""
        i = self.index.get(result.prompt_id)
        if i is None:
            raise ValueError(f"result for unknown prompt {result.prompt_id!r}: it is not in the curriculum's pool")
        self.S[i] = self.decay * self.S[i] + result.successes
        self.N[i] = self.decay * self.N[i] + result.samples
        counts = self.per_k.setdefault(f"{result.prompt_id}|{result.k}", [0, 0])
        counts[0] += result.samples
        counts[1] += result.successes
        self.version += 1

    def evidence(self) -> np.ndarray:
        """N_i: the decayed number of samples (prior included) behind each estimate."""
        return self.N.copy()

    def state_dict(self) -> dict[str, Any]:
        return {
            "pool": pool_fingerprint(self.prompt_ids),
            "S": pack_array(self.S),
            "N": pack_array(self.N),
            "per_k": self.per_k,
            "version": self.version,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state["pool"] != pool_fingerprint(self.prompt_ids):
            raise ValueError("saved pass-rate state belongs to a different prompt pool: start a fresh run directory")
        self.S = unpack_array(state["S"])
        self.N = unpack_array(state["N"])
        self.per_k = {key: list(v) for key, v in state["per_k"].items()}
        self.version = int(state["version"])
