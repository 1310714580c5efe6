"""`elr-rl dashboard RUN_DIR [--host H] [--port N] [--export FILE.html]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="elr-rl dashboard",
        description="Serve the loop-curriculum dashboard for a run directory (live while the run writes), "
        "or export it to one self-contained HTML file.",
    )
    p.add_argument("run_dir", type=Path, help="the run directory (holds metrics.jsonl, profile/, curriculum/)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0 to share on the network)")
    p.add_argument("--port", type=int, default=8765, help="port to listen on (0 picks a free one)")
    p.add_argument("--export", type=Path, metavar="FILE.html", default=None,
                   help="write a self-contained HTML snapshot of the run and exit instead of serving")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if args.export is not None:
        from elr_rl.dashboard.export import export_html

        try:
            out = export_html(args.run_dir, args.export)
        except ValueError as exc:
            print(f"elr-rl dashboard: {exc}", file=sys.stderr)
            return 2
        print(f"wrote {out} ({out.stat().st_size / 1e6:.2f} MB)")
        return 0
    if not 0 <= args.port <= 65535:
        print(f"elr-rl dashboard: --port must be in 0..65535, got {args.port}", file=sys.stderr)
        return 2
    from elr_rl.dashboard.server import DashboardServer

    if not args.run_dir.is_dir():
        # Not fatal: a run about to start has no directory yet; the page says so and keeps polling.
        print(f"warning: {args.run_dir} is not a directory yet; the page will show the run once it appears",
              file=sys.stderr)
    try:
        server = DashboardServer(args.run_dir, host=args.host, port=args.port)
    except OSError as exc:
        print(f"elr-rl dashboard: cannot listen on {args.host}:{args.port} ({exc}); pick another --port",
              file=sys.stderr)
        return 2
    print(f"dashboard for {args.run_dir} at {server.url}  (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.close()
    return 0
