"""A small HTTP server for the dashboard: static page plus JSON endpoints the page polls.

    GET /                       the page (elr_rl/dashboard/static/index.html)
    GET /static/NAME            the page's own JS and CSS (no CDN: everything ships in the package)
    GET /api/status             what the run directory holds, messages for what is missing
    GET /api/metrics?offset=N   metric rows appended after byte N of metrics.jsonl, and the new offset
    GET /api/routing?offset=N   routing histograms appended after byte N of curriculum/routing.jsonl
    GET /api/profile            the newest profile table, column-oriented
    GET /api/config             config.yaml as text
    GET /api/passrates          current pass rate per (prompt, k): the profile plus the curriculum's live counts
    GET /api/samples?offset=N   sample completions appended after byte N of rollouts.jsonl
    GET /api/runs               run directories at or below the served folder

Every /api/ call takes `run=NAME` (a name from /api/runs) to read a run below the
served folder instead of the folder itself; the page uses it to list the runs of
a folder such as runs/quickstart and to overlay a second run.

Built on the standard library so the dashboard adds no dependency.
Errors reach the page as `{"error": "..."}` JSON with a one-line message.
"""

from __future__ import annotations

import json
import threading
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse

from elr_rl.dashboard import data

STATIC_DIR = Path(__file__).with_name("static")
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".png": "image/png", ".svg": "image/svg+xml"}


def _offset(query: dict[str, list[str]]) -> int:
    """The `offset` query parameter; garbage or negatives read as 0 (re-read from the start)."""
    try:
        return max(0, int(query.get("offset", ["0"])[0]))
    except ValueError:
        return 0


class _Handler(BaseHTTPRequestHandler):
    server: _DashboardHTTPServer

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        url = urlparse(self.path)
        query = parse_qs(url.query)
        root = self.server.run_dir
        try:
            run_dir = data.resolve_run(root, query.get("run", [""])[0])
            if url.path in ("/", "/index.html"):
                self._send_file(STATIC_DIR / "index.html")
            elif url.path.startswith("/static/"):
                self._send_static(url.path[len("/static/"):])
            elif url.path == "/api/status":
                self._send_json(data.run_status(run_dir))
            elif url.path == "/api/metrics":
                self._send_json(data.load_metrics(run_dir, _offset(query)))
            elif url.path == "/api/routing":
                self._send_json(data.load_routing(run_dir, _offset(query)))
            elif url.path == "/api/profile":
                self._send_json(data.load_profile(run_dir))
            elif url.path == "/api/passrates":
                self._send_json(data.load_passrates(run_dir))
            elif url.path == "/api/samples":
                self._send_json(data.load_samples(run_dir, _offset(query)))
            elif url.path == "/api/runs":
                self._send_json({"root": str(root), "runs": data.list_runs(root)})
            elif url.path == "/api/config":
                self._send_json(data.load_config_text(run_dir))
            else:
                self._send_json({"error": f"no such page {url.path!r}"}, HTTPStatus.NOT_FOUND)
        except (BrokenPipeError, ConnectionResetError):
            pass  # the page went away mid-reply
        except Exception as exc:  # the page shows this line instead of a blank panel
            self._send_json({"error": f"{type(exc).__name__}: {exc}"}, HTTPStatus.INTERNAL_SERVER_ERROR)

    def _send_static(self, name: str) -> None:
        # Only plain file names inside static/: no path traversal.
        allowed = {p.name for p in STATIC_DIR.iterdir() if p.is_file()}
        if name not in allowed:
            self._send_json({"error": f"no static file {name!r}"}, HTTPStatus.NOT_FOUND)
            return
        self._send_file(STATIC_DIR / name)

    def _send_file(self, path: Path) -> None:
        self._send_bytes(path.read_bytes(), CONTENT_TYPES.get(path.suffix, "application/octet-stream"))

    def _send_json(self, obj: Any, status: HTTPStatus = HTTPStatus.OK) -> None:
        body = json.dumps(obj, allow_nan=False, separators=(",", ":")).encode()
        self._send_bytes(body, "application/json", status)

    def _send_bytes(self, body: bytes, content_type: str, status: HTTPStatus = HTTPStatus.OK) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")  # live data: never serve a stale poll
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
        pass  # one line per poll would drown the terminal


class _DashboardHTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    run_dir: Path


class DashboardServer:
    """Serves the dashboard for `run_dir` on `host:port` (port 0 picks a free one)."""

    def __init__(self, run_dir: str | Path, host: str = "127.0.0.1", port: int = 0):
        self.httpd = _DashboardHTTPServer((host, port), _Handler)
        self.httpd.run_dir = Path(run_dir)
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host}:{port}/"

    def start(self) -> DashboardServer:
        """Serve from a background thread (tests, notebooks); `close()` stops it."""
        self._thread = threading.Thread(target=self.httpd.serve_forever, name="elr-dashboard", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        self.httpd.serve_forever()

    def close(self) -> None:
        if self._thread is not None:
            self.httpd.shutdown()
            self._thread.join(timeout=5)
            self._thread = None
        self.httpd.server_close()

    def __enter__(self) -> DashboardServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
