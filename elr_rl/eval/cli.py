"""`elr-rl eval CHECKPOINT [CHECKPOINT ...] --envs a,b --k 1,2,3,4`: pass@1 and response tokens per k
(a table per checkpoint + JSON). Several checkpoints share one process, scoring pool and task set; their
JSON rows carry a "checkpoint" field.

`--loop-probe` instead reads out after every loop of one max(k)-loop pass, teacher-forced on the
reference response: per environment and difficulty, the answer's accuracy and (ladder
environments) each serial step's dense-target accuracy per loop (elr_rl.eval.loop_probe)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def _ints(text: str, flag: str) -> list[int]:
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"{flag} takes comma-separated integers, got {text!r}") from None


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="elr-rl eval", description=__doc__)
    p.add_argument("checkpoint", nargs="+", help="checkpoint folder(s); --loop-probe takes one")
    p.add_argument("--envs", default="even_odd", help="comma-separated environment names or YAML files of dataset environments")
    p.add_argument("--k", default="1,2,3,4", help="comma-separated loop counts")
    p.add_argument("--difficulty", default="1",
                   help="difficulty of the tasks, or several comma-separated (one engine start; rows per difficulty)")
    p.add_argument("-n", "--num-tasks", type=int, default=32)
    p.add_argument("--seed-offset", type=int, default=100_000, help="first held-out seed")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--max-num-seqs", type=int, default=64,
                   help="sequences the engine decodes at once (faster for a small model; its KV cache grows with it)")
    p.add_argument("--samples", type=int, default=0,
                   help="also estimate sampled pass@1 from this many completions per task (0: greedy only)")
    p.add_argument("--temperature", type=float, default=1.0, help="temperature of the sampled pass@1")
    p.add_argument("--system-prompt", help="a system message before every prompt (chat template)")
    p.add_argument("--thinking", choices=["on", "off"], help="thinking switch of templates that have one")
    p.add_argument("--sandbox-tier", default="bwrap", choices=["bwrap", "unshare", "rlimit"],
                   help="sandbox tier for environments that run model-written code (checked before the engine starts)")
    p.add_argument("--allow-weaker-tier", action="store_true",
                   help="accept a weaker sandbox tier when --sandbox-tier cannot run here (printed)")
    p.add_argument("--json", help="also write the rows to this JSON file")
    p.add_argument("--loop-probe", action="store_true",
                   help="per-loop teacher-forced readout accuracy of one max(--k)-loop pass (PyTorch, no engine): "
                        "where the loops stop carrying out serial steps")
    p.add_argument("--device", default="cpu", help="torch device of --loop-probe")
    args = p.parse_args(argv)
    if args.loop_probe:
        return _loop_probe(args)
    from elr_rl.eval.evaluate import EvalConfig, evaluate, format_table, held_out_tasks
    from elr_rl.text import ChatOptions, TextCodec
    from environments.sandbox_tier import SandboxConfig, SandboxUnavailable

    for ckpt in args.checkpoint:
        if not (Path(ckpt) / "config.json").is_file():
            print(f"elr-rl eval: {ckpt!r} is not a checkpoint folder (no config.json)")
            return 2
    try:
        from elr_rl.model.safetensors_check import check_checkpoint_files
        from environments.pool import ScoringPool

        for ckpt in args.checkpoint:
            check_checkpoint_files(ckpt)  # before any engine starts
        cfg = EvalConfig(envs=[e for e in args.envs.split(",") if e], ks=_ints(args.k, "--k"),
                         difficulties=_ints(args.difficulty, "--difficulty"), num_tasks=args.num_tasks, seed_offset=args.seed_offset,
                         max_new_tokens=args.max_new_tokens, max_num_seqs=args.max_num_seqs, samples=args.samples, temperature=args.temperature,
                         chat=ChatOptions(args.system_prompt, None if args.thinking is None else args.thinking == "on"),
                         sandbox=SandboxConfig(args.sandbox_tier, args.allow_weaker_tier))
        cfg.validate()
        for ckpt in args.checkpoint:
            TextCodec.load(ckpt, cfg.chat)  # every tokenizer loads before the first engine starts
        tasks = held_out_tasks(cfg)
        rows = []
        with ScoringPool(2) as pool:
            for ckpt in args.checkpoint:
                got = evaluate(ckpt, cfg, pool=pool, tasks=tasks)
                print(format_table(got, f"held-out pass@1 of {ckpt}"), flush=True)
                rows += [{"checkpoint": ckpt, **r} for r in got]
    except (ValueError, SandboxUnavailable) as exc:
        print(f"elr-rl eval: {exc}")
        return 2
    payload = json.dumps(rows, indent=2)
    if args.json:
        Path(args.json).write_text(payload)
    print(payload)
    return 0


def _loop_probe(args) -> int:
    from elr_rl.eval.loop_probe import format_probe, probe

    if len(args.checkpoint) > 1:
        print("elr-rl eval: --loop-probe takes one checkpoint; run it once per checkpoint")
        return 2
    args.checkpoint = args.checkpoint[0]
    if not (Path(args.checkpoint) / "config.json").is_file():
        print(f"elr-rl eval: {args.checkpoint!r} is not a checkpoint folder (no config.json)")
        return 2
    try:
        ks = _ints(args.k, "--k")
        if not ks:
            raise ValueError("--k names no loop count")
        rows = probe(args.checkpoint, [e for e in args.envs.split(",") if e], _ints(args.difficulty, "--difficulty"),
                     args.num_tasks, seed_offset=args.seed_offset, loops=max(ks), device=args.device)
    except ValueError as exc:
        print(f"elr-rl eval: {exc}")
        return 2
    print(format_probe(rows, f"loop probe of {args.checkpoint}: teacher-forced accuracy of the readout after each "
                             f"loop of one {max(ks)}-loop pass ({args.num_tasks} held-out tasks a row)"))
    if json.loads((Path(args.checkpoint) / "config.json").read_text()).get("loop_conditioning"):
        print("note: this checkpoint conditions its loops on the loop count, so loop i's readout of a "
              f"{max(ks)}-loop pass is not the model run at k = i")
    if args.json:
        Path(args.json).write_text(json.dumps([r.as_dict() for r in rows], indent=2))
    return 0
