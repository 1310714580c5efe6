"""Hostile completions, as Python programs and as shell commands, plus host-side probes.

`{marker}` is a path outside the sandbox that must never be created; `{port}`
is a TCP port the host listens on, which must never see a connection.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path

PYTHON = {
    "fork_bomb": "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass",
    "infinite_loop": "while True:\n    pass",
    "memory_hog": "xs = []\nwhile True:\n    xs.append(bytearray(64 * 1024 * 1024))",
    "write_outside": "open({marker!r}, 'w').write('escaped')",
    "read_hidden": (
        "import glob\nfound = []\n"
        "for p in glob.glob('/proc/*/environ') + glob.glob('/proc/*/cmdline') + glob.glob('../*') + glob.glob('/root/*'):\n"
        "    try:\n        found.append(open(p, 'rb').read(300))\n    except Exception:\n        pass\nprint(found)"
    ),
    "network": "import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=2)\ns.sendall(b'PWNED')",
    "sleep_past_deadline": "import time\ntime.sleep(60)",
    "banner_exit_0": "print('PASSED')\nprint('All tests passed')\nimport sys\nsys.exit(0)",
    "kill_parent": (
        "import os, signal\nfor f in (lambda: os.kill(os.getppid(), signal.SIGKILL),\n"
        "          lambda: os.killpg(os.getpgid(os.getppid()), signal.SIGKILL)):\n"
        "    try:\n        f()\n    except OSError:\n        pass"
    ),
    "kill_everything": "import os, signal\nos.kill(-1, signal.SIGKILL)",
}

SHELL = {
    "fork_bomb": "f() {{ f | f & }}; f",  # braces doubled: these are str.format templates
    "infinite_loop": "while :; do :; done",
    "memory_hog": "python3 -c 'b = bytearray(4 * 1024 ** 3)'",
    "write_outside": "echo escaped > {marker}",
    "read_hidden": "cat /proc/*/environ 2>/dev/null | head -c 2000; ls -la .. /root 2>&1 | head",
    "network": "python3 -c \"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=2).sendall(b'PWNED')\"",
    "sleep_past_deadline": "sleep 60",
    "banner_exit_0": "echo PASSED; echo 'All tests passed'; exit 0",
    "kill_parent": "kill -9 $PPID; kill -9 0",
    "kill_everything": "kill -9 -1",
}

# Only a namespace tier can stop these (plain rlimits leave the network and the user's processes reachable).
NEEDS_NAMESPACES = {"network", "kill_everything"}


class Listener:
    """A host TCP server on 127.0.0.1 that records whether anything connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(4)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join(timeout=2)
        self.sock.close()


def procs_in_dir(path: Path) -> list[int]:
    """Live processes whose working directory is `path` (leftovers of a sandbox job).

    Compared by (device, inode): inside a mount namespace the job sees the same
    directory under another name."""
    st = os.stat(path)
    pids = []
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                cst = os.stat(f"/proc/{entry.name}/cwd")
            except OSError:
                continue
            if (cst.st_dev, cst.st_ino) == (st.st_dev, st.st_ino):
                pids.append(int(entry.name))
    return pids
