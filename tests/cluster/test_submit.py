"""A two-node Ray cluster on this machine (head + worker raylet) runs an RL job submitted with scripts/submit.sh."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.rl.helpers import make_config

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_node(args: list[str], log: Path) -> subprocess.Popen:
    # --block keeps `ray start` in the foreground; its own session lets us end exactly these processes. On SIGTERM
    # a node drains for 30 s before it stops its processes; nothing runs on it by then, so it stops at once.
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"}
    return subprocess.Popen([str(BIN / "ray"), "start", "--block", *args], stdout=open(log, "w"),
                            stderr=subprocess.STDOUT, start_new_session=True, env=env)


def stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)


def wait_for_nodes(address: str, n: int, nodes: list[subprocess.Popen], logs: list[Path], timeout: float = 180) -> None:
    code = ("import ray,sys; ray.init(address=sys.argv[1], log_to_driver=False); "
            "print(sum(1 for x in ray.nodes() if x['Alive'])); ray.shutdown()")
    deadline = time.time() + timeout
    while time.time() < deadline:
        for proc, log in zip(nodes, logs):
            assert proc.poll() is None, f"`ray start` exited early:\n{log.read_text()[-2000:]}"
        try:
            out = subprocess.run([sys.executable, "-c", code, address], capture_output=True, text=True,
                                 env={**os.environ, "RAY_AUTH_MODE": "disabled"}, timeout=60)
        except subprocess.TimeoutExpired:
            continue
        if out.returncode == 0 and out.stdout.strip().splitlines()[-1:] == [str(n)]:
            return
        time.sleep(2)
    raise AssertionError(f"the cluster at {address} did not reach {n} nodes")


def test_rl_job_runs_across_two_nodes(toy_checkpoint, tmp_path):
    gcs_port, dash_port = free_port(), free_port()
    head = start_node(["--head", f"--port={gcs_port}", "--num-cpus=2", "--include-dashboard=true",
                       f"--dashboard-port={dash_port}", "--dashboard-host=127.0.0.1",
                       '--resources={"learner_node": 1}'], tmp_path / "head.log")
    worker = None
    try:
        wait_for_nodes(f"127.0.0.1:{gcs_port}", 1, [head], [tmp_path / "head.log"])
        worker = start_node([f"--address=127.0.0.1:{gcs_port}", "--num-cpus=2", '--resources={"rollout_node": 1}'],
                            tmp_path / "worker.log")
        wait_for_nodes(f"127.0.0.1:{gcs_port}", 2, [head, worker], [tmp_path / "head.log", tmp_path / "worker.log"])
        run = tmp_path / "run"
        cfg = make_config(toy_checkpoint, run, run={"total_steps": 2})
        from elr_rl.config import save_config

        save_config(cfg, tmp_path / "rl.yaml")
        env = {**os.environ, "RAY_ADDRESS": f"http://127.0.0.1:{dash_port}", "RAY_AUTH_MODE": "disabled",
               "ELR_PYTHON": sys.executable, "ELR_RAY": str(BIN / "ray")}
        job = subprocess.run(
            ["bash", str(ROOT / "scripts" / "submit.sh"), str(tmp_path / "rl.yaml"),
             "learner.resources={learner_node: 0.01}", "rollout.resources={rollout_node: 0.01}"],
            capture_output=True, text=True, env=env, timeout=600,
        )
        assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
        assert "succeeded" in (job.stdout + job.stderr).lower()
        summary = json.loads((run / "summary.json").read_text())
        assert summary["step"] == 2
        learner_nodes, rollout_nodes = set(summary["placement"]["learner"]), set(summary["placement"]["rollout"])
        assert len(learner_nodes) == 1 and len(rollout_nodes) == 1
        assert learner_nodes != rollout_nodes, "learner and rollout workers shared a node"
    finally:
        if worker is not None:
            stop(worker)
        stop(head)


def test_submit_refuses_a_relative_run_folder(tmp_path):
    """The job's driver and actors each run in their own copy of the working directory: a relative
    run.output_dir is refused before anything is submitted, with the change to make."""
    cfg = tmp_path / "rl.yaml"
    cfg.write_text("run:\n  output_dir: runs/mine\n")
    env = {**os.environ, "RAY_ADDRESS": "http://127.0.0.1:1", "ELR_PYTHON": sys.executable, "ELR_RAY": "false"}
    out = subprocess.run(["bash", str(ROOT / "scripts" / "submit.sh"), str(cfg)], capture_output=True, text=True,
                         env=env, timeout=60)
    assert out.returncode == 2 and "run.output_dir=runs/mine is relative" in out.stderr
    ok = subprocess.run(["bash", str(ROOT / "scripts" / "submit.sh"), str(cfg), f"run.output_dir={tmp_path}/run"],
                        capture_output=True, text=True, env=env, timeout=60)
    assert ok.returncode == 1  # got as far as `ray job submit` (here `false`)
