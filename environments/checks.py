"""Golden checks every environment must pass (used by `elr-rl envs check` and the tests).

- the same (seed, difficulty) gives the same task;
- the reference solution scores 1.0;
- known-bad answers, an empty answer, garbage and hedged answers score 0.0;
- difficulty D+1 is harder than D by at least one task statistic (mean over seeds).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from environments.base import Environment, Task

# Completions no environment may reward (the empty answer once scored 1.0 in another stack).
GENERIC_BAD = [
    "",
    "I am not sure.",
    "<answer></answer>",
    "<answer>qzx garbage 123!? {]</answer>",
    "<answer>" + "9" * 300 + "</answer>",
]


def task_fingerprint(task: Task) -> tuple:
    """Everything a task is made of, comparable across two generations."""
    return (task.env, task.seed, task.difficulty, task.prompt, repr(task.answer), repr(task.hidden), task.stats)


def bad_completions(env: Environment, task: Task) -> list[tuple[str, str]]:
    """(label, completion) pairs that must score exactly 0."""
    out = [(f"generic[{i}]", c) for i, c in enumerate(GENERIC_BAD)]
    out += [(f"bad[{i}]", c) for i, c in enumerate(env.bad_answers(task))]
    if not env.multi_turn:
        # Several different answers score 0, even when one of them is right.
        out.append(("hedged", env.reference_solution(task) + "\n<answer>qzx-other-answer</answer>"))
    return out


@dataclass
class CheckResult:
    """Outcome of the golden checks of one environment."""

    env: str
    deterministic: bool = True
    reference_ok: int = 0
    reference_total: int = 0
    bad_ok: int = 0
    bad_total: int = 0
    harder: bool = True
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures


def harder_stats(env: Environment, d: int, seeds: list[int]) -> list[str]:
    """Stats whose mean over seeds is strictly larger at difficulty d+1 than at d."""

    def means(level: int) -> dict[str, float]:
        tasks = [env.generate(s, level) for s in seeds]
        keys = set.intersection(*(set(t.stats) for t in tasks))
        return {k: sum(float(t.stats[k]) for t in tasks) / len(tasks) for k in keys}

    lo, hi = means(d), means(d + 1)
    return sorted(k for k in lo.keys() & hi.keys() if hi[k] > lo[k])


def check_env(env: Environment, seeds: list[int], difficulties: list[int] | None = None) -> CheckResult:
    """Run every golden check on `env`; failures are described, never raised."""
    start = time.monotonic()
    res = CheckResult(env.name)
    levels = difficulties or list(range(env.min_difficulty, env.max_difficulty + 1))
    for d in levels:
        for seed in seeds:
            task = env.generate(seed, d)
            if task_fingerprint(task) != task_fingerprint(env.generate(seed, d)):
                res.deterministic = False
                res.failures.append(f"{task.id}: two generations differ")
            score = env.score(task, env.reference_solution(task))
            res.reference_total += 1
            if score.reward == 1.0 and score.accuracy:
                res.reference_ok += 1
            else:
                res.failures.append(f"{task.id}: reference scored {score.reward} ({score.error or score.components})")
            for label, completion in bad_completions(env, task):
                score = env.score(task, completion)
                res.bad_total += 1
                if score.reward == 0.0 and not score.accuracy:
                    res.bad_ok += 1
                else:
                    res.failures.append(f"{task.id}: {label} scored {score.reward}: {completion[:80]!r}")
    # Hardness uses generation only (cheap), over the whole range.
    for d in range(env.min_difficulty, env.max_difficulty):
        if not harder_stats(env, d, seeds):
            res.harder = False
            res.failures.append(f"difficulty {d + 1} is not harder than {d} by any task stat")
    res.seconds = time.monotonic() - start
    return res


def check_dataset(env: Environment, sample: int = 32) -> CheckResult:
    """Golden checks of a dataset environment on its first `sample` rows (by row hash): the answer column
    (or the solution column) scores 1 through the verifier, counterfactual wrong answers score 0, and
    generic bad completions score 0. Failures name the row's file and index."""
    start = time.monotonic()
    res = CheckResult(env.name)
    for d, seed in env.prompt_keys()[:sample]:  # type: ignore[attr-defined]
        task = env.generate(seed, d)
        where = f"{task.hidden['file']} row {task.hidden['index']}"
        try:
            reference = env.reference_solution(task)
        except ValueError as exc:
            res.failures.append(f"{where}: {exc}")
            continue
        score = env.score(task, reference)
        res.reference_total += 1
        if score.reward == 1.0 and score.accuracy:
            res.reference_ok += 1
        else:
            res.failures.append(f"{where}: answer scored {score.reward} ({score.error or score.components}): "
                                f"{reference[:80]!r}")
        for label, completion in bad_completions(env, task):
            score = env.score(task, completion)
            res.bad_total += 1
            if score.reward == 0.0 and not score.accuracy:
                res.bad_ok += 1
            else:
                res.failures.append(f"{where}: {label} scored {score.reward}: {completion[:80]!r}")
    res.seconds = time.monotonic() - start
    return res
