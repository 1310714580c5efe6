"""Weights files and the published weights: a rollout worker killed while loading weights leaves its file (the
next worker on the host removes it); rank 0 publishes the weights in the dtype the workers keep."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

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


@pytest.mark.parametrize("rollout_dtype", ["float32", "bfloat16"])
def test_published_weights_are_in_the_workers_dtype(rollout_dtype):
    """Rank 0 publishes what a worker keeps: bf16 workers get bf16 (rounded as their own load would)."""
    from types import SimpleNamespace

    import torch
    from safetensors.torch import load

    from elr_rl.rl.config import RLConfig
    from elr_rl.rl.learner import LearnerRank

    master = {"w": torch.randn(64, 32), "b": torch.randn(32)}
    rank = LearnerRank.__new__(LearnerRank)  # only `weights` is under test: no Ray actor, no DeepSpeed
    rank.rank, rank.cfg, rank._wire = 0, RLConfig(), None
    rank.cfg.rollout.dtype = rollout_dtype
    # the engine's serving copy: the masters rounded to the asked dtype (tests/train: bitwise so on real ranks)
    calls = []

    def state_dict_in(dtype):
        calls.append(rank.rank)
        return {n: t.to(dtype) for n, t in master.items()}

    rank.engine = SimpleNamespace(state_dict_in=state_dict_in, serving_is_collective=lambda dtype: False)
    first = rank.weights()
    got = load(bytes(first))
    want = torch.bfloat16 if rollout_dtype == "bfloat16" else torch.float32
    assert set(got) == set(master) and all(t.dtype == want for t in got.values())
    for name, t in master.items():
        assert torch.equal(got[name], t.to(want))  # the same rounding as the worker's own cast
    for name in master:  # the next step packs into the same buffer
        master[name] += 1
    again = rank.weights()
    assert again.ctypes.data == first.ctypes.data  # no new 94 MB of fresh pages each step at 47M
    assert all(torch.equal(t, master[n].to(want)) for n, t in load(bytes(again)).items())
    rank.rank = 1
    assert rank.weights().size == 0  # only rank 0 publishes
    assert calls == [0, 0]  # and the others do not even copy the weights (no gather needed here)
    rank.engine.serving_is_collective = lambda dtype: True  # ZeRO-3: every rank takes part in the gather
    assert rank.weights().size == 0 and calls == [0, 0, 1]
