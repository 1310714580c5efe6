"""scripts/gpu_check.sh in its CPU mode: every figure it promises comes out, and they are sane."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_gpu_check_cpu_tiny_mode_prints_its_json_line():
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    out = subprocess.run(["bash", str(ROOT / "scripts/gpu_check.sh"), "--device", "cpu", "--tiny", "--dtype", "float32",
                          "--seq", "32", "--steps", "1"], env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    r = json.loads(out.stdout.strip().splitlines()[-1])
    assert r["device"] == "cpu" and r["loss_finite"]
    assert r["ceiling_tflops"] > 0 and 0 < r["learner_mfu"] < 1.5
    assert r["learner_step_s_k4_checkpointed"] > 0 and r["checkpointed_time_ratio"] > 0  # the checkpointed step ran
    assert set(r["time_ratio_vs_k1"]) == set(r["d_eff_ratio_vs_k1"]) == {"k1", "k2", "k3", "k4"}
    assert r["d_eff_ratio_vs_k1"]["k4"] == 2.0  # 8 + 4 * 8 + 8 over 8 + 8 + 8 sublayers
    assert r["time_ratio_vs_k1"]["k4"] > 1.0  # four loops cost more than one
    assert max(r["parity_max_abs_logprob_fp32"].values()) < 1e-4
