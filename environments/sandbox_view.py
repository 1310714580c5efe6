"""What a sandboxed job sees of the file system in the namespace tiers.

bwrap: an empty root holding only `/usr` (and the /bin, /lib... links into it),
the dynamic linker's files from /etc, the job interpreter's prefix, the job
folder on /tmp, sized tmpfs on /var/tmp and /dev/shm, a private /dev and
/proc; every site-packages folder and the project checkout covered by an empty
tmpfs; the root read-only. unshare: the host's root with every other top-level
folder (and file) covered, the same binds, read-only.
"""

from __future__ import annotations

import functools
import glob
import os
from pathlib import Path

# Top-level folders the namespace tiers show the job (system programs and libraries only).
SYSTEM_DIRS = ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32")
ETC_FILES = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime")


@functools.cache
def project_root() -> str:
    """The checkout (or installed tree) that holds the `environments` package: never shown to a job."""
    return str(Path(__file__).resolve().parent.parent)


def hidden_paths(prefix: str) -> list[str]:
    """Folders inside the shown system trees that the job must not see: every site-packages
    (the project is installed there, editable or not) and the project checkout."""
    found = []
    for base in dict.fromkeys([prefix, "/usr", "/usr/local"]):
        found += glob.glob(f"{base}/lib*/python3*/site-packages") + glob.glob(f"{base}/lib*/python3*/dist-packages")
    found += glob.glob("/usr/lib/python3/dist-packages") + glob.glob("/usr/local/lib/python3/dist-packages")
    project = project_root()
    if any(project == s or project.startswith(s + "/") for s in ("/usr", prefix)):
        found.append(project)
    return sorted({os.path.realpath(p) for p in found if os.path.isdir(p)})


def bwrap_view(prefix: str, host_dir: str, workdir: str, tmpfs_mb: int) -> list[str]:
    """bubblewrap mount arguments: an empty root with only what a job needs."""
    args = ["--ro-bind", "/usr", "/usr"]
    for name in SYSTEM_DIRS[1:]:
        path = f"/{name}"
        if os.path.islink(path):
            args += ["--symlink", os.readlink(path), path]
        elif os.path.isdir(path):
            args += ["--ro-bind", path, path]
    for name in ETC_FILES:
        if os.path.exists(f"/etc/{name}"):
            args += ["--ro-bind", f"/etc/{name}", f"/etc/{name}"]
    if prefix != "/usr":
        args += ["--ro-bind", prefix, prefix]
    for path in hidden_paths(prefix):
        args += ["--size", "4096", "--tmpfs", path]
    size = str(tmpfs_mb << 20)
    return args + [
        "--dev", "/dev", "--proc", "/proc", "--bind", host_dir, workdir,
        "--size", size, "--tmpfs", "/var/tmp", "--size", size, "--tmpfs", "/dev/shm",
        "--remount-ro", "/", "--chdir", workdir,
    ]  # fmt: skip


def unshare_masks(prefix: str) -> tuple[list[str], list[str]]:
    """(folders, files) at the top of the host's root that the unshare tier covers, plus hidden paths.

    The top folder holding the interpreter stays (the job needs it): a weaker view than bwrap's."""
    keep = set(SYSTEM_DIRS) | {"etc", "dev", "proc", "tmp", prefix.strip("/").split("/")[0]}
    dirs, files = [], []
    for entry in os.scandir("/"):
        if entry.is_dir(follow_symlinks=False) and entry.name not in keep:
            dirs.append(f"/{entry.name}")
        elif entry.is_file(follow_symlinks=False):
            files.append(f"/{entry.name}")
    return sorted(dirs) + hidden_paths(prefix), sorted(files)


def unshare_argv(prefix: str, host_dir: str, workdir: str, tmpfs_mb: int, inner: list[str]) -> list[str]:
    """util-linux unshare: job dir on workdir, sized tmpfs on the other writable places, the host's
    other folders covered, root read-only."""
    dirs, files = unshare_masks(prefix)
    masks = [f"mount -t tmpfs -o size=4k,ro tmpfs '{d}'" for d in dirs] + [f"mount --bind /dev/null '{f}'" for f in files]
    size = f"{tmpfs_mb}m"
    script = (
        f'mount --bind "$0" {workdir} && mount -t tmpfs -o size={size} tmpfs /var/tmp'
        f" && mount -t tmpfs -o size={size} tmpfs /dev/shm && {' && '.join(masks) or 'true'}"
        f' && mount -o remount,bind,ro / && cd {workdir} && exec "$@"'
    )
    return [
        "unshare", "--user", "--map-root-user", "--net", "--pid", "--fork",
        "--mount-proc", "--kill-child", "sh", "-c", script, host_dir, *inner,
    ]  # fmt: skip
