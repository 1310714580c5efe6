"""The sandbox, tier by tier: limits hold, hostile programs leave the host untouched, jobs are reaped."""

from __future__ import annotations

import os
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from environments.sandbox import Sandbox, SandboxLimits, available_tiers, detect_tier, sandbox_python
from tests.environments.adversarial import NEEDS_NAMESPACES, PYTHON, Listener, procs_in_dir

TIERS = available_tiers()
FAST = SandboxLimits(cpu_s=1, wall_s=2.0, memory_mb=256, nproc=16, fsize_mb=1, nofile=32, output_bytes=2000)
IS_ROOT = os.geteuid() == 0


@pytest.mark.skipif(bool(os.environ.get("ELR_SANDBOX_TIER")), reason="tier forced by ELR_SANDBOX_TIER")
def test_strongest_available_tier_is_detected():
    assert detect_tier() == TIERS[0]
    assert "rlimit" in TIERS


@pytest.mark.parametrize("tier", TIERS)
def test_basic_job_io_files_and_minimal_env(tier, monkeypatch):
    monkeypatch.setenv("ELR_SECRET_TOKEN", "hunter2")
    with Sandbox({"data/in.txt": "41\n"}, limits=FAST, tier=tier) as sb:
        sb.write_files({"prog.py": "import os, sys\nn = int(open('data/in.txt').read()) + int(sys.stdin.read())\n"
                        "open('out.txt', 'w').write(str(n))\nprint(n, sorted(os.environ))"})  # fmt: skip
        res = sb.run([sandbox_python(), "prog.py"], stdin="1")
        assert res.returncode == 0 and not res.timed_out, res.stderr
        assert res.stdout.startswith("42 ") and "ELR_SECRET_TOKEN" not in res.stdout
        assert sb.read_tree()["out.txt"] == b"42"  # files persist for the next job
        assert sb.run_shell("cat out.txt").stdout == "42"


@pytest.mark.parametrize("tier", TIERS)
def test_output_is_bounded_and_links_are_not_followed(tier):
    with Sandbox(limits=FAST, tier=tier) as sb:
        res = sb.run_shell("yes xxxxxxxx | head -c 5000000; ln -s /etc/passwd leak; mkfifo pipe; echo hi > ok")
        assert res.truncated and len(res.stdout) == FAST.output_bytes
        tree = sb.read_tree()
        assert tree["leak"] is None and tree["pipe"] is None and tree["ok"] == b"hi\n"


@pytest.mark.parametrize("tier", TIERS)
@pytest.mark.parametrize("name", sorted(PYTHON))
def test_hostile_program_leaves_host_untouched(tier, name):
    if name in NEEDS_NAMESPACES and tier == "rlimit":
        pytest.skip("plain rlimits cannot block the network or signals to the sandbox user's processes")
    if name == "write_outside" and tier == "rlimit" and not IS_ROOT:
        pytest.skip("without namespaces or a uid drop the job writes with our own rights")
    if name == "kill_parent" and tier == "rlimit" and not IS_ROOT:
        pytest.skip("without a pid namespace or a uid drop the job may signal its parent")
    # Markers in the project tree and in /tmp (hidden from the namespace tiers, shared in plain rlimit).
    markers = [Path(__file__).resolve().parent / f".escape-{uuid.uuid4().hex}"]
    if tier != "rlimit":
        markers.append(Path("/tmp") / f"elr-escape-{uuid.uuid4().hex}")
    listener, ppid = Listener(), os.getppid()
    try:
        # Each snippet guarded, so the write_outside program tries every marker in one job.
        code = "\n".join(
            "try:\n" + textwrap.indent(PYTHON[name].format(marker=str(m), port=listener.port), "    ")
            + "\nexcept OSError:\n    pass"
            for m in (markers if name == "write_outside" else markers[:1])
        )
        with Sandbox({"m.py": code}, limits=FAST, tier=tier) as sb:
            start = time.monotonic()
            result = sb.run_python("m.py")
            assert time.monotonic() - start < FAST.wall_s + 3
            assert procs_in_dir(sb.root) == []  # every process of the job is gone
        assert not any(m.exists() for m in markers)
        assert listener.connections == 0
        assert os.getppid() == ppid  # we and our parent are alive
        if name in ("infinite_loop", "sleep_past_deadline", "memory_hog"):
            assert result.returncode != 0
    finally:
        listener.close()
        for m in markers:
            m.unlink(missing_ok=True)
