"""Is the looped model at k = 1 as good as a non-looped model of the same size on the same tokens?

Two pretraining runs of configs/pretrain_tiny.yaml, on the same token stream (same data
config, seed, batch and steps):

  looped  the ELR tiny model trained with delayed mixed depth (K = 4, as the quickstart does)
  plain   the same layers as a plain transformer: one pass (max_loops 1, loops.mode fixed),
          replace update rule, zero initial state, no loop conditioning, which is exactly a
          standard pre-norm transformer (tests/model checks it against a reference)

Both final checkpoints are then scored on the same held-out packed sequences: next-token
loss (nats) and next-token accuracy (%) at k = 1 (and the looped model at k = 2..4 for
context). Prints a table and a final JSON line with the gap in accuracy points.

    python scripts/bench_looped_vs_plain.py [--steps 300] [--out runs/looped_vs_plain]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

RUNS = {
    "looped": ["loops.delay_fraction=0.3"],
    "plain": ["model.overrides.loop_conditioning=false", "model.overrides.update_rule=replace",
              "model.overrides.initial_state=zeros", "model.overrides.max_loops=1", "model.overrides.num_loops=1",
              "loops.mode=fixed", "loops.fixed_k=1"],
}


def pretrain(name: str, out: Path, steps: int) -> Path:
    run_dir = out / name
    cmd = [sys.executable, "-m", "elr_rl.cli", "pretrain", str(ROOT / "configs" / "pretrain_tiny.yaml"),
           f"run.output_dir={run_dir}", f"run.total_steps={steps}", f"run.save_interval={steps}",
           "run.resume=false", *RUNS[name]]
    print(f"== pretraining {name}: {' '.join(cmd[3:])}", flush=True)
    t0 = time.perf_counter()
    subprocess.run(cmd, cwd=ROOT, check=True)
    print(f"== {name}: {time.perf_counter() - t0:.0f} s", flush=True)
    latest = (run_dir / "checkpoints" / "latest").read_text().strip()
    return run_dir / "checkpoints" / latest


def score(ckpt: Path, batches, ks) -> dict[int, tuple[float, float]]:
    """k -> (mean next-token loss, next-token accuracy) over the held-out batches."""
    import torch
    import torch.nn.functional as F

    from elr_rl.model import LoopedForCausalLM
    from elr_rl.train.data import IGNORE_INDEX

    model = LoopedForCausalLM.from_pretrained(ckpt).eval()
    out = {}
    with torch.no_grad():
        for k in ks:
            loss_sum = right = count = 0.0
            for b in batches:
                logits = model(b["input_ids"], k=k, positions=b.get("positions"), segment_ids=b.get("segment_ids"))
                labels = b["labels"]
                keep = labels != IGNORE_INDEX
                loss_sum += float(F.cross_entropy(logits.float()[keep], labels[keep], reduction="sum"))
                right += float((logits.argmax(-1)[keep] == labels[keep]).sum())
                count += float(keep.sum())
            out[k] = (loss_sum / count, 100.0 * right / count)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=300, help="optimizer steps of each pretraining run")
    p.add_argument("--out", default="runs/looped_vs_plain")
    p.add_argument("--eval-batches", type=int, default=16, help="held-out batches of 8 sequences")
    args = p.parse_args()
    out = Path(args.out)

    ckpts = {name: pretrain(name, out, args.steps) for name in RUNS}

    from elr_rl.config import load_config
    from elr_rl.model import build_tokenizer
    from elr_rl.model.modeling import LoopedForCausalLM
    from elr_rl.train.config import TrainConfig
    from elr_rl.train.corpus import build_source
    from elr_rl.train.data import fixed_batches

    cfg = load_config(TrainConfig, ROOT / "configs" / "pretrain_tiny.yaml")
    batches = fixed_batches(build_source(cfg.data, cfg.stage, heldout=True), build_tokenizer(), cfg.data.seq_len,
                            cfg.stage, 8, args.eval_batches)
    looped = score(ckpts["looped"], batches, [1, 2, 3, 4])
    plain = score(ckpts["plain"], batches, [1])
    n_params = {name: sum(t.numel() for t in LoopedForCausalLM.from_pretrained(c).parameters())
                for name, c in ckpts.items()}

    print(f"\nheld-out next-token scores ({args.eval_batches * 8} sequences of {cfg.data.seq_len} tokens), "
          f"{args.steps} steps each on the same tokens")
    print(f"{'model':>8} {'params':>8} {'k':>2} {'loss':>7} {'acc %':>7}")
    print(f"{'plain':>8} {n_params['plain']:>8} {1:>2} {plain[1][0]:>7.4f} {plain[1][1]:>7.2f}")
    for k, (loss, acc) in looped.items():
        print(f"{'looped':>8} {n_params['looped']:>8} {k:>2} {loss:>7.4f} {acc:>7.2f}")
    gap = looped[1][1] - plain[1][1]
    print(f"looped k=1 minus plain: {gap:+.2f} accuracy points, {looped[1][0] - plain[1][0]:+.4f} nats "
          f"({'within' if abs(gap) <= 1.0 else 'NOT within'} one point)")
    print(json.dumps({
        "steps": args.steps, "params_looped": n_params["looped"], "params_plain": n_params["plain"],
        "plain_loss": round(plain[1][0], 4), "plain_acc": round(plain[1][1], 2),
        **{f"looped_loss_k{k}": round(v[0], 4) for k, v in looped.items()},
        **{f"looped_acc_k{k}": round(v[1], 2) for k, v in looped.items()},
        "acc_points_looped_k1_minus_plain": round(gap, 2),
    }))


if __name__ == "__main__":
    main()
