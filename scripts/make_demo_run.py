#!/usr/bin/env python
"""Write a synthetic, deterministic recorded run directory for the dashboard.

    python scripts/make_demo_run.py runs/demo [--steps 60] [--seed 0] [--no-tensorboard]
    elr-rl dashboard runs/demo

    python scripts/make_demo_run.py runs/demo-all --collection   # sft + two RL runs to overlay
    elr-rl dashboard runs/demo-all

With --live SECONDS it keeps appending one step every SECONDS after the
initial steps, imitating a run in progress (Ctrl-C to stop).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from elr_rl.dashboard.demo import DemoSpec, make_demo_collection, make_demo_run, write_steps


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run_dir", type=Path, help="directory to create (must not hold a run already)")
    p.add_argument("--steps", type=int, default=60, help="steps to record")
    p.add_argument("--seed", type=int, default=0, help="seed of every random draw")
    p.add_argument("--no-tensorboard", action="store_true", help="skip TensorBoard event files")
    p.add_argument("--live", type=float, default=None, metavar="SECONDS",
                   help="after the initial steps, append one step every SECONDS until interrupted")
    p.add_argument("--collection", action="store_true",
                   help="write a folder of runs instead (sft, rl, rl_uniform), as the quickstart leaves one")
    args = p.parse_args(argv)
    spec = DemoSpec(seed=args.seed)
    if args.collection:
        try:
            make_demo_collection(args.run_dir, steps=args.steps)
        except ValueError as exc:
            print(f"make_demo_run: {exc}", file=sys.stderr)
            return 2
        print(f"wrote demo runs to {args.run_dir}: sft, rl, rl_uniform ({args.steps} steps each)")
        return 0
    try:
        make_demo_run(args.run_dir, steps=args.steps, spec=spec, tensorboard=not args.no_tensorboard)
    except ValueError as exc:
        print(f"make_demo_run: {exc}", file=sys.stderr)
        return 2
    print(f"wrote demo run to {args.run_dir} ({args.steps} steps)")
    step = args.steps
    try:
        while args.live is not None:
            time.sleep(args.live)
            write_steps(args.run_dir, step, 1, spec, tensorboard=not args.no_tensorboard)
            print(f"appended step {step}", flush=True)
            step += 1
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
