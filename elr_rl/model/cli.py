"""`elr-rl model ...`: create, inspect and demo looped-model checkpoints."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path


def _parse_overrides(pairs: list[str]) -> dict:
    out = {}
    for pair in pairs:
        if "=" not in pair:
            raise ValueError(f"config overrides look like key=value, got {pair!r}")
        key, value = pair.split("=", 1)
        try:
            out[key] = json.loads(value)
        except json.JSONDecodeError:
            out[key] = value  # a bare string such as update_rule=delta
    return out


def build_config(fmt: str, overrides: dict):
    from elr_rl.model import DoryConfig, ElrConfig
    from elr_rl.model.config import check_overrides

    if fmt not in ("elr", "dory"):
        raise ValueError(f"--format must be 'elr' or 'dory', got {fmt!r}")
    cls = ElrConfig if fmt == "elr" else DoryConfig
    check_overrides(cls, overrides)  # unknown keys and wrong types, before anything is written
    return cls.tiny(**overrides)


def cmd_init(args) -> int:
    import torch

    from elr_rl.model import LoopedForCausalLM, save_tokenizer
    from elr_rl.text import TextCodec

    torch.manual_seed(args.seed)
    overrides = _parse_overrides(args.overrides)
    codec = None
    if args.tokenizer:  # the model's vocabulary follows the tokenizer unless set explicitly
        codec = TextCodec.load(args.tokenizer)
        overrides.setdefault("vocab_size", codec.vocab_size)
    cfg = build_config(args.format, overrides)
    if codec is not None and codec.vocab_size > cfg.vocab_size:
        raise ValueError(f"vocab_size={cfg.vocab_size} is smaller than the tokenizer's {codec.vocab_size} tokens")
    model = LoopedForCausalLM(cfg)
    model.save_pretrained(args.out)
    if codec is not None:
        codec.save_pretrained(args.out)
    else:
        save_tokenizer(args.out)
    print(f"wrote a random {args.format} checkpoint ({model.num_parameters():,} parameters) to {args.out}")
    return 0


def cmd_info(args) -> int:
    from elr_rl.model import LoopedForCausalLM

    model = LoopedForCausalLM.from_pretrained(args.checkpoint)
    s = model.spec
    print(f"checkpoint      {args.checkpoint}")
    print(f"format          {model.config.model_type}  ({type(model.config).__name__})")
    print(f"parameters      {model.num_parameters():,}")
    print(f"sublayers       {s.pattern}  (in {s.n_in} / recurrent {s.n_rec} / out {s.n_out})")
    print(f"backbone/update {s.backbone} / {s.update_rule}; loop conditioning {s.loop_conditioning}")
    print(f"loops           default k={s.num_loops}, max K={s.max_loops}; kv cache {s.kv_cache_mode}")
    for k in range(1, s.max_loops + 1):
        print(f"  D_eff({k}) = {s.effective_depth(k)} sublayers")
    return 0


def time_per_token(model, k: int, batch: int, seq: int, repeats: int) -> float:
    """Seconds per token of a teacher-forced forward at loop count k (best of `repeats`)."""
    import torch

    ids = torch.randint(0, model.spec.vocab_size, (batch, seq))
    best = float("inf")
    with torch.no_grad():
        model(ids, k=k)  # warm-up
        for _ in range(repeats):
            t0 = time.perf_counter()
            model(ids, k=k)
            best = min(best, time.perf_counter() - t0)
    return best / (batch * seq)


def cmd_demo(args) -> int:
    import tempfile

    import torch

    from elr_rl.model import LoopedForCausalLM
    from elr_rl.text import TextCodec

    torch.manual_seed(args.seed)
    if args.checkpoint:
        model = LoopedForCausalLM.from_pretrained(args.checkpoint)
        tok = TextCodec.load(args.checkpoint).tokenizer
    else:
        model = LoopedForCausalLM(build_config(args.format, _parse_overrides(args.overrides)))
        tok = TextCodec.byte_level().tokenizer
    model.eval()
    s = model.spec
    print(f"looped model: {model.num_parameters():,} parameters, sublayers {s.pattern} "
          f"(in {s.n_in} / rec {s.n_rec} / out {s.n_out}), update rule {s.update_rule}")
    prompt = torch.tensor([tok.encode(args.prompt, add_special_tokens=False)])
    base = None
    print(f"{'k':>2} {'D_eff':>6} {'ratio':>6} {'us/token':>9} {'measured':>9}  greedy continuation (random weights)")
    for k in range(1, s.max_loops + 1):
        t = time_per_token(model, k, args.batch, args.seq, args.repeats)
        base = base or t
        out = model.generate(prompt, args.tokens, k=k)
        text = tok.decode(out.new_tokens[0].tolist()).encode("unicode_escape").decode()[:40]
        ratio = s.effective_depth(k) / s.effective_depth(1)
        print(f"{k:>2} {s.effective_depth(k):>6} {ratio:>6.2f} {t * 1e6:>9.1f} {t / base:>9.2f}  {text!r}")
    with tempfile.TemporaryDirectory() as d:
        model.save_pretrained(d)
        again = LoopedForCausalLM.from_pretrained(d).eval()
        ids = torch.randint(0, s.vocab_size, (1, 16))
        same = all(torch.equal(model(ids, k=k), again(ids, k=k)) for k in range(1, s.max_loops + 1))
    print(f"save -> load round trip gives identical logits at every k: {same}")
    return 0 if same else 1


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="elr-rl model", description=__doc__)
    sub = p.add_subparsers(dest="cmd", required=True)
    pi = sub.add_parser("init", help="write a randomly initialised checkpoint (config.json, model.safetensors, tokenizer)")
    pi.add_argument("out")
    pi.add_argument("--format", default="elr", choices=["elr", "dory"])
    pi.add_argument("--seed", type=int, default=0)
    pi.add_argument("--tokenizer", help="a folder with tokenizer files and a chat template to copy in "
                    "(default: the byte-level tokenizer); vocab_size follows it")
    pi.add_argument("overrides", nargs="*", help="config fields as key=value, e.g. update_rule=delta")
    pn = sub.add_parser("info", help="describe a checkpoint")
    pn.add_argument("checkpoint")
    pd = sub.add_parser("demo", help="greedy output and time per token at k = 1..K, save/load check")
    pd.add_argument("--checkpoint", help="a checkpoint folder (default: a fresh random model)")
    pd.add_argument("--format", default="elr", choices=["elr", "dory"])
    pd.add_argument("--prompt", default="12+34=")
    pd.add_argument("--tokens", type=int, default=16)
    pd.add_argument("--batch", type=int, default=4)
    pd.add_argument("--seq", type=int, default=128)
    pd.add_argument("--repeats", type=int, default=5)
    pd.add_argument("--seed", type=int, default=0)
    pd.add_argument("overrides", nargs="*", help="config fields as key=value")
    args, rest = p.parse_known_args(argv)
    # key=value overrides may come after options too (`init ckpt/ --tokenizer DIR hidden_size=64`)
    stray = [a for a in rest if "=" not in a or a.startswith("-")]
    if stray or (rest and not hasattr(args, "overrides")):
        p.error(f"unrecognized arguments: {' '.join(stray or rest)}")
    if rest:
        args.overrides = [*args.overrides, *rest]
    try:
        return {"init": cmd_init, "info": cmd_info, "demo": cmd_demo}[args.cmd](args)
    except ValueError as exc:
        print(f"elr-rl model: {exc}")
        return 2
