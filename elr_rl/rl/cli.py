"""`elr-rl rl CONFIG [key=value ...]`: asynchronous GRPO on Ray with the loop curriculum."""

from __future__ import annotations

import argparse
import json
import logging


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="elr-rl rl", description=__doc__)
    p.add_argument("config", help="YAML config (see configs/rl_tiny.yaml)")
    p.add_argument("overrides", nargs="*", help="config overrides as key=value, e.g. run.total_steps=50")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from elr_rl.config import load_config
    from elr_rl.rl.config import RLConfig

    from environments.sandbox import SandboxUnavailable

    try:
        cfg = load_config(RLConfig, args.config, args.overrides)
        tier = cfg.sandbox.apply()  # the tier for this run, fixed before Ray starts
    except (ValueError, SandboxUnavailable) as exc:
        print(f"elr-rl rl: {exc}")
        return 2
    print(f"sandbox tier: {tier} (configured {cfg.sandbox.tier}, allow_weaker_tier={cfg.sandbox.allow_weaker_tier})")
    from elr_rl.rl.driver import Driver

    summary = Driver(cfg).run()
    print(json.dumps(summary, indent=2))
    print(f"metrics: {cfg.run.output_dir}/metrics.jsonl   dashboard: elr-rl dashboard {cfg.run.output_dir}")
    return 0
