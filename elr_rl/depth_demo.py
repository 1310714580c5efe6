"""Elastic depth on the ladder: SFT -> (profile -> RL) -> held-out pass@1 per environment and k, two seeds.

    python -m elr_rl.depth_demo [RUN_DIR] [--seeds 0,1] [--steps 600] [--tasks 256] [--difficulties 1,2,4] [--rl]
    (scripts/depth_demo.sh runs this)

Per seed, every stage is the user-facing command (`elr-rl sft`, `eval`, `profile`, `rl`):
  loopwise    SFT with the loop-wise auxiliary loss on per-step targets, one K-loop pass per microbatch
  final_only  the baseline of the same steps and data: final-answer loss only, k ~ Uniform{1..K}
  with --rl, from `loopwise`: GRPO with the loop curriculum (alpha = 0.3), GRPO with uniform random k
  (alpha = 0), and continued SFT for as many optimizer steps (equal steps, not equal FLOPs).
Evaluation: greedy pass@1 on held-out seeds at each D of `--difficulties` (D = 1: one step, any k
should do; D = 4: the top of the training range), k = 1..4, `--tasks` tasks a cell. It ends with the
goal line for every D > 1: k = 4 minus k = 1 >= 15 points on at least 3 environments, on every seed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ENVS = ["ladder_pointer", "ladder_binding", "ladder_automaton", "ladder_nested"]
KS = [1, 2, 3, 4]
GOAL_GAP, GOAL_ENVS = 0.15, 3


def cli(title: str, args: list[str]) -> None:
    print(f"\n== {title}\n$ elr-rl {' '.join(args)}", flush=True)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "elr_rl.cli", *args], check=True)
    print(f"== {title}: {time.perf_counter() - t0:.0f} s", flush=True)


def sft(out: Path, seed: int, steps: int, extra: list[str], title: str) -> Path:
    cli(title, ["sft", "configs/sft_ladder.yaml", f"run.output_dir={out}", f"run.seed={seed}", f"data.seed={seed}",
                f"run.total_steps={steps}", "run.progress=false", *extra])
    return out / "final"


def evaluate(ckpt: Path, out: Path, tasks: int, difficulties: list[int]) -> dict:
    """{difficulty: rows} of `elr-rl eval` at each difficulty."""
    res = {}
    for d in difficulties:
        path = out / f"eval_d{d}.json"
        cli(f"eval {ckpt.parent.name} D={d}", ["eval", str(ckpt), "--envs", ",".join(ENVS), "--k",
                                                ",".join(map(str, KS)), "--difficulty", str(d), "-n", str(tasks),
                                                "--max-new-tokens", "24", "--json", str(path)])
        res[d] = json.loads(path.read_text())
    return res


def rl_stages(run: Path, seed: int, base: Path, rl_steps: int, tasks: int, dis: list[int]) -> dict[str, dict]:
    """GRPO (curriculum alpha 0.3 and 0) and continued SFT, each from the loop-wise SFT model."""
    table = run / "profile"
    envs = "[" + ",".join(ENVS) + "]"
    cli(f"seed {seed}: profile", ["profile", "configs/profile_tiny.yaml", f"checkpoint={base}", f"run_dir={run}",
                                  f"envs={envs}", "difficulties=[1,2,3,4]", "loop_counts=[1,2,3,4]",
                                  "seeds_per_difficulty=8", "max_tokens=24"])
    out = {}
    for name, alpha in (("rl_curriculum", 0.3), ("rl_uniform_k", 0.0)):
        cli(f"seed {seed}: {name}", ["rl", "configs/rl_tiny.yaml", f"model_path={base}", f"run.output_dir={run / name}",
                                     f"curriculum.profile_table={table}", f"curriculum.alpha={alpha}",
                                     f"envs.names={envs}", "envs.difficulties=[1,2,3,4]", "rollout.max_new_tokens=24",
                                     f"run.total_steps={rl_steps}", f"run.seed={seed}"])
        final = Path(json.loads((run / name / "summary.json").read_text())["final_checkpoint"])
        out[name] = evaluate(final, run / name, tasks, dis)
    cont = sft(run / "sft_continued", seed, rl_steps, [f"model.init_from={base}"], f"seed {seed}: continued SFT")
    out["sft_continued"] = evaluate(cont, run / "sft_continued", tasks, dis)
    return out


def cell(rows: list[dict], env: str, k: int, key: str = "pass_at_1") -> float:
    return next(r[key] for r in rows if r["env"] == env and r["k"] == k)


def report(results: dict[int, dict[str, dict]], seconds: float, difficulties: list[int]) -> dict:
    """Print pass@1 per (model, D, env, k) as a range over seeds, and the goal line."""
    seeds = sorted(results)
    models = list(results[seeds[0]])
    print(f"\n== held-out greedy pass@1 (min-max over seeds {seeds}; {seconds / 60:.1f} min in all)")
    for model in models:
        for d in difficulties:
            print(f"\n{model}, D={d}")
            print(f"{'environment':<18}" + "".join(f"{'k=' + str(k):>12}" for k in KS) + f"{'k4-k1':>14}")
            for env in ENVS:
                vals = [[cell(results[s][model][d], env, k) for s in seeds] for k in KS]
                gaps = [v4 - v1 for v1, v4 in zip(vals[0], vals[-1])]
                print(f"{env:<18}" + "".join(f"{min(v):>7.2f}-{max(v):.2f}" for v in vals)
                      + f"{min(gaps):>+9.2f}/{max(gaps):+.2f}")
            toks = [cell(results[s][model][d], e, k, "response_tokens") for s in seeds for e in ENVS for k in KS]
            print(f"{'response tokens':<18}{sum(toks) / len(toks):>12.1f} (mean over cells)")
    summary: dict[str, dict[int, list[str]]] = {}
    for model in models:
        for d in (d for d in difficulties if d > 1):
            met = [env for env in ENVS if all(cell(results[s][model][d], env, 4) - cell(results[s][model][d], env, 1)
                                              >= GOAL_GAP for s in seeds)]
            summary.setdefault(model, {})[d] = met
            verdict = "MET" if len(met) >= GOAL_ENVS and len(seeds) >= 2 else "NOT MET"
            print(f"GOAL {model} D={d}: k=4 minus k=1 >= {GOAL_GAP:.2f} on >= {GOAL_ENVS} environments on every "
                  f"seed (2 seeds at least): {verdict} ({len(met)} on seeds {seeds}: {', '.join(met) or 'none'})")
    return summary


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m elr_rl.depth_demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", default="runs/depth_demo")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--steps", type=int, default=600, help="SFT optimizer steps of each model")
    p.add_argument("--tasks", type=int, default=256, help="held-out tasks per (environment, k, D) cell")
    p.add_argument("--difficulties", default="1,2,4", help="task difficulties (serial steps) evaluated")
    p.add_argument("--rl", action="store_true", help="also profile -> RL (alpha 0.3 and 0) and continued SFT")
    p.add_argument("--rl-steps", type=int, default=30)
    args = p.parse_args(argv)
    run = Path(args.run)
    t0 = time.perf_counter()
    results: dict[int, dict[str, dict]] = {}
    dis = [int(d) for d in args.difficulties.split(",")]
    for seed in (int(s) for s in args.seeds.split(",")):
        base = run / f"seed{seed}"
        loopwise = sft(base / "loopwise", seed, args.steps, [], f"seed {seed}: SFT with loop-wise per-step targets")
        final_only = sft(base / "final_only", seed, args.steps,
                         ["loop_aux.weight=0", "loops.mode=independent", "loops.force_one_fraction=0"],
                         f"seed {seed}: SFT baseline, final answer only, uniform k")
        results[seed] = {"loopwise": evaluate(loopwise, base / "loopwise", args.tasks, dis),
                         "final_only": evaluate(final_only, base / "final_only", args.tasks, dis)}
        if args.rl:
            results[seed].update(rl_stages(base, seed, loopwise, args.rl_steps, args.tasks, dis))
    seconds = time.perf_counter() - t0
    met = report(results, seconds, dis)
    (run / "summary.json").write_text(json.dumps({"seconds": seconds, "goal_met_envs": met,
                                                  "results": {str(s): r for s, r in results.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
