"""A rollout worker killed while loading weights leaves its file; the next worker on the host removes it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from elr_rl.rl.rollout_worker import STALE_WEIGHTS_AGE_S, sweep_stale_weight_files


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid  # exited and reaped: no process has it (pids are not reused this quickly)


def test_only_old_files_of_dead_workers_are_removed(tmp_path):
    old = time.time() - STALE_WEIGHTS_AGE_S - 60
    dead = _dead_pid()
    files = {
        "dead_old": tmp_path / f"elr-rl-worker-{dead}-0.safetensors",
        "dead_new": tmp_path / f"elr-rl-worker-{dead}-1.safetensors",  # may still be loading elsewhere
        "alive_old": tmp_path / f"elr-rl-worker-{os.getpid()}-0.safetensors",
        "not_ours": tmp_path / "elr-rl-worker-notapid-0.safetensors",
        "other": tmp_path / f"model-{dead}-0.safetensors",
    }
    for name, path in files.items():
        path.write_bytes(b"x")
        if name != "dead_new":
            os.utime(path, (old, old))
    removed = sweep_stale_weight_files(tmp_path)
    assert removed == [files["dead_old"]]
    assert not files["dead_old"].exists()
    assert all(p.exists() for name, p in files.items() if name != "dead_old")
