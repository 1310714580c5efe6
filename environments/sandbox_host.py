"""Host-side pieces of the sandbox: where job folders live, per-job disk and memory.

- Job folders live under one root the sandbox user can traverse (a private
  `TMPDIR` with mode 0700 would hide them from the job and make every
  namespace tier fail): `ELR_SANDBOX_DIR`, else the first of TMPDIR, /tmp,
  /var/tmp, /dev/shm whose every ancestor others may traverse.
  Each folder is named `job-<pid of the process that made it>-<random>`, so a
  killed scoring worker's folders can be found and removed by its parent.
- Disk per job: as root, the job's folder is a tmpfs mounted with `size=`
  (writes past it fail with ENOSPC). Otherwise the folder is on the host's disk
  and its size is measured after each run (a run over quota is flagged).
- Memory per job: a memory cgroup (v2 when the controller is delegated to our
  cgroup, else v1 when its hierarchy is mounted and writable) counts every page
  the job touches: heap, shared anonymous mappings and tmpfs files included.
  Without one the job gets RLIMIT_AS (address space per process).
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import secrets
import signal
import stat
import tempfile
import time
from pathlib import Path

_LIBC = ctypes.CDLL(None, use_errno=True)
_MNT_DETACH = 2
CGROUP_ROOT = Path("/sys/fs/cgroup")


def _others_can_traverse(path: Path) -> bool:
    """Every directory from / down to `path` has the x bit for others."""
    for p in [path, *path.parents]:
        try:
            if not os.stat(p).st_mode & stat.S_IXOTH:
                return False
        except OSError:
            return False
    return True


@functools.cache
def sandbox_root() -> Path:
    """The folder that holds every job folder of this user (mode 0711, owned by us)."""
    dropping = os.geteuid() == 0  # jobs then run as another user, who must reach their folder
    configured = os.environ.get("ELR_SANDBOX_DIR")
    candidates = [configured] if configured else [tempfile.gettempdir(), "/tmp", "/var/tmp", "/dev/shm"]
    for cand in dict.fromkeys(candidates):
        base = Path(cand).resolve()
        if not base.is_dir() or (dropping and not _others_can_traverse(base)):
            continue
        root = base / f"elr-sandbox-{os.geteuid()}"
        try:
            root.mkdir(mode=0o711, exist_ok=True)
        except OSError:
            continue
        st = os.lstat(root)
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid():
            continue  # someone else's (or a link): never use it
        os.chmod(root, 0o711)
        return root
    where = configured or ", ".join(candidates)
    raise RuntimeError(
        f"sandbox: no folder for job directories that the sandbox user can reach among {where}; "
        "set ELR_SANDBOX_DIR to a directory whose every parent has the x bit for others"
    )


def new_job_dir() -> Path:
    path = sandbox_root() / f"job-{os.getpid()}-{secrets.token_hex(6)}"
    path.mkdir(mode=0o711)
    return path


def job_dirs_of(pid: int) -> list[Path]:
    """Job folders made by process `pid` (still there after it was killed)."""
    return sorted(sandbox_root().glob(f"job-{pid}-*"))


def mount_quota(path: Path, size_mb: int, uid: int, gid: int) -> bool:
    """Mount a tmpfs of size_mb on `path` owned by uid (root only); False when that is not possible."""
    if os.geteuid() != 0:
        return False
    opts = f"size={size_mb}m,mode=0755,uid={uid},gid={gid},nr_inodes=20000".encode()
    return _LIBC.mount(b"tmpfs", str(path).encode(), b"tmpfs", 0, opts) == 0


def unmount_below(path: Path) -> None:
    """Detach every mount at or below `path` (a quota tmpfs), deepest first."""
    prefix = str(path)
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].encode().decode("unicode_escape")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    for point in sorted(points, key=len, reverse=True):
        _LIBC.umount2(point.encode(), _MNT_DETACH)


def tree_bytes(path: Path, max_entries: int = 100_000) -> int:
    """Bytes in regular files under `path` (no links followed; iterative, so deep trees are fine)."""
    total, stack, seen = 0, [str(path)], 0
    while stack and seen < max_entries:
        try:
            with os.scandir(stack.pop()) as it:
                for entry in it:
                    seen += 1
                    if entry.is_dir(follow_symlinks=False):
                        stack.append(entry.path)
                    elif entry.is_file(follow_symlinks=False):
                        total += entry.stat(follow_symlinks=False).st_blocks * 512
        except OSError:
            continue
    return total


# -- memory cgroups -------------------------------------------------------------


def _own_cgroup(controller: str | None) -> str | None:
    """Our cgroup path in the v2 hierarchy (controller None) or in the v1 `controller` hierarchy."""
    try:
        lines = Path("/proc/self/cgroup").read_text().splitlines()
    except OSError:
        return None
    for line in lines:
        _, names, path = line.split(":", 2)
        if (controller is None and names == "") or (controller and controller in names.split(",")):
            return path
    return None


@functools.cache
def cgroup_parent() -> tuple[str, Path] | None:
    """("v2"|"v1", folder under which per-job memory cgroups can be made), or None.

    ELR_SANDBOX_CGROUP=0 turns cgroups off (then RLIMIT_AS bounds memory)."""
    if os.environ.get("ELR_SANDBOX_CGROUP", "1") == "0":
        return None
    v2 = _own_cgroup(None)
    if v2 is not None and (CGROUP_ROOT / "cgroup.controllers").exists():
        parent = CGROUP_ROOT / v2.lstrip("/")
        try:
            if "memory" in (parent / "cgroup.subtree_control").read_text().split() and os.access(parent, os.W_OK):
                return "v2", parent
        except OSError:
            pass
    v1 = _own_cgroup("memory")
    if v1 is not None:
        parent = CGROUP_ROOT / "memory" / v1.lstrip("/")
        if (parent / "memory.limit_in_bytes").exists() and os.access(parent, os.W_OK):
            return "v1", parent
    return None


class JobCgroup:
    """A memory cgroup for one job; the child joins it (as the sandbox user) before exec."""

    def __init__(self, memory_mb: int, uid: int | None) -> None:
        found = cgroup_parent()
        if found is None:
            raise OSError("no writable memory cgroup")
        self.version, parent = found
        self.path = parent / f"elr-job-{os.getpid()}-{secrets.token_hex(4)}"
        self.path.mkdir()
        limit = str(memory_mb << 20)
        try:
            if self.version == "v2":
                (self.path / "memory.max").write_text(limit)
                (self.path / "memory.swap.max").write_text("0")
            else:
                (self.path / "memory.limit_in_bytes").write_text(limit)
                try:  # swap counted too, where swap accounting is on
                    (self.path / "memory.memsw.limit_in_bytes").write_text(limit)
                except OSError:
                    pass
            if uid is not None:  # the dropped child writes its own pid here
                os.chown(self.path / "cgroup.procs", uid, -1)
        except OSError:
            self.remove()
            raise
        self.procs_file = str(self.path / "cgroup.procs").encode()

    def join(self) -> None:
        """Called in the child between fork and exec: move ourselves in (no Python objects made)."""
        fd = os.open(self.procs_file, os.O_WRONLY)
        try:
            os.write(fd, b"0")
        finally:
            os.close(fd)

    def peak_mb(self) -> float:
        name = "memory.peak" if self.version == "v2" else "memory.max_usage_in_bytes"
        try:
            return int((self.path / name).read_text()) / (1 << 20)
        except (OSError, ValueError):
            return 0.0

    def remove(self) -> None:
        remove_cgroup(self.path)


def remove_cgroup(path: Path, timeout_s: float = 5.0) -> None:
    """Kill what is left in the cgroup, then remove it."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            pids = [int(p) for p in (path / "cgroup.procs").read_text().split()]
        except (OSError, ValueError):
            pids = []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        try:
            path.rmdir()
            return
        except FileNotFoundError:
            return
        except OSError:
            if time.monotonic() > deadline:
                return
            time.sleep(0.02)


def cgroups_of(pid: int) -> list[Path]:
    found = cgroup_parent()
    if found is None:
        return []
    return [p for p in found[1].glob(f"elr-job-{pid}-*") if re.fullmatch(rf"elr-job-{pid}-[0-9a-f]+", p.name)]
