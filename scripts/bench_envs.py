"""Scoring throughput of the reward environments, and the time of `elr-rl envs check --all`.

    python scripts/bench_envs.py                     # everything
    python scripts/bench_envs.py --skip-check -n 40  # throughput only

Throughput is measured two ways: in-process on one core (tasks per second of
one scoring loop) and through a ScoringPool with one worker per core (tasks per
second divided by the number of workers). Sandboxed environments start one
sandboxed child per scoring, so their figure is dominated by process start-up.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from environments.pool import ScoringPool
from environments.registry import get_env


def _jobs(name: str, n: int, difficulty: int) -> list[tuple[str, object, str]]:
    env = get_env(name)
    tasks = [env.generate(seed, difficulty) for seed in range(n)]
    # Half right, half wrong: both paths cost time in a real run.
    return [(name, t, env.reference_solution(t) if i % 2 == 0 else env.bad_answers(t)[0]) for i, t in enumerate(tasks)]


def bench_in_process(name: str, n: int, difficulty: int) -> float:
    """Tasks scored per second by one loop in this process (one core)."""
    env, jobs = get_env(name), _jobs(name, n, difficulty)
    start = time.perf_counter()
    for _, task, completion in jobs:
        env.score(task, completion)
    return n / (time.perf_counter() - start)


def bench_pool(name: str, n: int, difficulty: int, workers: int) -> float:
    """Tasks per second per worker process through the scoring pool (start-up excluded)."""
    jobs = _jobs(name, n, difficulty)
    with ScoringPool(num_workers=workers) as pool:
        pool.score_many(jobs[:workers])  # warm the workers (imports, sandbox probe)
        start = time.perf_counter()
        scores = pool.score_many(jobs)
        elapsed = time.perf_counter() - start
    errors = sum(s.error is not None for s in scores)
    if errors:
        print(f"  warning: {errors} scoring errors in {name}", file=sys.stderr)
    return n / elapsed / workers


def bench_math_verifier(n: int) -> tuple[float, float]:
    """Rows per second on one core of the dataset environments' math checker (environments/verifiers.py):
    plain numbers (55, 55.0, \\boxed{55}; the rational fast path) and LaTeX answers (math-verify + sympy)."""
    from environments.verifiers import math_equal

    plain = [(f"\\boxed{{{i}}}" if i % 3 == 0 else f"{i}.0" if i % 3 == 1 else f"${i + 1}$", str(i)) for i in range(n)]
    latex = [(f"\\frac{{{i}}}{{\\sqrt{{{i + 2}}}}}", f"\\frac{{{i} \\sqrt{{{i + 2}}}}}{{{i + 2}}}") for i in range(1, n + 1)]
    math_equal("1", "1"), math_equal("\\sqrt{2}", "\\sqrt{2}")  # imports
    rates = []
    for pairs in (plain, latex):
        start = time.perf_counter()
        for response, gold in pairs:
            math_equal(response, gold)
        rates.append(len(pairs) / (time.perf_counter() - start))
    return rates[0], rates[1]


def bench_check(extra: list[str]) -> float:
    start = time.perf_counter()
    res = subprocess.run([sys.executable, "-m", "elr_rl.cli", "envs", "check", "--all", *extra], text=True,
                         capture_output=True)  # fmt: skip
    elapsed = time.perf_counter() - start
    print(res.stdout)
    if res.returncode != 0:
        print(res.stderr, file=sys.stderr)
    return elapsed


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--single", default="arith_multidigit", help="single-turn environment to time")
    p.add_argument("--sandboxed", default="code_function_synthesis", help="sandboxed environment to time")
    p.add_argument("-n", type=int, default=40, help="tasks per measurement")
    p.add_argument("--difficulty", type=int, default=3)
    p.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    p.add_argument("--skip-check", action="store_true", help="do not time `elr-rl envs check --all`")
    p.add_argument("--check-args", default="", help="extra arguments for envs check, e.g. '--seeds 1'")
    args = p.parse_args()
    print(f"cores: {os.cpu_count()}, pool workers: {args.workers}, n = {args.n}, difficulty {args.difficulty}")
    for name in (args.single, args.sandboxed):
        one = bench_in_process(name, args.n, args.difficulty)
        pooled = bench_pool(name, args.n, args.difficulty, args.workers)
        print(f"{name:28s} in-process: {one:8.1f} tasks/s/core   pool: {pooled:8.1f} tasks/s/worker")
    plain, latex = bench_math_verifier(max(args.n, 200))
    print(f"{'math verifier':28s} plain numbers: {plain:8.0f} rows/s/core   LaTeX with radicals (math-verify + sympy): {latex:6.1f} rows/s/core")
    if not args.skip_check:
        seconds = bench_check(args.check_args.split())
        print(f"elr-rl envs check --all {args.check_args}: {seconds:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
