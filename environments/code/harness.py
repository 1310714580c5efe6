"""Run model-written Python against hidden inputs in the sandbox; compare in the parent.

Only the candidate program and the test *inputs* enter the sandbox. The
harness prints the candidate's outputs on one line tagged with a per-job
nonce; the parent decodes them and compares with the expected outputs it
kept. The child's exit code and anything else it prints mean nothing.
"""

from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass
from typing import Any

from environments.base import extract_answer
from environments.sandbox import Sandbox, SandboxLimits

CODE_LIMITS = SandboxLimits(cpu_s=4, wall_s=12.0, memory_mb=512, nproc=16, fsize_mb=4, nofile=32)

_FENCE_RE = re.compile(r"^```[a-zA-Z0-9_+-]*\s*\n(.*?)\n?```\s*$", re.DOTALL)

# Trusted harness source. {nonce} is filled in per job.
_HARNESS = r'''
import contextlib, io, json, os, sys
NONCE = {nonce!r}
spec = json.load(open("_inputs.json"))
src = open("solution.py", encoding="utf-8").read()
results = []
out_fd = os.dup(1)  # kept aside: the candidate's prints never reach the result line

def capture(fn):
    buf = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    err = None
    try:
        with contextlib.redirect_stdout(buf):
            value = fn()
    except SystemExit:
        value = None
    except BaseException as exc:
        value, err = None, type(exc).__name__
    buf.flush()
    return value, buf.buffer.getvalue().decode("utf-8", "replace")[:100000], err

try:
    code = compile(src, "solution.py", "exec")
except BaseException as exc:
    code, results = None, [{{"error": "compile: " + type(exc).__name__}}]
if code is not None and spec["mode"] == "function":
    sys.path.insert(0, os.getcwd())  # -I dropped it; repo_repair imports its package
    g = {{"__name__": "solution"}}
    _, _, err = capture(lambda: exec(code, g))
    for args in spec["inputs"]:
        # An empty spec["func"] means each input is [function name, args].
        name, args = (spec["func"], args) if spec["func"] else args
        fn = g.get(name)
        if err or not callable(fn):
            results.append({{"error": err or "missing function"}})
            continue
        value, _, e = capture(lambda: fn(*args))
        results.append({{"value": value}} if e is None else {{"error": e}})
elif code is not None:
    for stdin in spec["inputs"]:
        sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
        _, out, e = capture(lambda: exec(code, {{"__name__": "__main__"}}))
        results.append({{"stdout": out}} if e is None else {{"error": e, "stdout": out}})
line = NONCE + json.dumps(results, default=repr) + "\n"
os.write(out_fd, line.encode("utf-8"))
'''


def extract_code(completion: str) -> str | None:
    """The program in the single <answer> span, with an optional ``` fence removed."""
    span = extract_answer(completion)
    if span is None:
        return None
    m = _FENCE_RE.match(span.strip())
    code = m.group(1) if m else span
    return code if code.strip() else None


def fence(code: str) -> str:
    return f"<answer>\n```python\n{code.rstrip()}\n```\n</answer>"


def normalise(value: Any) -> Any:
    """What a value looks like after the JSON round trip the harness applies."""
    return json.loads(json.dumps(value))


@dataclass
class HarnessRun:
    """Per-input results decoded from the harness line, or an error."""

    results: list[dict[str, Any]] | None
    error: str | None
    wall_s: float


def run_harness(
    code: str,
    mode: str,
    inputs: list[Any],
    func: str = "",
    limits: SandboxLimits | None = None,
    extra_files: dict[str, str] | None = None,
) -> HarnessRun:
    """Run `code` on every input in one sandboxed process.

    mode "function": call `func(*args)` per input (or `name(*args)` for inputs
    [name, args] when func is ""); mode "stdio": run the program per stdin text.
    `extra_files` are copied next to solution.py (a package under test).
    """
    nonce = "@@" + secrets.token_hex(16) + "@@"
    files = {
        "solution.py": code,
        "_inputs.json": json.dumps({"mode": mode, "func": func, "inputs": inputs}),
        "_harness.py": _HARNESS.format(nonce=nonce),
    }
    for path in extra_files or {}:
        if path in files:
            raise ValueError(f"extra file {path!r} would replace a harness file")
    files.update(extra_files or {})
    with Sandbox(files, limits=limits or CODE_LIMITS) as sb:
        res = sb.run_python("_harness.py")
    if res.timed_out:
        return HarnessRun(None, "wall-clock limit", res.wall_s)
    idx = res.stdout.rfind(nonce)
    if idx < 0:
        # Killed by RLIMIT_CPU/memory, crashed, or tampered with its output.
        return HarnessRun(None, f"no result (exit {res.returncode})", res.wall_s)
    try:
        results = json.loads(res.stdout[idx + len(nonce) :].splitlines()[0])
    except (ValueError, IndexError, RecursionError):  # the job may print a forged, absurdly nested line
        return HarnessRun(None, "unreadable result line", res.wall_s)
    if not isinstance(results, list) or len(results) != len(inputs):
        return HarnessRun(None, "wrong number of results", res.wall_s)
    return HarnessRun(results, None, res.wall_s)
