"""Asynchronous GRPO end to end: real Ray actors, real vLLM engines, a real DeepSpeed learner."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from elr_rl.rl.driver import Driver
from elr_rl.rl.rollout_worker import WEIGHTS_FILE_PREFIX, sweep_stale_weight_files
from elr_rl.rl.run_state import STATE_FILE
from tests.rl.helpers import make_config

pytestmark = pytest.mark.slow


def rows(run_dir):
    return [json.loads(line) for line in open(run_dir / "metrics.jsonl")]


def accounted(summary) -> bool:
    """Every scheduled prompt group was trained, filtered, dropped as stale, or is still pending."""
    led = summary["ledger"]
    done = led.get("trained", 0) + led.get("uninformative", 0) + led.get("dropped_stale", 0)
    return led["scheduled"] == done + summary["pending_groups"]


LR = 3e-4


def test_rl_raises_reward_within_bounded_staleness(toy_checkpoint, ray_cluster, tmp_path):
    steps = 36
    cfg = make_config(toy_checkpoint, tmp_path / "run", run={"total_steps": steps}, async_={"max_staleness": 1},
                      algo={"groups_per_step": 16})
    # The helpers' 5e-4 learns fastest but is on the edge here: in 1 of 3 runs (a CI run) a gradient spike at
    # step 7 sent answers at some loop counts to the length cap and the reward stalled (0.51 -> 0.55; the other
    # two +0.34-0.36); quickstart runs saw the same at 5e-4 (configs/rl_tiny.yaml). At 2e-4 two runs climbed only
    # +0.09-0.11 in 30 steps, at 3e-4 +0.14-0.21; 36 steps at 3e-4 leave the threshold a margin.
    cfg.learner.optim.lr = LR
    summary = Driver(cfg).run()
    assert summary["step"] == steps and accounted(summary)
    r = rows(tmp_path / "run")
    assert [x["step"] for x in r] == list(range(1, steps + 1))
    # a row's critic/* are the groups that finished since the row before; a queued step that ends soon after the
    # step ahead can have none (a CI run met one), so its row has no reward
    reward = [x["critic/score/mean"] for x in r if "critic/score/mean" in x]
    assert len(reward) >= steps - 6, [sorted(k for k in x if k.startswith("critic/")) for x in r]
    first, last = sum(reward[:8]) / 8, sum(reward[-8:]) / 8
    print(f"reward first 8 steps {first:.3f} -> last 8 steps {last:.3f}")
    assert last > first + 0.1, reward
    assert all(x["async/staleness_max"] <= 1 for x in r)  # nothing older than max_staleness was trained on
    # workers serve what the learner holds: at least every other step carries a check (a step queued behind
    # one that carries it carries none), nearly all are compared, and each but the last (summary.json only)
    # lands in a step's row
    checks = summary["parity_checks"]
    parity = [x["sync/parity_max_abs_diff"] for x in r if "sync/parity_max_abs_diff" in x]
    print("parity checks", checks, "in rows", len(parity))
    assert sum(v for key, v in checks.items() if key != "worst_abs_diff") >= steps // 2, checks
    assert checks["compared"] >= steps // 2 - 2 and checks["unfinished"] == 0, checks
    assert len(parity) >= checks["compared"] - 1 and all(p < 1e-3 for p in parity) and checks["worst_abs_diff"] < 1e-3
    assert all(x["timing_s/weight_sync"] > 0 for x in r)
    assert sum("timing_s/weight_load" in x for x in r) >= steps // 2  # workers loaded the staged weights
    # the learner's own timing: inside the driver's view of the step, and a thread budget of one busy thread
    assert all(0 < x["timing_s/learner_compute"] <= x["timing_s/update_actor"] for x in r)
    assert all(0 < x["perf/learner_threads_busy"] < 2.5 for x in r)
    for k in (1, 2, 3, 4):
        assert any(f"critic/score/k{k}" in x for x in r) and any(x.get(f"curriculum/prompts_k{k}") for x in r)


def test_staleness_zero_gives_unit_ratios_on_the_first_update(toy_checkpoint, ray_cluster, tmp_path):
    """Also with loop credit on (it leaves the sampling loop's ratios alone), and with a multi-turn
    environment: its episodes are played and scored in the worker's scoring pool, its environment
    tokens masked out, and validation plays whole episodes too."""
    cfg = make_config(toy_checkpoint, tmp_path / "run",
                      run={"total_steps": 4, "eval_interval": 2, "eval_num_tasks": 4, "sample_log_interval": 2},
                      async_={"max_staleness": 0},
                      algo={"updates_per_batch": 2, "dynamic_sampling": False, "loop_credit": 0.5},
                      envs={"names": ["even_odd", "interactive_deduction"]}, rollout={"max_model_len": 384})
    Driver(cfg).run()
    # held-out validation at steps 2 and 4: greedy pass@1 per k on the held-out set, in the step's row
    validated = {x["step"]: x for x in rows(tmp_path / "run") if "val/pass_at_1/k1" in x}
    assert sorted(validated) == [2, 4]
    for x in validated.values():
        for k in cfg.curriculum.loop_counts:
            per_env = [x[f"val/pass_at_1/{env}/k{k}"] for env in cfg.envs.names]  # 4 tasks each
            assert all(0.0 <= v <= 1.0 for v in per_env) and x[f"val/pass_at_1/k{k}"] == pytest.approx(sum(per_env) / 2)
            assert x[f"val/response_length/k{k}"] > 0
    samples = [json.loads(line) for line in open(tmp_path / "run" / "rollouts.jsonl")]
    assert {s["step"] for s in samples} == {2, 4}
    assert all(s["env"] in cfg.envs.names and s["prompt"] and s["policy_version"] >= 0 for s in samples)
    assert any("critic/score/env/interactive_deduction" in x for x in rows(tmp_path / "run"))
    for x in rows(tmp_path / "run"):
        assert x["async/staleness_max"] == 0
        assert x["actor/ratio_max_dev/update0"] < 1e-6
        assert abs(x["actor/is_weight_mean/update0"] - 1.0) < 1e-3
    # the second update moved the policy away from the old logprobs
    assert any(abs(x["actor/ratio_mean"] - 1.0) > 1e-6 for x in rows(tmp_path / "run"))
    # algo.loop_credit: the learner trained the shallower loops' readouts of samples drawn at k > 1
    assert any(x.get("actor/loop_credit_loss") not in (None, 0.0) for x in rows(tmp_path / "run"))


def test_queued_learner_steps_keep_staleness_parity_and_checkpoints(toy_checkpoint, ray_cluster, tmp_path):
    """A learner-bound run (several updates per batch, short completions): the next step is submitted
    while one runs (async_.queued_steps), yet nothing older than max_staleness is trained, the parity
    check compares the version both sides hold, and a checkpoint step is never overtaken. The learner
    borrows the rollout worker's core while the worker is idle (learner.borrow_idle_cores)."""
    from elr_rl.rl.cores import run_lend_dir, visible_cores

    run = tmp_path / "run"
    steps = 8
    cfg = make_config(toy_checkpoint, run, run={"total_steps": steps, "save_interval": 4},
                      async_={"max_staleness": 1, "queued_steps": 1}, learner={"borrow_idle_cores": True},
                      algo={"groups_per_step": 4, "updates_per_batch": 8}, rollout={"max_new_tokens": 8})
    summary = Driver(cfg).run()
    assert summary["step"] == steps and accounted(summary)
    r = rows(run)
    queued = [x["step"] for x in r if x["async/queued_step"]]
    print("queued steps", queued, "learner waits", [round(x.get("timing_s/learner_wait", -1), 3) for x in r])
    assert len(queued) >= steps // 2, queued  # the learner was the slower side: most steps waited in its queue
    assert 5 not in queued  # submitted only after step 4 (a checkpoint) ended
    assert all(x["async/staleness_max"] <= 1 for x in r)
    # the spot-check rides with at least every other step (a step queued behind one carrying it carries
    # none); the worker is idle enough to answer nearly each before the next is due, and the run waits for
    # the last one (summary.json only)
    checks = summary["parity_checks"]
    parity = [x["sync/parity_max_abs_diff"] for x in r if "sync/parity_max_abs_diff" in x]
    print("parity checks", checks, "in rows", len(parity))
    assert sum(v for key, v in checks.items() if key != "worst_abs_diff") >= steps // 2, checks
    assert checks["compared"] >= steps // 2 - 1 and checks["unfinished"] == 0, checks
    assert len(parity) >= checks["compared"] - 1 and all(p < 1e-3 for p in parity) and checks["worst_abs_diff"] < 1e-3
    # a queued step started as soon as the previous one ended on the rank
    assert min(x["timing_s/learner_wait"] for x in r if x["step"] in queued) < 0.1
    assert sorted(p.name for p in (run / "checkpoints").glob("step_*")) == ["step_0000004", "step_0000008"]
    borrowed = [x["perf/learner_borrowed_cores"] for x in r]
    print("borrowed cores", [round(b, 2) for b in borrowed])
    if len(visible_cores()) >= 2:  # learner and worker pinned apart: the idle worker's core was lent
        assert max(borrowed) > 0.1 and all(b <= 1.0 for b in borrowed)
    assert not run_lend_dir(cfg.run.output_dir).exists()  # the run's lending marks are gone


def test_a_killed_rollout_worker_is_restarted_and_nothing_is_lost(toy_checkpoint, ray_cluster, tmp_path):
    import ray

    cfg = make_config(toy_checkpoint, tmp_path / "run", run={"total_steps": 6})
    driver = Driver(cfg)
    killed = {}

    def kill_when_running():
        while driver.step < 2:
            time.sleep(0.2)
        pid = ray.get(driver.workers[0].pid.remote())
        os.kill(pid, signal.SIGKILL)  # a process this test's driver started, killed by its id
        killed["pid"] = pid

    t = threading.Thread(target=kill_when_running, daemon=True)
    t.start()
    summary = driver.run()
    t.join(timeout=5)
    assert killed, "the worker was never killed"
    assert summary["step"] == 6
    assert summary["restarted_workers"] >= 1
    assert accounted(summary)
    assert rows(tmp_path / "run")[-1]["faults/restarted_workers"] >= 1
    # a worker's weights file lives only while it loads them: killed between loads, it left nothing in
    # /dev/shm; killed mid-load (seen in CI), its file is one a new worker's sweep removes (once 10 min old)
    left = sorted(Path("/dev/shm").glob(f"{WEIGHTS_FILE_PREFIX}{killed['pid']}-*"))
    assert len(left) <= 1
    if left:
        assert left[0] in sweep_stale_weight_files(Path("/dev/shm"), min_age_s=0)


def test_killed_driver_resumes_from_its_checkpoint(toy_checkpoint, ray_cluster, tmp_path):
    run = tmp_path / "run"
    cfg = make_config(toy_checkpoint, run, run={"total_steps": 6, "save_interval": 2})
    config = tmp_path / "rl.yaml"
    from elr_rl.config import save_config

    save_config(cfg, config)
    log = tmp_path / "driver.log"  # the killed driver's output, shown if it fails before its checkpoint
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "elr_rl.cli", "rl", str(config), f"run.ray_address={ray_cluster}"],
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
        )
    ckpt = run / "checkpoints" / "step_0000002"
    try:
        deadline = time.time() + 300
        while not (ckpt / STATE_FILE).is_file():
            assert proc.poll() is None, f"the driver exited before its first checkpoint:\n{_tail(log)}"
            assert time.time() < deadline, f"no checkpoint within 300 s:\n{_tail(log)}"
            time.sleep(0.5)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)  # the driver we started, and only it
        proc.wait(timeout=60)
    saved = json.loads((ckpt / STATE_FILE).read_text())
    _wait_for_free_cpus(60)  # Ray reaps the dead driver's actors
    # one reaped while loading weights leaves its file (a new worker sweeps such files once 10 minutes old)
    sweep_stale_weight_files(Path("/dev/shm"), min_age_s=0)
    driver = Driver(cfg)
    restarted = _kill_a_worker_right_after_start(driver)
    summary = driver.run()
    assert summary["resumed_from_step"] == 2 and summary["step"] == 6
    assert Path(summary["final_checkpoint"]).name == "step_0000006"
    # the worker died before the first new step; its successor served the resumed checkpoint's weights
    assert summary["restarted_workers"] >= 1 and restarted, "the worker was never restarted"
    version, theirs = restarted[0]
    assert version == 2
    seq = list(range(3, 40))
    got = theirs[0][-(len(seq) - 1):]
    want, init = (_logprobs(path, seq) for path in (ckpt, toy_checkpoint))
    assert max(abs(a - b) for a, b in zip(got, want)) < 1e-3
    assert max(abs(a - b) for a, b in zip(got, init)) > 1e-3  # not the run's starting weights
    steps = [x["step"] for x in rows(run)]
    assert steps[-4:] == [3, 4, 5, 6]  # the resumed run continued, it did not start over
    resumed_state = json.loads((run / "checkpoints" / "step_0000006" / STATE_FILE).read_text())
    # the curriculum continued its sequence from the checkpoint's batch counter
    assert resumed_state["curriculum"]["batches"] > saved["curriculum"]["batches"]
    assert resumed_state["ledger"]["scheduled"] >= saved["ledger"]["scheduled"]
    assert accounted(summary)


def _tail(path, lines: int = 40) -> str:
    return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])


def _wait_for_free_cpus(seconds: float) -> None:
    """Until every CPU of the cluster is free again (a dead driver's actors are reaped), at most `seconds`."""
    import ray

    deadline = time.time() + seconds
    while ray.available_resources().get("CPU", 0) < ray.cluster_resources().get("CPU", 0):
        if time.time() > deadline:
            free, total = ray.available_resources().get("CPU", 0), ray.cluster_resources().get("CPU", 0)
            raise AssertionError(f"{total - free} of {total} CPUs still held {seconds:.0f} s after the driver was killed")
        time.sleep(0.2)


def _kill_a_worker_right_after_start(driver) -> list:
    """Kill rollout worker 0 (by its pid) once the driver has started it, before the loop's first step;
    record (version, logprobs) of its successor right after the restart, in the driver's thread."""
    import ray

    start, restart, seen = driver._start, driver._restart_worker, []

    def start_then_kill():
        start()
        pid = ray.get(driver.workers[0].pid.remote())
        os.kill(pid, signal.SIGKILL)  # a process this test's driver started, killed by its id
        with pytest.raises(ray.exceptions.RayActorError):
            ray.get(driver.workers[0].ping.remote(), timeout=60)

    def restart_and_probe(i, work, exc):
        restart(i, work, exc)
        seen.append(ray.get(driver.workers[i].logprobs.remote([list(range(3, 40))], 1)))

    driver._start, driver._restart_worker = start_then_kill, restart_and_probe
    return seen


def _logprobs(ckpt, seq) -> list[float]:
    import torch

    from elr_rl.model import LoopedForCausalLM

    model = LoopedForCausalLM.from_pretrained(str(ckpt)).eval()
    with torch.no_grad():
        return model.token_logprobs(torch.tensor([seq]), k=1)[0].tolist()
