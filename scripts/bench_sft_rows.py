"""Benchmark the SFT head on labelled positions only: a train step with and without `with_label_rows`.

    .venv/bin/python scripts/bench_sft_rows.py [--vocab 32000 151936] [--prompt-share 0.5] [--threads 2]
        [--steps 4] [--precision bf16] [--k 1]

An SFT microbatch's prompt positions carry no label (IGNORE_INDEX); the engine hands the model their
complement as `logit_rows`, so the LM head (and the output block's sublayers after its last
attention) runs on the labelled positions only. This times one DeepSpeed rank's train step of two
8 x 128-token microbatches at the d = 512 shape of bench_train.py, a `--prompt-share` of each row
masked, with the rows (the default loss) and without (the same loss given full logits), the two
stepping in turn; it prints the median step times and their ratio for each vocabulary size
(Dory1.0-4B's is 151,936). The first step of each is warm-up and not counted.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--vocab", type=int, nargs="+", default=[32000, 151936])
    ap.add_argument("--prompt-share", type=float, default=0.5, help="share of each row's labels masked (0..1)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=4, help="timed steps of each, after one warm-up step")
    ap.add_argument("--precision", choices=["fp32", "bf16"], default="bf16")
    ap.add_argument("--k", type=int, default=1, help="loop count of every microbatch")
    args = ap.parse_args(argv)
    if not 0.0 <= args.prompt_share < 1.0:
        ap.error(f"--prompt-share must be in [0, 1), got {args.prompt_share}")
    if args.steps < 1:
        ap.error(f"--steps must be at least 1, got {args.steps}")

    import torch

    from elr_rl.model import ElrConfig
    from elr_rl.train.config import EngineConfig, OptimConfig, TrainConfig, TrainRunConfig
    from elr_rl.train.engine import TrainEngine, cross_entropy_loss, release_process_groups
    from elr_rl.train.labels import IGNORE_INDEX
    from elr_rl.train.rank import free_port

    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(free_port()))
    torch.set_num_threads(args.threads)

    def full_logits(logits, batch):  # another function object: the engine adds no label rows for it
        return cross_entropy_loss(logits, batch)

    rows_, cols = 8, 128
    masked = int(round(args.prompt_share * cols))
    results = []
    try:
        for vocab in args.vocab:
            cfg = ElrConfig(vocab_size=vocab, hidden_size=512, intermediate_size=1408, num_attention_heads=8,
                            num_key_value_heads=2, n_input_layers=1, n_recurrent_layers=2, n_output_layers=1,
                            max_loops=4, num_loops=4)
            train_cfg = TrainConfig(engine=EngineConfig(accelerator="cpu", precision=args.precision),
                                    optim=OptimConfig(lr=1e-4), run=TrainRunConfig(seed=0))
            engine = TrainEngine(cfg, train_cfg, 0, 1)
            g = torch.Generator().manual_seed(0)
            microbatches = []
            for _ in range(2):
                ids = torch.randint(0, vocab, (rows_, cols), generator=g)
                labels = ids.roll(-1, 1)
                labels[:, :masked] = IGNORE_INDEX
                labels[:, -1] = IGNORE_INDEX
                microbatches.append({"input_ids": ids, "labels": labels})
            times: dict[str, list[float]] = {"rows": [], "full": []}
            try:
                for step in range(args.steps + 1):
                    for name, fn in (("rows", cross_entropy_loss), ("full", full_logits)):
                        t = time.perf_counter()
                        engine.train_step(microbatches, [args.k] * len(microbatches), 1e-4, loss_fn=fn)
                        if step:
                            times[name].append(time.perf_counter() - t)
            finally:
                engine.close()
            row = {"vocab": vocab, "rows_step_s": round(statistics.median(times["rows"]), 4),
                   "full_step_s": round(statistics.median(times["full"]), 4)}
            row["full_over_rows"] = round(row["full_step_s"] / row["rows_step_s"], 3)
            results.append(row)
            print(f"vocab {vocab:>7}: step with label rows {row['rows_step_s']:.3f} s, full logits "
                  f"{row['full_step_s']:.3f} s -> {row['full_over_rows']:.2f}x "
                  f"({args.precision}, {args.threads} threads, k = {args.k}, {masked} of {cols} labels masked)",
                  flush=True)
    finally:
        release_process_groups()
    print(json.dumps({"precision": args.precision, "threads": args.threads, "k": args.k,
                      "prompt_share": masked / cols, "results": results}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
