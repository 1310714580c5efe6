"""Elastic depth on the ladder: SFT -> (profile -> RL) -> held-out pass@1 per environment and k, two seeds.

    python -m elr_rl.depth_demo [RUN_DIR] [--seeds 0,1] [--steps 2000] [--tasks 256] [--difficulties 1,2,3]
                                [--envs ladder_automaton,...] [--max-difficulty 3] [--targets chain]
                                [--rl [--rl-steps 40] [--loop-credit 0] [--rl-prompts 4096] [--rl-loops 1,2,3,4]]
                                [--rl-from RUN_DIR] [--no-baseline] [--jobs 2]
    (scripts/depth_demo.sh runs this)

Per seed, every stage is the user-facing command (`elr-rl sft`, `eval`, `profile`, `rl`):
  loopwise    SFT with the loop-wise auxiliary loss, one K-loop pass per microbatch, on chain targets
              (each step's value where the prompt lays it out, and below its depth the partial value
              each loop can hold there; `--targets dense`: without the partial ones; `--targets steps`:
              the answer after min(i, D) steps at the answer)
  final_only  the baseline of the same steps and data: final-answer loss only, k ~ Uniform{1..K}
              (`--no-baseline` skips it: SFT is deterministic, so the demo without --rl on the same
              seeds trains the same loop-wise model and prints the baseline next to it)
  with --rl, from `loopwise`: GRPO with the loop curriculum (alpha = 0.3), GRPO with uniform random k
  (alpha = 0), and continued SFT for as many optimizer steps (equal steps, not equal FLOPs), all three
  at the top training difficulty and one learning rate (RL_LR); --rl-from RUN_DIR runs only these (and the
  start model's eval), from the loop-wise models an earlier demo left in RUN_DIR, on --envs.
Evaluation: greedy pass@1 on held-out seeds at each D of `--difficulties` (D = 1: one step, any k
should do; D = 3: the top of the training range), k = 1..4, `--tasks` tasks a cell, by one `elr-rl eval`
of every model at the end (the two SFT models, with --rl also the RL stages' three), 256 sequences a
batch. It ends with the goal line for every D > 1: k = 4 minus k = 1 >= 15 points on at least 3
environments, on every seed, and the environments where loop-wise k = 4 beats the baseline's best k by
15 points on every seed; then, per seed, where the loop-wise model's depth stops (`elr-rl eval
--loop-probe` at the top D).
Seeds run side by side (`--jobs`), each command on one thread; every command's output goes to a log
in its stage's folder, and a stage that fails stops the demo with the end of its log.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

ENVS = ["ladder_pointer", "ladder_binding", "ladder_automaton", "ladder_nested", "ladder_tail"]
DEFAULT_ENVS = ["ladder_binding", "ladder_automaton", "ladder_nested", "ladder_tail"]  # the ones with dense targets
TARGETS = ("dense", "chain", "steps")
KS = [1, 2, 3, 4]
GOAL_GAP, GOAL_ENVS = 0.15, 3
# The baseline: the same data and steps, the final answer's loss only, k ~ Uniform{1..K} per microbatch.
FINAL_ONLY = ["loop_aux.weight=0", "loops.mode=independent", "loops.force_one_fraction=0"]
# RL and its continued-SFT baseline from the loop-wise model: one learning rate for both, no warm-up (SFT's
# from-scratch 0.01 undid the automaton in 30 steps: D = 3 at k = 4 0.92 -> 0.61).
RL_LR = 2e-4


def cli(title: str, args: list[str], log: Path, threads: int | None = None) -> None:
    """Run `elr-rl ARGS` with its output in `log`; print the command, the time, and the log's tail if it fails."""
    log.parent.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, **({"OMP_NUM_THREADS": str(threads)} if threads else {}))
    print(f"== {title}: elr-rl {' '.join(args)}  (log: {log})", flush=True)
    t0 = time.perf_counter()
    with log.open("w") as f:
        rc = subprocess.run([sys.executable, "-m", "elr_rl.cli", *args], stdout=f, stderr=subprocess.STDOUT,
                            env=env).returncode
    if rc:
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"{title} failed (exit {rc}); the end of {log}:\n{tail}")
    print(f"== {title}: done in {time.perf_counter() - t0:.0f} s", flush=True)


@dataclass
class SeedRun:
    """One seed's pipeline: every stage is an `elr-rl` command whose output goes to a log under `root`."""

    root: Path
    seed: int
    tasks: int
    difficulties: list[int]
    threads: int | None = None  # OMP_NUM_THREADS of its commands (1 when seeds run side by side)
    envs: tuple[str, ...] = tuple(DEFAULT_ENVS)  # the ladder environments trained and evaluated
    max_difficulty: int = 3  # training documents have D = 1..max_difficulty serial steps
    targets: str = "chain"  # loop_aux.targets of the loop-wise model
    loop_credit: float = 0.0  # algo.loop_credit of the RL stages (RLTT-style credit for the shallower loops)
    rl_prompts: int = 4096  # envs.num_seeds of the RL stages: 64 (replayed ~15 times in 60 steps) cost k = 4 points
    rl_loops: tuple[int, ...] = tuple(KS)  # curriculum.loop_counts of the RL stages
    probe_rows: list = field(default_factory=list)  # the loop-wise model's `eval --loop-probe` rows

    def run(self, title: str, args: list[str], log: Path) -> None:
        cli(f"seed {self.seed}: {title}", args, log, self.threads)

    def sft(self, name: str, steps: int, extra: list[str], title: str) -> Path:
        out = self.root / name
        self.run(title, ["sft", "configs/sft_ladder.yaml", f"run.output_dir={out}", f"run.seed={self.seed}",
                         f"data.seed={self.seed}", f"run.total_steps={steps}", "run.progress=false",
                         "data.generators=[" + ",".join(f"env:{e}" for e in self.envs) + "]",
                         f"data.max_difficulty={self.max_difficulty}", *extra],
                 out / "sft.log")
        return out / "final"

    def evaluate(self, stages: dict[str, tuple[Path, Path]]) -> dict[str, dict[int, list[dict]]]:
        """{stage: {difficulty: rows}} of one `elr-rl eval` of every stage's checkpoint (one process, one task
        set) over every difficulty; stage -> (checkpoint, folder), each folder gets its rows' eval.json."""
        names = list(stages)
        first = stages[names[0]][1]
        path = first / ("eval.json" if len(names) == 1 else "eval_" + "+".join(names) + ".json")
        self.run(f"eval {', '.join(names)}",
                 ["eval", *(str(ckpt) for ckpt, _ in stages.values()), "--envs", ",".join(self.envs),
                  "--k", ",".join(map(str, KS)), "--difficulty", ",".join(map(str, self.difficulties)),
                  "-n", str(self.tasks), "--max-new-tokens", "24", "--max-num-seqs", "256", "--json", str(path)],
                 first / ("eval.log" if len(names) == 1 else "eval_" + "+".join(names) + ".log"))
        rows = json.loads(path.read_text())
        out = {}
        for name, (ckpt, folder) in stages.items():
            mine = [r for r in rows if r["checkpoint"] == str(ckpt)]
            (folder / "eval.json").write_text(json.dumps(mine, indent=2))
            out[name] = {d: [r for r in mine if r["difficulty"] == d] for d in self.difficulties}
        return out

    def loop_probe(self, ckpt: Path, out: Path) -> list[dict]:
        """`elr-rl eval --loop-probe` at the top evaluated difficulty: per-loop teacher-forced accuracy of the
        answer and of each serial step (where the loops stop carrying out steps)."""
        path, d = out / "loop_probe.json", max(self.difficulties)
        self.run(f"loop probe {out.name}", ["eval", str(ckpt), "--loop-probe", "--envs", ",".join(self.envs),
                                            "--k", ",".join(map(str, KS)), "--difficulty", str(d),
                                            "-n", str(min(self.tasks, 128)), "--json", str(path)],
                 out / "loop_probe.log")
        return json.loads(path.read_text())

    def rl_stages(self, base: Path, rl_steps: int) -> dict[str, tuple[Path, Path]]:
        """profile, then GRPO (curriculum alpha 0.3 and uniform k) and continued SFT, each from `base`: as many
        steps at one learning rate (RL_LR, no warm-up), on the top training difficulty (the lower ones are
        solved at every k there, so their groups would carry no signal). {stage: (checkpoint, folder)}."""
        table = self.root / "profile"
        envs = "[" + ",".join(self.envs) + "]"
        levels = "[" + ",".join(str(d) for d in range(1, self.max_difficulty + 1)) + "]"
        top = self.max_difficulty
        self.run("profile", ["profile", "configs/profile_tiny.yaml", f"checkpoint={base}", f"run_dir={self.root}",
                             f"envs={envs}", f"difficulties={levels}", "loop_counts=[1,2,3,4]",
                             "seeds_per_difficulty=8", "max_tokens=24"], self.root / "profile.log")
        finals = {}
        for name, alpha in (("rl_curriculum", 0.3), ("rl_uniform_k", 0.0)):
            run = self.root / name
            self.run(name, ["rl", "configs/rl_tiny.yaml", f"model_path={base}", f"run.output_dir={run}",
                            f"curriculum.profile_table={table}", f"curriculum.alpha={alpha}", f"envs.names={envs}",
                            f"envs.difficulties=[{top}]", "rollout.max_new_tokens=24", f"run.total_steps={rl_steps}",
                            f"run.save_interval={rl_steps}", f"learner.optim.lr={RL_LR}", f"run.seed={self.seed}",
                            f"algo.loop_credit={self.loop_credit}", f"envs.num_seeds={self.rl_prompts}",
                            "curriculum.loop_counts=[" + ",".join(map(str, self.rl_loops)) + "]"],
                     run / "rl.log")
            finals[name] = (Path(json.loads((run / "summary.json").read_text())["final_checkpoint"]), run)
        cont = self.sft("sft_continued", rl_steps, [f"model.init_from={base}", f"optim.lr={RL_LR}",
                                                    "schedule.warmup_steps=0", f"data.min_difficulty={top}"],
                        "continued SFT")
        return {**finals, "sft_continued": (cont, self.root / "sft_continued")}

    def pipeline(self, steps: int, rl: bool, rl_steps: int, rl_from: Path | None = None,
                 baseline: bool = True) -> dict[str, dict]:
        if rl_from is not None:  # the RL stages only, from an earlier demo's loop-wise model of this seed
            base = rl_from / f"seed{self.seed}" / "loopwise" / "final"
            if not (base / "config.json").is_file():
                raise RuntimeError(f"--rl-from {rl_from}: no loop-wise model of seed {self.seed} at {base} (run the "
                                   f"demo with --seeds {self.seed} into {rl_from} first)")
            return self.evaluate({"loopwise": (base, self.root / "loopwise"), **self.rl_stages(base, rl_steps)})
        loopwise = self.sft("loopwise", steps, [f"loop_aux.targets={self.targets}"],
                            f"SFT with loop-wise {self.targets} targets")
        stages = {"loopwise": (loopwise, self.root / "loopwise")}
        if baseline:
            stages["final_only"] = (self.sft("final_only", steps, FINAL_ONLY,
                                             "SFT baseline, final answer only, uniform k"), self.root / "final_only")
        self.probe_rows = self.loop_probe(loopwise, self.root / "loopwise")
        if rl:  # every model in one eval process at the end: one start-up and one task set for all five
            stages.update(self.rl_stages(loopwise, rl_steps))
        return self.evaluate(stages)


def cell(rows: list[dict], env: str, k: int, key: str = "pass_at_1") -> float:
    return next(r[key] for r in rows if r["env"] == env and r["k"] == k)


def report(results: dict[int, dict[str, dict]], seconds: float, difficulties: list[int],
           envs: list[str] | tuple[str, ...] = tuple(DEFAULT_ENVS)) -> dict:
    """Print pass@1 per (model, D, env, k) as a range over seeds, and the goal line."""
    seeds = sorted(results)
    models = list(results[seeds[0]])
    print(f"\n== held-out greedy pass@1 (min-max over seeds {seeds}; {seconds / 60:.1f} min in all)")
    for model in models:
        for d in difficulties:
            print(f"\n{model}, D={d}")
            print(f"{'environment':<18}" + "".join(f"{'k=' + str(k):>12}" for k in KS) + f"{'k4-k1':>14}")
            for env in envs:
                vals = [[cell(results[s][model][d], env, k) for s in seeds] for k in KS]
                gaps = [v4 - v1 for v1, v4 in zip(vals[0], vals[-1])]
                print(f"{env:<18}" + "".join(f"{min(v):>7.2f}-{max(v):.2f}" for v in vals)
                      + f"{min(gaps):>+9.2f}/{max(gaps):+.2f}")
            toks = [cell(results[s][model][d], e, k, "response_tokens") for s in seeds for e in envs for k in KS]
            print(f"{'response tokens':<18}{sum(toks) / len(toks):>12.1f} (mean over cells)")
    summary: dict[str, dict[int, list[str]]] = {}
    for model in models:
        for d in (d for d in difficulties if d > 1):
            met = [env for env in envs if all(cell(results[s][model][d], env, 4) - cell(results[s][model][d], env, 1)
                                              >= GOAL_GAP for s in seeds)]
            summary.setdefault(model, {})[d] = met
            verdict = "MET" if len(met) >= GOAL_ENVS and len(seeds) >= 2 else "NOT MET"
            print(f"GOAL {model} D={d}: k=4 minus k=1 >= {GOAL_GAP:.2f} on >= {GOAL_ENVS} environments on every "
                  f"seed (2 seeds at least): {verdict} ({len(met)} on seeds {seeds}: {', '.join(met) or 'none'})")
    if {"loopwise", "final_only"} <= set(models):  # the gap must come from k = 4 rising, not k = 1 falling
        for d in (d for d in difficulties if d > 1):
            above = [env for env in envs if all(
                cell(results[s]["loopwise"][d], env, 4) - max(cell(results[s]["final_only"][d], env, k) for k in KS)
                >= GOAL_GAP for s in seeds)]
            summary.setdefault("loopwise_above_final_only", {})[d] = above
            print(f"ABOVE BASELINE D={d}: loopwise k=4 >= final_only at its best k + {GOAL_GAP:.2f} on every seed: "
                  f"{len(above)} environments ({', '.join(above) or 'none'})")
    return summary


def probe_report(probes: dict[int, list[dict]]) -> None:
    """Per seed and environment, the loop-wise model's teacher-forced answer accuracy after each loop and each
    serial step's accuracy at the loop that first has to know it (from `SeedRun.loop_probe`)."""
    if not any(probes.values()):
        return
    d = next(r["difficulty"] for rows in probes.values() for r in rows)
    print(f"\n== where the loop-wise model's depth stops, D={d} (`elr-rl eval CKPT --loop-probe`: teacher-forced "
          "readout after each loop of one 4-loop pass)")
    for seed, rows in sorted(probes.items()):
        for env in dict.fromkeys(r["env"] for r in rows):
            mine = {r["target"]: r["accuracy"] for r in rows if r["env"] == env}
            steps = sorted((int(t.split()[1]), acc) for t, acc in mine.items() if t.startswith("step "))
            fmt = lambda a: "-" if a is None else f"{a:.2f}"  # noqa: E731
            print(f"seed {seed}  {env:<18} answer after loop 1..4: {'/'.join(fmt(a) for a in mine['answer'])}"
                  + (f"   step s after loop s: {' '.join(fmt(acc[s - 1]) for s, acc in steps)}" if steps else ""))


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m elr_rl.depth_demo", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", default="runs/depth_demo")
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--steps", type=int, default=2000, help="SFT optimizer steps of each model")
    p.add_argument("--tasks", type=int, default=256, help="held-out tasks per (environment, k, D) cell")
    p.add_argument("--difficulties", default="1,2,3", help="task difficulties (serial steps) evaluated")
    p.add_argument("--envs", default=",".join(DEFAULT_ENVS), help="ladder environments to train and evaluate")
    p.add_argument("--max-difficulty", type=int, default=3, help="training documents have D = 1..this serial steps")
    p.add_argument("--targets", default="chain", choices=TARGETS, help="loop_aux.targets of the loop-wise model")
    p.add_argument("--rl", action="store_true", help="also profile -> RL (alpha 0.3 and 0) and continued SFT")
    p.add_argument("--rl-steps", type=int, default=40)
    p.add_argument("--no-baseline", action="store_true",
                   help="skip the final-answer-only model (its rows: the demo without --rl on the same seeds, "
                        "whose SFT gives the same loop-wise model)")
    p.add_argument("--rl-from", default=None, metavar="RUN_DIR",
                   help="skip SFT: run the RL stages (and their baselines) from RUN_DIR/seedN/loopwise/final, an "
                        "earlier demo's loop-wise models, on --envs")
    p.add_argument("--loop-credit", type=float, default=0.0,
                   help="algo.loop_credit of the RL stages: the shallower loops' readouts share each sample's advantage")
    p.add_argument("--rl-prompts", type=int, default=4096,
                   help="prompts per environment and difficulty in the RL pool (envs.num_seeds)")
    p.add_argument("--rl-loops", default="1,2,3,4", help="loop counts the RL stages may assign (curriculum.loop_counts)")
    p.add_argument("--jobs", type=int, default=2,
                   help="seeds run side by side, each command on one thread when > 1 (a tiny model gains "
                        "more from a core of its own than from two threads)")
    args = p.parse_args(argv)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.jobs < 1 or args.steps < 1 or args.tasks < 1 or args.max_difficulty < 1:
        raise SystemExit("depth_demo: --jobs, --steps, --tasks and --max-difficulty must be >= 1")
    try:
        rl_loops = tuple(int(k) for k in args.rl_loops.split(","))
    except ValueError:
        rl_loops = ()
    if not rl_loops or any(k not in KS for k in rl_loops) or args.rl_prompts < 1:
        raise SystemExit(f"depth_demo: --rl-loops {args.rl_loops!r} / --rl-prompts {args.rl_prompts}: give loop counts "
                         f"from {KS} separated by commas, and at least one prompt")
    envs = tuple(e.strip() for e in args.envs.split(",") if e.strip())
    unknown = [e for e in envs if e not in ENVS]
    if not envs or unknown:
        raise SystemExit(f"depth_demo: --envs {args.envs!r}: choose from the ladder environments {', '.join(ENVS)} "
                         "(they carry the per-step targets the loop-wise loss needs)")
    if args.targets in ("dense", "chain"):
        from environments.registry import get_env

        plain = [e for e in envs if not get_env(e).dense_targets(get_env(e).generate(0, 1))]
        if plain:  # the trainer counts them too (data/no_loop_targets); say it before 20 minutes are spent
            print(f"depth_demo: {', '.join(plain)} lay out no chain in the prompt (no dense targets): the loop-wise "
                  "model trains them on their own targets at every loop; --targets steps gives them per-step ones",
                  flush=True)
    run = Path(args.run)
    t0 = time.perf_counter()
    runs = [SeedRun(run / f"seed{s}", s, args.tasks, [int(d) for d in args.difficulties.split(",")],
                    1 if args.jobs > 1 else None, envs, args.max_difficulty, args.targets,
                    loop_credit=args.loop_credit, rl_prompts=args.rl_prompts, rl_loops=rl_loops) for s in seeds]
    with ThreadPoolExecutor(args.jobs) as pool:
        futures = [pool.submit(r.pipeline, args.steps, args.rl, args.rl_steps,
                               Path(args.rl_from) if args.rl_from else None, not args.no_baseline) for r in runs]
        results = {s: f.result() for s, f in zip(seeds, futures)}
    seconds = time.perf_counter() - t0
    met = report(results, seconds, runs[0].difficulties, envs)
    probe_report({r.seed: r.probe_rows for r in runs})
    (run / "summary.json").write_text(json.dumps({"seconds": seconds, "goal_met_envs": met,
                                                  "results": {str(s): r for s, r in results.items()}}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
