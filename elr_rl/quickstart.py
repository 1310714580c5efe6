"""The whole pipeline on tiny CPU defaults: pretrain -> SFT -> profile -> RL -> evaluate at k = 1..4.

    python -m elr_rl.quickstart [RUN_DIR]      (scripts/quickstart.sh runs this after set-up)

Every stage is the user-facing command (`elr-rl pretrain`, `sft`, `profile`, `rl`,
`eval`) with overrides, so what the quickstart does is what a user would type.
It ends with pass@1 per environment and k before and after RL and the dashboard command.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

ENVS = ["even_odd", "arith_multidigit"]


def stage(n: int, title: str, args: list[str]) -> None:
    print(f"\n== {n}/6 {title}\n$ elr-rl {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "elr_rl.cli", *args], check=True)
    print(f"== {title}: {time.perf_counter() - t0:.0f} s", flush=True)


def latest(train_dir: Path) -> Path:
    """The newest checkpoint of a pretrain/SFT run (named by checkpoints/latest)."""
    marker = train_dir / "checkpoints" / "latest"
    if not marker.is_file():
        raise SystemExit(f"no checkpoint in {train_dir}: the stage before failed")
    return train_dir / "checkpoints" / marker.read_text().strip()


def main(argv: list[str]) -> int:
    run = Path(argv[0] if argv else "runs/quickstart")
    run.mkdir(parents=True, exist_ok=True)
    envs = ",".join(ENVS)
    env_list = "[" + ",".join(ENVS) + "]"
    t0 = time.perf_counter()
    stage(1, "pretraining with delayed mixed depth", [
        "pretrain", "configs/pretrain_tiny.yaml", f"run.output_dir={run}/pretrain", "loops.delay_fraction=0.3",
        "data.generators=[addition,sorting,pointer_chase,counting,env:even_odd,env:arith_multidigit]",
        "data.max_difficulty=1",
    ])
    pre = latest(run / "pretrain")
    stage(2, "SFT (loss on responses only)", [
        "sft", "configs/sft_tiny.yaml", f"model.init_from={pre}", f"run.output_dir={run}/sft",
        "data.generators=[env:even_odd,env:arith_multidigit]", "data.max_difficulty=1", "run.total_steps=400",
        "optim.lr=0.003",
        # Every task is shown with its right answer and, 80% of the time, a wrong one next to it: SFT
        # teaches the format and leaves a hesitant policy (about 60% right) for RL to sharpen.
        "data.env_wrong_answer_fraction=0.4",
    ])
    sft = latest(run / "sft")
    stage(3, "pass-rate profiling at every k", [
        "profile", "configs/profile_tiny.yaml", f"checkpoint={sft}", f"run_dir={run}/rl", f"envs={env_list}",
        "difficulties=[1]", "loop_counts=[1,2,3,4]", "seeds_per_difficulty=8", "max_tokens=48",
    ])
    stage(4, "evaluation before RL", ["eval", str(sft), "--envs", envs, "--samples", "8",
                                      "--json", str(run / "eval_before.json")])
    stage(5, "asynchronous GRPO with the loop curriculum", [
        "rl", "configs/rl_tiny.yaml", f"model_path={sft}", f"run.output_dir={run}/rl",
        # RL where the SFT model has signal (arith_multidigit stays at pass@1 0 at this size: its groups
        # would all be uninformative); both environments are evaluated before and after.
        f"curriculum.profile_table={run}/rl/profile", "envs.names=[even_odd]", "envs.difficulties=[1]",
        "run.total_steps=40",
    ])
    final = json.loads((run / "rl" / "summary.json").read_text())["final_checkpoint"]
    stage(6, "evaluation after RL", ["eval", str(final), "--envs", envs, "--samples", "8",
                                     "--json", str(run / "eval_after.json")])
    print_report(run, time.perf_counter() - t0)
    return 0


def print_report(run: Path, seconds: float) -> None:
    before = {(r["env"], r["k"]): r for r in json.loads((run / "eval_before.json").read_text())}
    after = {(r["env"], r["k"]): r for r in json.loads((run / "eval_after.json").read_text())}
    ks = sorted({k for _, k in before})
    envs = sorted({e for e, _ in before})
    print(f"\n== held-out pass@1 before -> after RL ({seconds / 60:.1f} min in all)")
    for key, what in (("pass_at_1", "greedy"), ("pass_at_1_sampled", "sampled, 8 per task at temperature 1")):
        print(f"\n{what}")
        print(f"{'environment':<18}" + "".join(f"{'k=' + str(k):>16}" for k in ks))
        for env in envs:
            cells = [f"{before[env, k][key]:.2f} -> {after[env, k][key]:.2f}" for k in ks]
            print(f"{env:<18}" + "".join(f"{c:>16}" for c in cells))
    print(f"{'resp. tokens':<18}" + "".join(
        f"{sum(after[e, k]['response_tokens'] for e in envs) / len(envs):>16.1f}" for k in ks))
    print(f"\nwatch the run: elr-rl dashboard {run / 'rl'}")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
