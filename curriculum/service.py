"""The curriculum service: a `LoopRouter` behind a Ray actor, persisted in the run directory.

`CurriculumService` is a plain class (usable and testable without Ray);
`start_curriculum_service()` wraps it as a Ray actor. Every call that changes
the router's state rewrites `<run_dir>/curriculum/state.json` atomically
(write a temporary file, fsync, rename), so a service started again on the
same run directory continues the exact sequence of assignments.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any, Iterable

from curriculum.passrates import RolloutResult, read_profile_rows
from curriculum.routing import Assignment, CurriculumConfig, LoopRouter, Prompt, pool_from_profile

STATE_FILE = Path("curriculum") / "state.json"


def atomic_write_json(path: Path, payload: Any) -> None:
    """Write JSON so that a crash leaves either the old file or the new one, never half of one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(payload, f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


class CurriculumService:
    """Hands out (prompt, k) assignments batch by batch and learns pass rates from results.

    pool: the prompts to route; None = every prompt of the profile table.
    run_dir: where state.json lives; None = keep state in memory only.
    resume: continue from run_dir's state.json when there is one (False: start
        afresh and overwrite it).
    """

    def __init__(
        self,
        cfg: CurriculumConfig,
        pool: list[Prompt] | None = None,
        run_dir: str | None = None,
        autosave: bool = True,
        resume: bool = True,
    ) -> None:
        rows = read_profile_rows(cfg.profile_table) if cfg.profile_table else []
        if pool is None:
            if not rows:
                raise ValueError("no prompt pool: pass one or set curriculum.profile_table to a profiled table")
            pool = pool_from_profile(rows)
        self.router = LoopRouter(cfg, pool, rows)
        self.state_path = Path(run_dir) / STATE_FILE if run_dir else None
        self.autosave = autosave
        self.save_interval_s = cfg.save_interval_s
        self.last_save = float("-inf")
        self.resumed = False
        if resume and self.state_path is not None and self.state_path.is_file():
            self.router.load_state_dict(json.loads(self.state_path.read_text()))
            self.resumed = True

    def next_batch(self) -> list[Assignment]:
        """The next batch of assignments (see LoopRouter.next_batch)."""
        batch = self.router.next_batch()
        self._autosave(force=True)  # the sequence state (generator, epoch cursor) must never be lost
        return batch

    def report(self, results: Iterable[RolloutResult]) -> int:
        """Fold finished rollouts (RolloutResult or dicts of its fields) into the pass rates."""
        n = self.router.report(results)
        self._autosave()
        return n

    def stats(self) -> dict[str, Any]:
        return self.router.stats()

    def pass_rates(self) -> dict[str, float]:
        """prompt_id -> current pass-rate estimate."""
        ids = self.router.tracker.prompt_ids
        return dict(zip(ids, self.router.tracker.estimates().tolist()))

    def state_dict(self) -> dict[str, Any]:
        return self.router.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore a saved state (e.g. from an RL checkpoint) and persist it as the current one."""
        self.router.load_state_dict(state)
        self._autosave(force=True)

    def save(self, path: str | None = None) -> str:
        """Write the state to `path` (default: the run directory's state.json); returns the path."""
        target = Path(path) if path else self.state_path
        if target is None:
            raise ValueError("no path to save to: pass one or start the service with a run_dir")
        atomic_write_json(target, self.router.state_dict())
        return str(target)

    def is_resumed(self) -> bool:
        """True when this service started from a state file found in its run directory."""
        return self.resumed

    def _autosave(self, force: bool = False) -> None:
        if not self.autosave or self.state_path is None:
            return
        now = time.monotonic()
        if force or now - self.last_save >= self.save_interval_s:
            atomic_write_json(self.state_path, self.router.state_dict())
            self.last_save = now


def start_curriculum_service(
    cfg: CurriculumConfig,
    pool: list[Prompt] | None = None,
    run_dir: str | None = None,
    name: str | None = None,
    resume: bool = True,
    **actor_options: Any,
) -> Any:
    """Start `CurriculumService` as a Ray actor (Ray must be initialised); returns its handle.

    The actor needs almost no CPU (num_cpus=0 by default) and runs its calls
    one at a time, so batches and reports never interleave.
    """
    import ray

    options: dict[str, Any] = {"num_cpus": 0, **actor_options}
    if name is not None:
        options["name"] = name
    return ray.remote(CurriculumService).options(**options).remote(cfg, pool, run_dir, resume=resume)
