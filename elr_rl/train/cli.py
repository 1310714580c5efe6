"""`elr-rl pretrain CONFIG [key=value ...]` and `elr-rl sft CONFIG [key=value ...]`.

The subcommand sets `stage`; the YAML file and the overrides set everything
else (see elr_rl/train/config.py for every field and its meaning).
"""

from __future__ import annotations

import argparse
import json
import sys

MULTI_COMMAND = True  # elr_rl.cli passes the subcommand name first


def main(argv: list[str]) -> int:
    command, rest = argv[0], argv[1:]
    parser = argparse.ArgumentParser(
        prog=f"elr-rl {command}",
        description=f"{command} a looped model with mixed-depth training on DeepSpeed",
        epilog="example: elr-rl pretrain configs/pretrain_tiny.yaml run.total_steps=50 dist.world_size=2",
    )
    parser.add_argument("config", help="YAML file under configs/ (schema: elr_rl/train/config.py)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides, e.g. engine.zero_stage=2")
    args = parser.parse_args(rest)

    from elr_rl.config import load_config
    from elr_rl.train.config import TrainConfig

    try:
        cfg = load_config(TrainConfig, args.config, [f"stage={command}", *args.overrides])
    except ValueError as exc:
        print(f"elr-rl {command}: {exc}", file=sys.stderr)
        return 2
    from elr_rl.train.launch import launch

    summary = launch(cfg)
    if summary is not None:
        short = {k: v for k, v in summary.items() if k != "losses"}
        print(json.dumps(short, indent=1))
    return 0
