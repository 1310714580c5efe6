"""`elr-rl envs list | sample | check`: inspect and golden-check the reward environments.

    elr-rl envs list
    elr-rl envs sample arith_multidigit --difficulty 3 -n 3 --seed 0 [--solution]
    elr-rl envs check arith_multidigit code_stdio_algorithms   # or --all
    elr-rl envs check configs/datasets/tiny_math.yaml          # a dataset environment: its rows
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor

from environments.base import split_worked
from environments.checks import CheckResult, check_dataset, check_env
from environments.registry import get_env, list_envs, load_env_class, resolve_envs


def _cmd_list(_: argparse.Namespace) -> int:
    rows = [("name", "domain", "turns", "difficulty", "concurrency", "timeout_s")]
    for name in list_envs():
        try:
            cls = load_env_class(name)
        except Exception as exc:  # a broken plugin must not hide the others
            rows.append((name, f"(load error: {type(exc).__name__}: {exc})", "", "", "", ""))
            continue
        turns = f"<={cls.max_turns}" if cls.multi_turn else "1"  # type: ignore[attr-defined]
        rows.append((name, cls.domain, turns, f"{cls.min_difficulty}-{cls.max_difficulty}",
                     str(cls.max_concurrency), f"{cls.score_timeout_s:g}"))  # fmt: skip
    _print_table(rows)
    print(f"\n{len(rows) - 1} environments")
    return 0


def _cmd_sample(args: argparse.Namespace) -> int:
    env = get_env(args.name)
    for i in range(args.n):
        task = env.generate(args.seed + i, args.difficulty)
        print(f"=== {task.id}  stats={task.stats}")
        print(task.prompt)
        if args.solution:
            print("--- worked solution ---")
            print(split_worked(task, env.worked_solution(task))[1])
        print()
    return 0


def _cmd_check(args: argparse.Namespace) -> int:
    names = list_envs() if args.all else resolve_envs(args.names)  # names or dataset-environment YAML files
    if not names:
        raise ValueError("name at least one environment, or pass --all")
    difficulties = [int(d) for d in args.difficulties.split(",")] if args.difficulties else None
    seeds = list(range(args.seeds))
    rows = [("env", "same-seed", "reference=1", "bad=0", "D+1 harder", "seconds")]
    failed, total_start = [], time.monotonic()
    jobs = [(name, seeds, difficulties) for name in names]
    if args.jobs > 1:  # one environment per process (their sandboxes are separate processes anyway)
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as ex:
            results = list(ex.map(_check_one, jobs))
    else:
        results = [_check_one(job) for job in jobs]
    for name, r in zip(names, results):
        rows.append((name, "ok" if r.deterministic else "FAIL", f"{r.reference_ok}/{r.reference_total}",
                     f"{r.bad_ok}/{r.bad_total}", "ok" if r.harder else "FAIL", f"{r.seconds:.2f}"))  # fmt: skip
        if not r.ok:
            failed.append(r)
    _print_table(rows)
    print(f"\n{len(names)} environments checked in {time.monotonic() - total_start:.1f}s")
    for r in failed:
        print(f"\n{r.env}: {len(r.failures)} failure(s)", file=sys.stderr)
        for line in r.failures[:10]:
            print(f"  {line}", file=sys.stderr)
    return 1 if failed else 0


def _check_one(job: tuple[str, list[int], list[int] | None]) -> CheckResult:
    name, seeds, difficulties = job
    env = get_env(name)
    if hasattr(env, "prompt_keys"):  # a dataset environment: its rows, not generated seeds
        return check_dataset(env)
    levels = difficulties and [d for d in difficulties if env.min_difficulty <= d <= env.max_difficulty]
    return check_env(env, seeds, levels or None)


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for j, row in enumerate(rows):
        print("  ".join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
        if j == 0:
            print("  ".join("-" * w for w in widths))


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be 1 or more, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="elr-rl envs", description="list, sample and check the reward environments")
    sub = p.add_subparsers(dest="cmd", required=True)
    sub.add_parser("list", help="registered environments").set_defaults(fn=_cmd_list)
    s = sub.add_parser("sample", help="print generated tasks")
    s.add_argument("name")
    s.add_argument("--difficulty", "-d", type=int, default=1)
    s.add_argument("-n", type=_positive, default=3, help="number of tasks (seeds seed, seed+1, ...)")
    s.add_argument("--seed", type=int, default=0)
    s.add_argument("--solution", action="store_true", help="also print the worked solution")
    s.set_defaults(fn=_cmd_sample)
    c = sub.add_parser("check", help="golden checks: determinism, reference=1, bad=0, D+1 harder")
    c.add_argument("names", nargs="*")
    c.add_argument("--all", action="store_true", help="check every registered environment")
    c.add_argument("--seeds", type=int, default=2, help="seeds per difficulty")
    c.add_argument("--difficulties", default="", help="comma-separated levels to score (default: all)")
    c.add_argument("--jobs", "-j", type=int, default=1, help="environments checked in parallel processes")
    c.set_defaults(fn=_cmd_check)
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.fn(args)
    except ValueError as exc:
        print(f"elr-rl envs: {exc}", file=sys.stderr)
        return 2
