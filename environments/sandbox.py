"""Run untrusted (model-written) code and shell commands.

One child process per job, in its own session, in a fresh temporary directory,
with CPU-time, memory (RLIMIT_DATA, not RLIMIT_AS: address-space limits break
numpy/BLAS reservations), process-count, file-size and open-file limits, a
minimal environment, no network, a wall-clock backstop that kills the whole
process group, output bounded by RLIMIT_FSIZE on files (never pipes, so a
flood cannot fill the parent's memory), and always reaped.

Isolation tiers, strongest first, probed once per process:

- ``bwrap``: bubblewrap with every namespace unshared, a read-only root, the
  job directory bound on ``/tmp`` and private ``/var/tmp`` and ``/dev/shm``.
- ``unshare``: util-linux ``unshare --user --map-root-user --net --pid --fork``
  plus a private mount namespace doing the same binds and a read-only root.
- ``rlimit``: plain resource limits only (logged as a warning: the child has
  the network and sees the host's files with the sandbox user's rights).

When the parent runs as root the child first drops to an unprivileged user
(``nobody``): root ignores RLIMIT_NPROC, may write anywhere and may signal its
parent. Nothing hidden (tests, expected outputs) is ever written into the job
directory: callers compare results in the parent and never trust the child's
exit code or printed banners.
"""

from __future__ import annotations

import ctypes
import functools
import logging
import os
import resource
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)

TIERS = ("bwrap", "unshare", "rlimit")
# Inside the namespace tiers the job directory is mounted here.
NS_WORKDIR = "/tmp"
NOBODY = 65534
_PR_SET_PDEATHSIG = 1
# Loaded here, not between fork and exec: dlopen in a forked child of a threaded parent can deadlock.
_LIBC = ctypes.CDLL(None, use_errno=True)


@dataclass(frozen=True)
class SandboxLimits:
    """Per-job resource limits."""

    cpu_s: int = 4
    """RLIMIT_CPU seconds per process (kills busy loops; wall clock flakes on busy cores)."""
    wall_s: float = 15.0
    """Wall-clock backstop: the process group is killed after this many seconds."""
    memory_mb: int = 512
    """RLIMIT_DATA in MiB (heap + anonymous mappings)."""
    nproc: int = 32
    """RLIMIT_NPROC: processes the job may have at once (fork bombs stop here)."""
    fsize_mb: int = 8
    """RLIMIT_FSIZE in MiB: largest file the job may write, stdout/stderr included."""
    nofile: int = 64
    """RLIMIT_NOFILE: open file descriptors per process."""
    output_bytes: int = 64_000
    """Bytes of stdout and of stderr handed back to the caller."""


@dataclass
class RunResult:
    """What a sandboxed job did. Only stdout/files mean anything, and only after the parent checks them."""

    stdout: str
    stderr: str
    returncode: int | None  # negative: killed by that signal
    timed_out: bool  # the wall-clock backstop fired
    truncated: bool  # stdout or stderr was longer than output_bytes
    wall_s: float
    tier: str


def _as_sandbox_user() -> tuple[int | None, int | None]:
    """(uid, gid) to drop to: nobody when we are root, else None (stay ourselves)."""
    if os.geteuid() == 0:
        uid = int(os.environ.get("ELR_SANDBOX_UID", NOBODY))
        return uid, uid
    return None, None


def _count_user_procs(uid: int) -> int:
    """Processes the user already owns: RLIMIT_NPROC counts them too."""
    n = 0
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                if entry.stat().st_uid == uid:
                    n += 1
            except OSError:
                pass
    return n


def _preexec(limits: SandboxLimits, nproc: int | None):
    """Limits set in the child between fork and exec (after the uid drop)."""

    def apply() -> None:
        mib = 1 << 20
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s + 1))
        resource.setrlimit(resource.RLIMIT_DATA, (limits.memory_mb * mib,) * 2)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limits.fsize_mb * mib,) * 2)
        resource.setrlimit(resource.RLIMIT_NOFILE, (limits.nofile,) * 2)
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        if nproc is not None:
            resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))
        # If the scoring worker dies (pool timeout), the job dies with it.
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)

    return apply


def _ns_wrap(tier: str, argv: list[str], host_dir: str, limits: SandboxLimits) -> list[str]:
    """The command line that runs argv inside the namespace tier, cwd = NS_WORKDIR."""
    prlimit = shutil.which("prlimit")
    # Counted per job inside its user namespace (the outer limit only guards the host).
    inner = [prlimit, f"--nproc={limits.nproc}:{limits.nproc}", "--", *argv] if prlimit else argv
    if tier == "bwrap":
        return [
            "bwrap", "--unshare-all", "--die-with-parent", "--new-session",
            "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--bind", host_dir, NS_WORKDIR, "--tmpfs", "/var/tmp", "--tmpfs", "/dev/shm",
            "--chdir", NS_WORKDIR, "--", *inner,
        ]  # fmt: skip
    if tier == "unshare":
        # Mount the job dir on /tmp, hide the other world-writable places, root read-only.
        script = (
            f'mount --bind "$0" {NS_WORKDIR} && mount -t tmpfs -o size=1m tmpfs /var/tmp'
            " && mount -t tmpfs -o size=1m tmpfs /dev/shm && mount -o remount,bind,ro /"
            f' && cd {NS_WORKDIR} && exec "$@"'
        )
        return [
            "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork",
            "--mount-proc", "--kill-child", "sh", "-c", script, host_dir, *inner,
        ]  # fmt: skip
    raise ValueError(f"unknown namespace tier {tier!r}; choose one of {TIERS}")


def _minimal_env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "LANG": "C.UTF-8",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONHASHSEED": "0",
        "PYTHONIOENCODING": "utf-8",
    }


def _read_capped(path: Path, cap: int) -> tuple[str, bool]:
    with open(path, "rb") as f:
        data = f.read(cap + 1)
    return data[:cap].decode("utf-8", "replace"), len(data) > cap


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def _kill_pid(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_gone(pids: list[int], timeout_s: float = 5.0) -> None:
    """Wait until each pid has exited (gone or a zombie): its namespace is empty by then."""
    deadline = time.monotonic() + timeout_s
    for pid in pids:
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                        break
            except OSError:
                break
            time.sleep(0.01)


def _kill_group(proc: subprocess.Popen, timeout_s: float = 5.0) -> None:
    """SIGKILL the job's process group until it is empty (signals are delivered asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            return
        if proc.poll() is None or time.monotonic() > deadline:
            return  # our own child is reaped by the caller's wait(); then we come back here
        time.sleep(0.01)


def run_job(
    argv: list[str],
    host_dir: str | Path,
    *,
    tier: str,
    limits: SandboxLimits,
    stdin: str = "",
    io_dir: str | Path,
) -> RunResult:
    """Run argv once in host_dir under `tier`; the caller owns both directories."""
    if tier not in TIERS:
        raise ValueError(f"unknown sandbox tier {tier!r}; choose one of {TIERS}")
    host_dir, io_dir = str(host_dir), Path(io_dir)
    uid, gid = _as_sandbox_user()
    if tier == "rlimit":
        full, cwd_inside = argv, host_dir
        # The plain tier's limit counts every process of the user on the host.
        nproc = limits.nproc + (0 if uid is not None else _count_user_procs(os.getuid()))
    else:
        full, cwd_inside = _ns_wrap(tier, argv, host_dir, limits), NS_WORKDIR
        nproc = 1024  # outer guard for the sandbox user; the per-job limit is set inside
    paths = {k: io_dir / f"{k}.{time.monotonic_ns()}" for k in ("in", "out", "err")}
    paths["in"].write_text(stdin, encoding="utf-8")
    start = time.monotonic()
    with open(paths["in"], "rb") as fin, open(paths["out"], "wb") as fout, open(paths["err"], "wb") as ferr:
        proc = subprocess.Popen(
            full, cwd=host_dir, env=_minimal_env(cwd_inside), stdin=fin, stdout=fout, stderr=ferr,
            start_new_session=True, user=uid, group=gid, extra_groups=[] if uid is not None else None,
            preexec_fn=_preexec(limits, nproc), close_fds=True,
        )  # fmt: skip
        timed_out = False
        try:
            proc.wait(timeout=limits.wall_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        finally:
            # A namespace tier's init is bwrap's/unshare's child: killing it empties the pid
            # namespace, which the kernel does before the init is gone (waited for below).
            inits = _children(proc.pid) if proc.poll() is None and tier != "rlimit" else []
            _kill_group(proc)  # always: leftover background children of the group die too
            for pid in inits:
                _kill_pid(pid)
            proc.wait()
            _kill_group(proc)  # now that the leader is reaped: until the rest of the group is gone
            _wait_gone(inits)
    wall = time.monotonic() - start
    out, t1 = _read_capped(paths["out"], limits.output_bytes)
    err, t2 = _read_capped(paths["err"], limits.output_bytes)
    for p in paths.values():
        p.unlink(missing_ok=True)
    return RunResult(out, err, proc.returncode, timed_out, t1 or t2, wall, tier)


def _rmtree(path: str) -> None:
    def unlock(func, p, _exc):  # the job may have chmod-ed things read-only
        try:
            os.chmod(os.path.dirname(p), 0o700)
            os.chmod(p, 0o700)
            func(p)
        except OSError:
            pass

    shutil.rmtree(path, onerror=unlock)


def _probe(tier: str) -> bool:
    base = tempfile.mkdtemp(prefix="elr-sbx-probe-")
    try:
        work = os.path.join(base, "work")
        os.mkdir(work)
        _chown_for_sandbox(base, work)
        limits = SandboxLimits(wall_s=10.0)
        res = run_job(["sh", "-c", "echo ok > probe && cat probe"], work, tier=tier, limits=limits, io_dir=base)
        return res.stdout.strip() == "ok" and res.returncode == 0
    except OSError:
        return False
    finally:
        _rmtree(base)


@functools.cache
def detect_tier() -> str:
    """The strongest tier that works here (ELR_SANDBOX_TIER forces one); probed once."""
    forced = os.environ.get("ELR_SANDBOX_TIER")
    if forced:
        if forced not in TIERS:
            raise ValueError(f"ELR_SANDBOX_TIER={forced!r}; choose one of {TIERS}")
        return forced
    for tier, exe in (("bwrap", "bwrap"), ("unshare", "unshare")):
        if shutil.which(exe) and _probe(tier):
            return tier
        log.info("sandbox tier %s unavailable", tier)
    log.warning(
        "sandbox: neither bubblewrap nor unshare works here; falling back to plain rlimits "
        "(no network isolation, host files visible with the sandbox user's rights)"
    )
    return "rlimit"


def available_tiers() -> list[str]:
    """Every tier that works here (for tests that exercise each one)."""
    return [t for t in TIERS if t == "rlimit" or (shutil.which(t if t == "bwrap" else "unshare") and _probe(t))]


@functools.cache
def sandbox_python() -> str:
    """A Python interpreter the sandbox user can execute (the venv's may sit under /root)."""
    candidates = [sys.executable, shutil.which("python3"), "/usr/bin/python3"]
    base = tempfile.mkdtemp(prefix="elr-sbx-probe-")
    try:
        work = os.path.join(base, "work")
        os.mkdir(work)
        _chown_for_sandbox(base, work)
        for exe in dict.fromkeys(c for c in candidates if c):
            try:
                res = run_job([exe, "-c", "print('ok')"], work, tier="rlimit", limits=SandboxLimits(), io_dir=base)
            except OSError:  # not executable by the sandbox user
                continue
            if res.stdout.strip() == "ok":
                return exe
    finally:
        _rmtree(base)
    raise RuntimeError(f"no Python interpreter among {candidates} is executable by the sandbox user")


def _chown_for_sandbox(base: str, work: str) -> None:
    """base: traversable only; work: owned by the sandbox user."""
    os.chmod(base, 0o711)
    uid, gid = _as_sandbox_user()
    if uid is not None:
        os.chown(work, uid, gid)


class Sandbox:
    """A fresh job directory; every `run` is one sandboxed child process inside it.

    Files persist between runs (a multi-turn shell episode); `close` deletes them.
    """

    def __init__(
        self,
        files: Mapping[str, str | bytes] | None = None,
        limits: SandboxLimits = SandboxLimits(),
        tier: str | None = None,
    ) -> None:
        self.limits = limits
        self.tier = tier or detect_tier()
        self._base = os.path.realpath(tempfile.mkdtemp(prefix="elr-sbx-"))
        self.root = Path(self._base) / "work"
        self.root.mkdir()
        _chown_for_sandbox(self._base, str(self.root))
        if files:
            self.write_files(files)

    # The path the job sees as its working directory.
    @property
    def cwd_inside(self) -> str:
        return str(self.root) if self.tier == "rlimit" else NS_WORKDIR

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Write files (relative paths) into the job directory, owned by the sandbox user."""
        uid, gid = _as_sandbox_user()
        for rel, content in files.items():
            path = self._resolve(rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode("utf-8") if isinstance(content, str) else content
            path.write_bytes(data)
            if uid is not None:
                for p in [path, *path.relative_to(self.root).parents]:
                    os.lchown(self.root / p, uid, gid)

    def _resolve(self, rel: str) -> Path:
        path = (self.root / rel).resolve()  # follows links the job made: they must stay inside
        if path != self.root and self.root not in path.parents:
            raise ValueError(f"path {rel!r} leaves the sandbox directory")
        return path

    def run(self, argv: list[str], stdin: str = "", limits: SandboxLimits | None = None) -> RunResult:
        if self.root is None:
            raise RuntimeError("sandbox is closed")
        return run_job(argv, self.root, tier=self.tier, limits=limits or self.limits, stdin=stdin, io_dir=self._base)

    def run_shell(self, command: str, limits: SandboxLimits | None = None) -> RunResult:
        return self.run(["sh", "-c", command], limits=limits)

    def run_python(self, script: str, stdin: str = "", limits: SandboxLimits | None = None) -> RunResult:
        """Run a Python file already in the job directory (isolated mode, no bytecode)."""
        return self.run([sandbox_python(), "-I", "-B", script], stdin=stdin, limits=limits)

    def read_tree(self, max_file_bytes: int = 1 << 20, max_files: int = 2000) -> dict[str, bytes | None]:
        """Regular files under the job dir -> content (None when too big). Symlinks, FIFOs
        and devices are never followed or opened: the job made them and may lie."""
        out: dict[str, bytes | None] = {}
        for dirpath, dirnames, filenames in os.walk(self.root, followlinks=False):
            for name in sorted(filenames):
                full = os.path.join(dirpath, name)
                rel = os.path.relpath(full, self.root)
                st = os.lstat(full)
                if not stat.S_ISREG(st.st_mode):
                    out[rel] = None
                elif st.st_size > max_file_bytes:
                    out[rel] = None
                else:
                    fd = os.open(full, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
                    with os.fdopen(fd, "rb") as f:
                        out[rel] = f.read(max_file_bytes)
                if len(out) >= max_files:
                    return out
            for d in list(dirnames):
                if os.path.islink(os.path.join(dirpath, d)):
                    out[os.path.relpath(os.path.join(dirpath, d), self.root)] = None
                    dirnames.remove(d)
            dirnames.sort()
        return out

    def close(self) -> None:
        if self.root is not None:
            _rmtree(self._base)
            self.root = None  # type: ignore[assignment]

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing sensible to do
            pass
