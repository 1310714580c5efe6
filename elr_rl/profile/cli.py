"""`elr-rl profile CONFIG [key=value ...]`: profile pass rates per loop count with vLLM."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from elr_rl.profile.profiler import (
    ProfileConfig,
    ProfileStore,
    plan_chunks,
    profile_meta,
    profile_pool,
    run_profile,
    summarize,
)


def checkpoint_loop_counts(checkpoint: str) -> list[int]:
    """1..K where K is the checkpoint's maximum loop count (config.json)."""
    path = Path(checkpoint) / "config.json"
    if not path.is_file():
        raise ValueError(f"{path} not found: checkpoint must be a saved looped-model directory")
    conf = json.loads(path.read_text())
    for key in ("max_loops", "n_recurrent_loops", "num_loops"):
        if isinstance(conf.get(key), int) and conf[key] >= 1:
            return list(range(1, conf[key] + 1))
    raise ValueError(f"{path} names no loop count (max_loops): set loop_counts=[...] explicitly")


def profile_with_engines(cfg: ProfileConfig, ks: list[int], factory: Any = None, progress: bool = True) -> list[dict]:
    """Run the profile with one local engine, or cfg.num_engines Ray workers; returns the merged rows."""
    from elr_rl.profile.engines import check_profilable, load_envs, local_runner, make_scorer, max_context, ray_runner
    from elr_rl.profile.engines import rollout_engine_factory

    from elr_rl.text import TextCodec

    factory = factory or rollout_engine_factory
    envs = load_envs(cfg.envs)  # unknown names and bad difficulties fail here, before any engine starts
    check_profilable(envs, cfg.difficulties)
    cfg.sandbox.require_for(envs.values())  # a sandbox that cannot run stops the job here, not per sample
    codec = TextCodec.load(cfg.checkpoint, cfg.chat)  # tokenizer and chat template, before any engine
    done = ProfileStore(cfg.run_dir, cfg.name).finished()
    if not plan_chunks(profile_pool(cfg), ks, done, cfg.chunk_prompts):
        return run_profile(cfg, ks, lambda chunks: iter(()), progress=progress)  # all done: no engine to start
    closers = []
    try:
        if cfg.num_engines > 1:
            runner, shutdown = ray_runner(cfg, factory)
            closers.append(shutdown)
        else:
            score, episode, close_scorer = make_scorer(cfg, envs)
            closers.append(close_scorer)
            generate, shutdown = factory(cfg)
            closers.append(shutdown)
            runner = local_runner(generate, envs, cfg.samples_per_prompt, codec, score, max_context(cfg), episode)
        return run_profile(cfg, ks, runner, progress=progress)
    finally:
        for close in reversed(closers):
            close()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        prog="elr-rl profile",
        description="Sample a checkpoint n times per prompt and loop count; write the pass-rate table "
        "<run_dir>/profile/<name>.parquet. Re-running resumes an interrupted job.",
    )
    parser.add_argument("config", help="YAML config (see configs/profile.yaml)")
    parser.add_argument("overrides", nargs="*",
                        help="key=value overrides, e.g. checkpoint=runs/sft/ckpt loop_counts=[1,4]")
    parser.add_argument("--no-progress", action="store_true", help="hide the progress bar")
    args = parser.parse_args(argv)

    import datasets

    from elr_rl.config import load_config, save_config

    datasets.disable_progress_bars()  # one bar (ours) per job, not one per Parquet file

    try:
        cfg = load_config(ProfileConfig, args.config, args.overrides)
        ks = cfg.loop_counts or checkpoint_loop_counts(cfg.checkpoint)
        store = ProfileStore(cfg.run_dir, cfg.name)
        store.check_meta(profile_meta(cfg))  # refuse a mismatched resume before overwriting the config record
    except ValueError as exc:
        print(f"elr-rl profile: {exc}", file=sys.stderr)
        return 2
    save_config(cfg, store.dir / f"{cfg.name}.config.yaml")
    from environments.sandbox_tier import SandboxUnavailable

    try:
        rows = profile_with_engines(cfg, list(ks), progress=not args.no_progress)
    except (ValueError, SandboxUnavailable) as exc:  # unknown environment, difficulty out of range, no sandbox,
        print(f"elr-rl profile: {exc}", file=sys.stderr)  # settings that refuse to resume
        return 2
    print(summarize(rows))
    print(f"\n{len(rows)} rows -> {store.table_path}")
    return 0
