"""Self-speculative decoding (k=1 drafts gamma tokens, k=K verifies): acceptance per environment, speed-up.

    python scripts/bench_speculative.py --model CKPT [--envs arith_multidigit expr_eval] [--k 4 --gamma 4]

For each environment it samples --prompts task prompts, decodes each (batch 1, temperature 1,
stopping at the checkpoint's stop tokens) with plain k=K `generate()` and with the
self-speculative decoder, and prints the draft acceptance rate, tokens per verification round
and the request-time speed-up. The output distribution is the same by construction (exact
rejection sampling; tests/model/test_speculative.py counts it). Without --model a random model
is built: its acceptance rate says nothing about a trained one. Timings on a shared machine are noisy.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time

import torch


def parse_args(argv):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="checkpoint folder (default: a random 12M model, for plumbing only)")
    p.add_argument("--envs", nargs="+", default=["arith_multidigit", "expr_eval"])
    p.add_argument("--prompts", type=int, default=4, help="prompts per environment")
    p.add_argument("--difficulty", type=int, default=1)
    p.add_argument("--k", type=int, default=4)
    p.add_argument("--gamma", type=int, default=4)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=1)
    return p.parse_args(argv)


def random_checkpoint(path: str) -> None:
    from elr_rl.model import ElrConfig, LoopedForCausalLM
    from elr_rl.text import TextCodec

    torch.manual_seed(0)
    LoopedForCausalLM(ElrConfig(hidden_size=512, num_attention_heads=8, num_key_value_heads=4, intermediate_size=1408,
                                n_input_layers=1, n_recurrent_layers=2, n_output_layers=1)).save_pretrained(path)
    TextCodec.byte_level().save_pretrained(path)


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    from elr_rl.model import LoopedForCausalLM
    from elr_rl.model.speculative import SelfSpeculativeDecoder
    from elr_rl.text import TextCodec
    from environments.registry import get_env

    torch.set_num_threads(args.threads)
    tmp = tempfile.TemporaryDirectory()
    path = args.model or tmp.name
    if args.model is None:
        random_checkpoint(path)
    model, codec = LoopedForCausalLM.from_pretrained(path).eval(), TextCodec.load(path)
    dec = SelfSpeculativeDecoder(model, args.k, gamma=args.gamma)
    stops = list(codec.stop_token_ids)
    rows = {}
    for name in args.envs:
        env = get_env(name)
        plain_s = spec_s = 0.0
        acc = drafted = rounds = plain_tokens = spec_tokens = 0
        for seed in range(args.prompts):
            ids = codec.prompt_ids(env.generate(seed, args.difficulty).prompt)
            g = torch.Generator().manual_seed(seed)
            t = time.perf_counter()
            out = model.generate(torch.tensor([ids]), args.max_tokens, k=args.k, cache_mode="per_loop",
                                 temperature=1.0, eos_token_id=stops[0], generator=g)
            plain_s += time.perf_counter() - t
            plain_tokens += out.new_tokens.shape[1]
            t = time.perf_counter()
            toks, st = dec.generate(ids, args.max_tokens, temperature=1.0, stop_token_ids=stops, generator=g)
            spec_s += time.perf_counter() - t
            spec_tokens += len(toks)
            acc, drafted, rounds = acc + st.accepted, drafted + st.drafted, rounds + st.rounds
        rows[name] = {"acceptance": round(acc / max(drafted, 1), 3), "tokens_per_round": round(spec_tokens / max(rounds, 1), 2),
                      "plain_ms_per_token": round(1e3 * plain_s / max(plain_tokens, 1), 2),
                      "spec_ms_per_token": round(1e3 * spec_s / max(spec_tokens, 1), 2)}
        r = rows[name]
        r["speedup"] = round(r["plain_ms_per_token"] / r["spec_ms_per_token"], 2)
        print(f"{name:28s} acceptance {r['acceptance']:.2f}  tokens/round {r['tokens_per_round']:.2f}  "
              f"plain {r['plain_ms_per_token']} ms/token  speculative {r['spec_ms_per_token']} ms/token  x{r['speedup']}")
    print(json.dumps({"model": args.model or "random", "params": model.num_parameters(), "k": args.k,
                      "gamma": args.gamma, "envs": rows}))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
