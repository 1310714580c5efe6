"""Reward integrity, tried as a policy would: the job sees nothing of the grader or the host,
limits hold (shared memory, tmpfs, disk), files the job leaves cannot hang or crash the
parent, every score() is total and linear-time, and text checks read what a reader sees."""

from __future__ import annotations

import os
import socket
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from environments import sandbox as sandbox_mod
from environments import sandbox_host
from environments.base import join_turns, tag_spans
from environments.code.harness import fence
from environments.registry import _entry_points as entry_point_names
from environments.registry import get_env, list_envs
from environments.sandbox import Sandbox, SandboxLimits, SandboxUnavailable, available_tiers, detect_tier
from environments.sandbox_view import project_root
from environments.turns import parse_action

TIERS = available_tiers()
NS_TIERS = [t for t in TIERS if t != "rlimit"]
SMALL = SandboxLimits(cpu_s=2, wall_s=6.0, memory_mb=128, nproc=16, fsize_mb=8, nofile=32, disk_mb=16, tmpfs_mb=4)
needs_bwrap = pytest.mark.skipif("bwrap" not in TIERS, reason="bubblewrap is not installed")

# Regenerates the task from the grader's own source found on the host, then answers from it.
GRADER_HACK = """
import json, sys
for root in {roots!r}:
    sys.path.insert(0, root)
spec = json.load(open("_inputs.json"))
from environments.code.function_synthesis import CodeFunctionSynthesis, _apply
env = CodeFunctionSynthesis()
ops = next(t.hidden for s in range(20) for d in range(1, 5)
           for t in [env.generate(s, d)] if t.hidden["inputs"] == spec["inputs"])
ns = {{}}
exec("def f(xs):\\n" + "\\n".join("    " + line for line in ops["ops"]) + "\\n    return xs", ns)
transform = process = pipeline = apply_steps = solve = ns["f"]
"""

VIEW_PROBE = """
import json, os
seen = {{p: os.path.exists(p) and (sorted(os.listdir(p)) if os.path.isdir(p) else "file")
        for p in {paths!r}}}
try:
    import environments
    seen["import"] = environments.__file__
except ImportError:
    seen["import"] = None
print(json.dumps(seen))
"""


@needs_bwrap
def test_grader_hack_pays_only_where_the_host_is_visible(monkeypatch):
    """The same completion scores 1.0 when the job can read the checkout (rlimit) and 0 under bwrap."""
    env = get_env("code_function_synthesis")
    task = env.generate(3, 2)
    hack = fence(GRADER_HACK.format(roots=[project_root()]))
    monkeypatch.setattr(sandbox_mod, "detect_tier", lambda: "rlimit")
    assert env.score(task, hack).reward == 1.0  # the attack is real
    monkeypatch.setattr(sandbox_mod, "detect_tier", lambda: "bwrap")
    assert env.score(task, hack).reward == 0.0


@pytest.mark.parametrize("tier", NS_TIERS)
def test_job_sees_nothing_of_the_project_or_the_host(tier):
    project = project_root()
    paths = [project, "/work", "/root", "/run", "/home", f"{project}/environments/code/harness.py"]
    with Sandbox({"probe.py": VIEW_PROBE.format(paths=paths)}, limits=SMALL, tier=tier) as sb:
        res = sb.run_python("probe.py")
    assert res.returncode == 0, res.stderr
    seen = __import__("json").loads(res.stdout)
    assert seen.pop("import") is None
    assert all(v in (False, []) for v in seen.values()), seen  # absent or an empty cover


@pytest.mark.parametrize("tier", NS_TIERS)
def test_job_cannot_reach_a_host_unix_socket(tier, tmp_path):
    host_dir = Path("/run") if os.access("/run", os.W_OK) else tmp_path
    path = host_dir / f"elr-test-{uuid.uuid4().hex[:8]}.sock"
    srv = socket.socket(socket.AF_UNIX)
    srv.bind(str(path))
    os.chmod(path, 0o777)
    srv.listen(1)
    srv.settimeout(0.1)
    code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({str(path)!r})\ns.sendall(b'PWNED')\nprint('sent')"
    try:
        with Sandbox({"m.py": code}, limits=SMALL, tier=tier) as sb:
            res = sb.run_python("m.py")
        with pytest.raises(OSError):  # nothing connected
            srv.accept()
        assert "sent" not in res.stdout
    finally:
        srv.close()
        path.unlink(missing_ok=True)


@pytest.fixture(params=["cgroup", "rlimit_as"])
def memory_mode(request, monkeypatch):
    """Memory held by a cgroup where one is writable, else by RLIMIT_AS."""
    sandbox_host.cgroup_parent.cache_clear()
    if request.param == "rlimit_as":
        monkeypatch.setenv("ELR_SANDBOX_CGROUP", "0")
    elif sandbox_host.cgroup_parent() is None:
        pytest.skip("no writable memory cgroup here")
    yield request.param
    sandbox_host.cgroup_parent.cache_clear()


SHARED_HOG = """
import mmap
m = mmap.mmap(-1, 600 << 20, flags=mmap.MAP_SHARED | mmap.MAP_ANONYMOUS)
for i in range(0, 600 << 20, 4096):
    m[i] = 1
print("held 600 MiB")
"""
TMPFS_HOG = "for i in $(seq 40); do head -c 4194304 /dev/zero > /dev/shm/f$i || break; done; du -sk /dev/shm"


@pytest.mark.parametrize("tier", NS_TIERS)
def test_shared_memory_and_tmpfs_count_against_the_job(tier, memory_mode):
    with Sandbox({"m.py": SHARED_HOG}, limits=SMALL, tier=tier) as sb:
        res = sb.run_python("m.py")
        assert "held" not in res.stdout and res.returncode != 0
        shm = sb.run_shell(TMPFS_HOG)
        assert int(shm.stdout.split()[0]) <= (SMALL.tmpfs_mb << 10) + 64, shm.stdout


@pytest.mark.parametrize("tier", TIERS)
def test_disk_quota_per_job(tier):
    with Sandbox(limits=SMALL, tier=tier) as sb:
        res = sb.run_shell("for i in $(seq 40); do head -c 4194304 /dev/zero > f$i || break; done")
        held = sandbox_host.tree_bytes(sb.root)
        assert held <= (SMALL.disk_mb << 20) + (1 << 20) or res.over_disk_quota


def test_fifos_and_deep_trees_the_job_leaves_neither_hang_nor_crash_the_parent():
    job = (
        "import os\nos.mkfifo('solution.py'); os.mkfifo('sub'); os.symlink('/etc/passwd', 'link')\n"
        "for _ in range(1500):\n    os.mkdir('dddd'); os.chdir('dddd')\nprint('deep')"
    )
    with Sandbox({"job.py": job}, limits=SMALL) as sb:
        res = sb.run_python("job.py")
        assert "deep" in res.stdout, res.stderr
        done = threading.Event()

        def write():
            sb.write_files({"solution.py": "print(1)", "sub/x.txt": "y"})
            done.set()

        threading.Thread(target=write, daemon=True).start()
        assert done.wait(10), "write_files hung on a FIFO the job made"
        tree = sb.read_tree()
        assert tree["solution.py"] == b"print(1)" and tree["link"] is None
        assert any(k.startswith("dddd/") and v is None for k, v in tree.items())  # too deep: listed, not entered
        base = Path(sb._base)
    assert not base.exists()  # removed despite a 1,500-deep tree


def test_tag_scanning_is_linear_and_matches_the_regex():
    import random
    import re

    rng = random.Random(0)
    old = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
    for _ in range(300):
        text = "".join(rng.choice(["<answer>", "</answer>", "x", "<", ">", "\n"]) for _ in range(rng.randint(0, 30)))
        assert tag_spans(text, "answer") == old.findall(text)
    for bomb in ["<answer>" * 50_000, "<bash>" * 50_000, '<edit path="' * 30_000, "<answer>1</answer>" * 20_000]:
        start = time.monotonic()
        tag_spans(bomb, "answer")
        parse_action(bomb, ("bash", "edit", "answer"))
        assert time.monotonic() - start < 1.0, bomb[:20]


GARBAGE = {
    "surrogates": "<answer>\ud800 x \udfff</answer>",
    "nul": "<answer>1\x002</answer>",
    "answer_tags_200k": "<answer>" * 25_000,
    "closed_tags_200k": "<answer>1</answer>" * 12_000,
    "deep_json": "<answer>" + "[" * 100_000 + "</answer>",
    "tool_name_list": '<tool>{"name": [], "arguments": []}</tool>',
    "tool_deep_json": "<tool>" + "[" * 100_000 + "</tool>",
    "bash_nul": "<bash>echo a\x00b</bash>",
    "bash_surrogate": "<bash>echo \ud800 > f\udcff</bash>",
    "edit_nul_path": '<edit path="a\x00b">x</edit>',
    "bash_tags_200k": "<bash>" * 30_000,
}


@pytest.mark.slow
def test_every_score_is_total_and_fast_on_garbage():
    """Any text gives a Score with reward 0, quickly (200 KB of repeated tags took 12-22 s before)."""
    slow, bad = [], []
    for name in list_envs():
        if name not in entry_point_names():  # dataset environments have their own garbage test
            continue
        env = get_env(name)
        # a task whose answer is not "1", so that a garbage text that repeats `<answer>1</answer>` is wrong
        # (several answer blocks that agree are one answer; a task whose answer is 1 would pass it)
        task = next(t for t in (env.generate(s, env.min_difficulty) for s in range(50)) if str(t.answer).strip() != "1")
        for kind, text in GARBAGE.items():
            if not env.multi_turn and not text.startswith("<answer>"):
                continue  # single-turn scorers only ever read the answer span
            completion = join_turns([text, text]) if env.multi_turn else text
            start = time.monotonic()
            try:
                score = env.score(task, completion)
            except Exception as exc:  # noqa: BLE001 - the point of the test
                bad.append(f"{name}/{kind}: {type(exc).__name__}: {exc}"[:200])
                continue
            if time.monotonic() - start > 4.0:
                slow.append(f"{name}/{kind}: {time.monotonic() - start:.1f}s")
            if score.reward != 0.0:
                bad.append(f"{name}/{kind}: reward {score.reward}")
    assert not bad and not slow, bad + slow


def test_homoglyphs_and_other_scripts_do_not_pass_word_constraints():
    env = get_env("ifeval_constraints")
    task = env.generate(10, 3)  # kw, max_words, no_commas, forbid
    kinds = {c["kind"]: c for c in task.hidden["constraints"]}
    assert {"forbid", "max_words"} <= set(kinds) and "json" not in kinds
    text = task.answer
    assert env.score(task, f"<answer>{text}</answer>").reward == 1.0
    forbidden = kinds["forbid"]["word"]
    cyrillic = forbidden.replace("e", "\u0435").replace("a", "\u0430").replace("o", "\u043e").replace("y", "\u0443")
    assert cyrillic != forbidden
    for disguised in (cyrillic, forbidden.upper().replace("E", "\u0415"), "\uff21"[:0] + forbidden[0] + "\u200b" + forbidden[1:]):
        assert env.score(task, f"<answer>{text} It is {disguised} so.</answer>").reward == 0.0, disguised
    extra = " ".join(["\u0441\u043b\u043e\u0432\u043e"] * (kinds["max_words"]["n"] + 1))  # "слово" many times
    assert env.score(task, f"<answer>{text} {extra}</answer>").reward == 0.0


@pytest.fixture
def fresh_tier(monkeypatch):
    """detect_tier and the job root re-read the environment; restored afterwards."""
    for var in ("ELR_SANDBOX_TIER", "ELR_SANDBOX_ALLOW_WEAKER_TIER"):
        monkeypatch.delenv(var, raising=False)
    detect_tier.cache_clear()
    sandbox_host.sandbox_root.cache_clear()
    yield monkeypatch
    monkeypatch.undo()
    detect_tier.cache_clear()
    sandbox_host.sandbox_root.cache_clear()


@needs_bwrap
def test_private_tmpdir_keeps_the_tier_and_references_pass(fresh_tier, tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    fresh_tier.setattr(tempfile, "tempdir", str(private))
    assert detect_tier() == "bwrap"
    for name in ("code_function_synthesis", "shell_fs_tasks"):
        env = get_env(name)
        task = env.generate(1, 2)
        assert env.score(task, env.reference_solution(task)).reward == 1.0, name


def test_a_tier_that_cannot_run_is_an_error_unless_weaker_is_allowed(fresh_tier, tmp_path, caplog):
    fresh_tier.setenv("ELR_SANDBOX_TIER", "bwrap")
    fresh_tier.setenv("PATH", str(tmp_path))  # no bwrap (nor unshare) on PATH
    with pytest.raises(SandboxUnavailable, match="install bubblewrap.*allow_weaker_tier"):
        detect_tier()
    detect_tier.cache_clear()
    fresh_tier.setenv("ELR_SANDBOX_ALLOW_WEAKER_TIER", "1")
    with caplog.at_level("WARNING", logger="environments.sandbox"):
        assert detect_tier() == "rlimit"
    assert "weaker tier rlimit" in caplog.text


@pytest.mark.slow
def test_a_pool_timeout_removes_the_jobs_folder():
    from environments.pool import ScoringPool

    env = get_env("code_function_synthesis")
    task = env.generate(0, 1)
    with ScoringPool(num_workers=1) as pool:
        pid = pool._workers[0].proc.pid
        score = pool.submit(env.name, task, fence("import time\ntime.sleep(30)"), timeout_s=3.0).result(timeout=30)
        assert "timed out" in (score.error or "")
        assert pool._workers[0].proc.pid != pid  # the worker was killed mid-job...
        assert sandbox_host.job_dirs_of(pid) == [] and sandbox_host.cgroups_of(pid) == []  # ...and cleaned up


@pytest.mark.slow
@pytest.mark.parametrize("tier", [t for t in TIERS if t != TIERS[0]])
def test_references_score_one_in_every_weaker_tier(tier, monkeypatch):
    """The strongest tier is covered by the golden tests of every environment."""
    monkeypatch.setattr(sandbox_mod, "detect_tier", lambda: tier)
    names = ["code_function_synthesis", "code_stdio_algorithms", "scicode_numerical", "shell_fs_tasks", "repo_repair"]
    for name in names:
        env = get_env(name)
        task = env.generate(2, 2)
        assert env.score(task, env.reference_solution(task)).reward == 1.0, (tier, name)
