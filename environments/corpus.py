"""Worked-solution texts for the pretraining / SFT corpus of the training stages.

Each record pairs a task's prompt with the environment's worked solution (the
response: reasoning steps, then the final answer in the format the
environment scores), so SFT can put its loss on the response only.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator

from environments.base import WORKED_SEPARATOR, split_worked
from environments.registry import get_env, list_envs


def render_corpus(
    env_names: Iterable[str] | None = None,
    n: int = 10,
    difficulties: Iterable[int] | None = None,
    seed: int = 0,
) -> Iterator[dict[str, str]]:
    """Yield `n` records per (environment, difficulty): {env, id, prompt, response, text}.

    Task seeds are drawn from `random.Random(seed)`, so the same arguments give
    the same corpus. `text = prompt + WORKED_SEPARATOR + response`. Difficulties
    outside an environment's range are skipped (ranges differ between environments).
    """
    names = list(env_names) if env_names is not None else list_envs()
    levels = list(difficulties) if difficulties is not None else None
    rng = random.Random(seed)
    for name in names:
        env = get_env(name)
        for d in levels or range(env.min_difficulty, env.max_difficulty + 1):
            if not env.min_difficulty <= d <= env.max_difficulty:
                continue
            for _ in range(n):
                task = env.generate(rng.randrange(2**31), d)
                prompt, response = split_worked(task, env.worked_solution(task))
                yield {
                    "env": name,
                    "id": task.id,
                    "prompt": prompt,
                    "response": response,
                    "text": prompt + WORKED_SEPARATOR + response,
                }
