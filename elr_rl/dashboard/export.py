"""Static export: the dashboard page with its JS, CSS and the run's data in one HTML file.

The exported page needs no server and no network; it shows the run as it was
when exported (no polling).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from elr_rl.dashboard import data
from elr_rl.dashboard.server import STATIC_DIR

_SCRIPT_TAG = re.compile(r'<script src="static/([\w.-]+\.js)"></script>')
_STYLE_TAG = re.compile(r'<link rel="stylesheet" href="static/([\w.-]+\.css)">')
DATA_MARKER = "<!--ELR_STATIC_DATA-->"


def _inline_json(obj: object) -> str:
    """JSON safe inside a <script> element: every `<` (only ever inside strings) becomes `\\u003c`,
    so no `</script>` or `<!--` in the data can end or confuse the element."""
    return json.dumps(obj, allow_nan=False, separators=(",", ":")).replace("<", "\\u003c")


def _inline_text(text: str) -> str:
    """Our own JS/CSS inlined; guard against a literal closing tag inside it."""
    return text.replace("</script", "<\\/script").replace("</style", "<\\/style")


def render_static_html(run_dir: str | Path) -> str:
    """The page for `run_dir` with every asset and the data inlined."""
    page = (STATIC_DIR / "index.html").read_text(encoding="utf-8")
    page = _STYLE_TAG.sub(lambda m: "<style>\n" + _inline_text((STATIC_DIR / m.group(1)).read_text()) + "\n</style>",
                          page)
    page = _SCRIPT_TAG.sub(lambda m: "<script>\n" + _inline_text((STATIC_DIR / m.group(1)).read_text()) + "\n</script>",
                           page)
    payload = _inline_json(data.snapshot(Path(run_dir)))
    if DATA_MARKER not in page:
        raise RuntimeError(f"static/index.html lost its {DATA_MARKER} marker")
    return page.replace(DATA_MARKER, f"<script>window.ELR_STATIC = {payload};</script>")


def export_html(run_dir: str | Path, out_path: str | Path) -> Path:
    """Write the self-contained page for `run_dir` to `out_path` (parents created)."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise ValueError(f"run directory {str(run_dir)!r} does not exist: pass the folder holding metrics.jsonl")
    out = Path(out_path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(render_static_html(run_dir), encoding="utf-8")
    return out
