"""The `elr-rl` command line: `elr-rl SUBCOMMAND [args...]`.

Each subcommand lives in its own module with a `main(argv) -> int` function and
owns its argument parser. Modules are imported only when their subcommand runs,
so `elr-rl envs list` never pays for importing vLLM or DeepSpeed.
"""

from __future__ import annotations

import importlib
import sys

# name -> (module, one-line help). Each module defines `main(argv: list[str]) -> int`.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "model": ("elr_rl.model.cli", "build (random or with a given tokenizer), inspect and demo looped-model checkpoints"),
    "pretrain": ("elr_rl.train.cli", "pretrain a looped model with mixed-depth training (DeepSpeed)"),
    "sft": ("elr_rl.train.cli", "supervised fine-tuning with loss on responses only (DeepSpeed)"),
    "rl": ("elr_rl.rl.cli", "asynchronous GRPO on Ray with the loop curriculum"),
    "profile": ("elr_rl.profile.cli", "profile prompt pass rates per loop count with vLLM"),
    "envs": ("environments.cli", "list, sample and check the reward environments"),
    "dashboard": ("elr_rl.dashboard.cli", "serve the loop-curriculum dashboard for a run directory"),
    "eval": ("elr_rl.eval.cli", "evaluate a checkpoint across loop counts"),
}


def _usage() -> str:
    lines = ["usage: elr-rl SUBCOMMAND [args...]", "", "subcommands:"]
    width = max(len(n) for n in SUBCOMMANDS)
    for name, (_, help_text) in SUBCOMMANDS.items():
        lines.append(f"  {name.ljust(width)}  {help_text}")
    lines.append("")
    lines.append("Run `elr-rl SUBCOMMAND --help` for the options of one subcommand.")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(_usage())
        return 0
    name, rest = argv[0], argv[1:]
    if name not in SUBCOMMANDS:
        print(f"elr-rl: unknown subcommand {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    module_name, _ = SUBCOMMANDS[name]
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            print(f"elr-rl: subcommand {name!r} is not available in this build ({exc})", file=sys.stderr)
            return 2
        raise
    # Modules serving several subcommands (pretrain/sft) receive the name first.
    if getattr(module, "MULTI_COMMAND", False):
        return int(module.main([name, *rest]) or 0)
    return int(module.main(rest) or 0)


if __name__ == "__main__":
    raise SystemExit(main())
