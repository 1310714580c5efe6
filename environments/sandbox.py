"""Run untrusted (model-written) code and shell commands.

One child process per job, in its own session, in a fresh job folder, with
CPU-time, memory, process-count, file-size and open-file limits, a minimal
environment, no network, a wall-clock backstop that kills the whole process
group, output bounded by RLIMIT_FSIZE on files (never pipes, so a flood cannot
fill the parent's memory), and always reaped.

Isolation tiers, strongest first:

- ``bwrap``: bubblewrap with every namespace unshared and an empty root that
  holds only the system's programs and libraries (``/usr``, read-only), the
  job interpreter's prefix (read-only, every site-packages folder hidden, so
  neither the project nor its editable install is reachable), the job folder
  on ``/tmp`` and size-limited tmpfs on ``/var/tmp`` and ``/dev/shm``.
  No ``/home``, ``/root``, ``/run``, ``/work``, no host ``/tmp``.
- ``unshare``: util-linux ``unshare --user --map-root-user --net --pid --fork``
  plus a mount namespace that hides every top-level folder but the system's
  ones under empty tmpfs, with the same binds and a read-only root.
- ``rlimit``: plain resource limits only (the child has the network and sees
  the host's files with the sandbox user's rights).

The tier is chosen once per process: the configured one (``ELR_SANDBOX_TIER``,
default ``bwrap``) or an error saying what to install; a weaker tier only with
``ELR_SANDBOX_ALLOW_WEAKER_TIER=1`` (``sandbox.allow_weaker_tier``), logged.

When the parent runs as root the child first drops to an unprivileged user
(``nobody``): root ignores RLIMIT_NPROC, may write anywhere and may signal its
parent. Jobs run Python as ``python -I -S``: the standard library only. Nothing
hidden (tests, expected outputs) is ever written into the job folder: callers
compare results in the parent and never trust the child's exit code or
printed banners. Memory and disk per job: see `environments.sandbox_host`.
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
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from environments import sandbox_host as host
from environments.sandbox_tier import (  # tier selection: part of this module's API
    TIERS,
    SandboxConfig,
    SandboxUnavailable,
    available_tiers,
    configure,
    configured_tier,
    detect_tier,
)
from environments.sandbox_view import bwrap_view, unshare_argv

log = logging.getLogger(__name__)

# Inside the namespace tiers the job directory is mounted here.
NS_WORKDIR = "/tmp"
NOBODY = 65534
_PR_SET_PDEATHSIG = 1
# Loaded here, not between fork and exec: dlopen in a forked child of a threaded parent can deadlock.
_LIBC = ctypes.CDLL(None, use_errno=True)
# Found once: a caller's PATH may change later.
_CHMOD, _RM = shutil.which("chmod") or "/bin/chmod", shutil.which("rm") or "/bin/rm"
# Address space a process needs beyond its data limit (code, libraries, stacks) when no cgroup counts memory.
_AS_HEADROOM_MB = 256


@dataclass(frozen=True)
class SandboxLimits:
    """Per-job resource limits."""

    cpu_s: int = 4
    """RLIMIT_CPU seconds per process (kills busy loops; wall clock flakes on busy cores)."""
    wall_s: float = 15.0
    """Wall-clock backstop: the process group is killed after this many seconds."""
    memory_mb: int = 512
    """Memory per job in MiB: a memory cgroup where one is writable (heap, shared mappings and tmpfs
    pages all count), else RLIMIT_DATA plus RLIMIT_AS (data + 256 MiB) per process."""
    nproc: int = 32
    """RLIMIT_NPROC: processes the job may have at once (fork bombs stop here)."""
    fsize_mb: int = 8
    """RLIMIT_FSIZE in MiB: largest file the job may write, stdout/stderr included."""
    nofile: int = 64
    """RLIMIT_NOFILE: open file descriptors per process."""
    output_bytes: int = 64_000
    """Bytes of stdout and of stderr handed back to the caller."""
    disk_mb: int = 32
    """Bytes the job folder may hold, in MiB (a sized tmpfs as root, else measured after each run)."""
    tmpfs_mb: int = 8
    """Size of the private /dev/shm and /var/tmp of the namespace tiers, in MiB each."""


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
    over_disk_quota: bool = False  # the job folder held more than disk_mb after the run


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


def _preexec(limits: SandboxLimits, nproc: int | None, cgroup: host.JobCgroup | None):
    """Limits set in the child between fork and exec (after the uid drop)."""

    def apply() -> None:
        mib = 1 << 20
        if cgroup is not None:
            cgroup.join()
        else:  # no cgroup: bound the address space too (shared mappings escape RLIMIT_DATA)
            resource.setrlimit(resource.RLIMIT_AS, ((limits.memory_mb + _AS_HEADROOM_MB) * mib,) * 2)
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
        view = bwrap_view(sandbox_prefix(), host_dir, NS_WORKDIR, limits.tmpfs_mb)
        return ["bwrap", "--unshare-all", "--die-with-parent", "--new-session", *view, "--", *inner]
    if tier == "unshare":
        return unshare_argv(sandbox_prefix(), host_dir, NS_WORKDIR, limits.tmpfs_mb, inner)
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
    paths["in"].write_bytes(stdin.encode("utf-8", "replace"))
    cgroup = None
    if host.cgroup_parent() is not None:
        cgroup = host.JobCgroup(limits.memory_mb, uid)
    start = time.monotonic()
    try:
        with open(paths["in"], "rb") as fin, open(paths["out"], "wb") as fout, open(paths["err"], "wb") as ferr:
            proc = subprocess.Popen(
                full, cwd=host_dir, env=_minimal_env(cwd_inside), stdin=fin, stdout=fout, stderr=ferr,
                start_new_session=True, user=uid, group=gid, extra_groups=[] if uid is not None else None,
                preexec_fn=_preexec(limits, nproc, cgroup), close_fds=True,
            )  # fmt: skip
            timed_out = _wait_and_reap(proc, tier, limits.wall_s)
    finally:
        if cgroup is not None:
            cgroup.remove()  # kills anything left in it
    wall = time.monotonic() - start
    out, t1 = _read_capped(paths["out"], limits.output_bytes)
    err, t2 = _read_capped(paths["err"], limits.output_bytes)
    for p in paths.values():
        p.unlink(missing_ok=True)
    return RunResult(out, err, proc.returncode, timed_out, t1 or t2, wall, tier)


def _wait_and_reap(proc: subprocess.Popen, tier: str, wall_s: float) -> bool:
    """Wait up to wall_s, then kill every process of the job; True when the clock ran out."""
    timed_out = False
    try:
        proc.wait(timeout=wall_s)
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
    return timed_out


def remove_tree(path: str | Path) -> None:
    """Delete a job folder whatever the job left there: read-only modes, FIFOs, trees deeper than
    Python's recursion limit or than PATH_MAX, a quota tmpfs mounted on it."""
    path = str(path)
    if not os.path.lexists(path):
        return
    host.unmount_below(Path(path))
    # chmod/rm walk iteratively (fts) and never follow links; Python's rmtree recurses.
    subprocess.run([_CHMOD, "-R", "u+rwX", "--", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    subprocess.run([_RM, "-rf", "--", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if os.path.lexists(path):
        log.warning("sandbox: could not remove %s", path)


def remove_leftovers(pid: int) -> int:
    """Remove the job folders and cgroups that process `pid` left (it was killed mid-job); how many."""
    dirs, groups = host.job_dirs_of(pid), host.cgroups_of(pid)
    for group in groups:
        host.remove_cgroup(group)
    for d in dirs:
        remove_tree(d)
    return len(dirs)


@functools.cache
def sandbox_python() -> str:
    """The real path of a Python interpreter the sandbox user can execute (the venv's may sit under /root).

    Jobs run it as `python -I -S`: its standard library only, never a site-packages."""
    candidates = [os.path.realpath(c) for c in (sys.executable, shutil.which("python3"), "/usr/bin/python3") if c]
    base = host.new_job_dir()
    try:
        work = os.path.join(base, "work")
        os.mkdir(work)
        _chown_for_sandbox(str(base), work)
        for exe in dict.fromkeys(candidates):
            try:
                res = run_job([exe, "-I", "-S", "-c", "print('ok')"], work, tier="rlimit", limits=SandboxLimits(), io_dir=base)
            except OSError:  # not executable by the sandbox user
                continue
            if res.stdout.strip() == "ok":
                return exe
    finally:
        remove_tree(base)
    raise RuntimeError(f"no Python interpreter among {candidates} is executable by the sandbox user")


def sandbox_prefix() -> str:
    """The install prefix of `sandbox_python` (its bin/ folder's parent), shown read-only to jobs."""
    return str(Path(sandbox_python()).parent.parent)


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
        self.root = None  # type: ignore[assignment]
        self._base = str(host.new_job_dir())
        root = Path(self._base) / "work"
        root.mkdir()
        uid, gid = _as_sandbox_user()
        self.quota_mounted = uid is not None and host.mount_quota(root, limits.disk_mb, uid, gid)
        self.root = root
        _chown_for_sandbox(self._base, str(self.root))
        if files:
            self.write_files(files)

    # The path the job sees as its working directory.
    @property
    def cwd_inside(self) -> str:
        return str(self.root) if self.tier == "rlimit" else NS_WORKDIR

    def write_files(self, files: Mapping[str, str | bytes]) -> None:
        """Write files (relative paths) into the job directory, owned by the sandbox user.

        What the job left at a path (a FIFO, a link, a device) is replaced, never opened."""
        uid, gid = _as_sandbox_user()
        for rel, content in files.items():
            path = self._resolve(rel)
            for parent in reversed(path.relative_to(self.root).parents):  # a FIFO or file where a folder must be
                full = self.root / parent
                if os.path.lexists(full) and not stat.S_ISDIR(os.lstat(full).st_mode):
                    os.unlink(full)
            path.parent.mkdir(parents=True, exist_ok=True)
            data = content.encode("utf-8", "replace") if isinstance(content, str) else content
            if os.path.lexists(path) and not stat.S_ISREG(os.lstat(path).st_mode):
                if os.path.isdir(path) and not os.path.islink(path):
                    remove_tree(path)
                else:
                    os.unlink(path)
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
            with os.fdopen(fd, "wb") as f:
                f.write(data)
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
        limits = limits or self.limits
        if any("\x00" in a for a in argv):  # exec cannot pass it: the job never starts
            return RunResult("", "argument contains a NUL byte", 127, False, False, 0.0, self.tier)
        # Lone surrogates cannot be encoded for exec: they become U+FFFD, as a terminal would show them.
        argv = [a.encode("utf-8", "replace").decode("utf-8") for a in argv]
        res = run_job(argv, self.root, tier=self.tier, limits=limits, stdin=stdin, io_dir=self._base)
        if not self.quota_mounted and host.tree_bytes(self.root) > limits.disk_mb << 20:
            res.over_disk_quota = True
        return res

    def run_shell(self, command: str, limits: SandboxLimits | None = None) -> RunResult:
        return self.run(["sh", "-c", command], limits=limits)

    def run_python(self, script: str, stdin: str = "", limits: SandboxLimits | None = None) -> RunResult:
        """Run a Python file already in the job directory (isolated, no site-packages, no bytecode)."""
        return self.run([sandbox_python(), "-I", "-S", "-B", script], stdin=stdin, limits=limits)

    def read_tree(
        self, max_file_bytes: int = 1 << 20, max_files: int = 2000, max_depth: int = 32
    ) -> dict[str, bytes | None]:
        """Regular files under the job dir -> content (None when too big). Symlinks, FIFOs and
        devices are never followed or opened: the job made them and may lie. Folders deeper than
        max_depth are listed as None and not entered (iterative: any depth is fine)."""
        out: dict[str, bytes | None] = {}
        stack = [("", 0)]
        while stack:
            rel_dir, depth = stack.pop()
            try:
                with os.scandir(os.path.join(self.root, rel_dir)) as it:
                    entries = sorted(it, key=lambda e: e.name, reverse=True)
            except OSError:
                out[rel_dir] = None
                continue
            for entry in entries:
                rel = os.path.join(rel_dir, entry.name)
                if entry.is_dir(follow_symlinks=False):
                    if depth + 1 >= max_depth:
                        out[rel] = None
                    else:
                        stack.append((rel, depth + 1))
                    continue
                out[rel] = self._read_regular(entry.path, max_file_bytes)
                if len(out) >= max_files:
                    return dict(sorted(out.items()))
        return dict(sorted(out.items()))

    @staticmethod
    def _read_regular(path: str, cap: int) -> bytes | None:
        try:
            st = os.lstat(path)
            if not stat.S_ISREG(st.st_mode) or st.st_size > cap:
                return None
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except OSError:
            return None
        with os.fdopen(fd, "rb") as f:
            return f.read(cap)

    def close(self) -> None:
        if self.root is not None:
            self.root = None  # type: ignore[assignment]
            remove_tree(self._base)
        elif getattr(self, "_base", None) and os.path.lexists(self._base):  # failed half-way in __init__
            remove_tree(self._base)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # interpreter shutdown: nothing sensible to do
            pass


__all__ = [
    "NS_WORKDIR", "TIERS", "RunResult", "Sandbox", "SandboxConfig", "SandboxLimits", "SandboxUnavailable",
    "available_tiers", "configure", "configured_tier", "detect_tier", "remove_leftovers", "remove_tree",
    "run_job", "sandbox_prefix", "sandbox_python",
]
