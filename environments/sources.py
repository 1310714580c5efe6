"""Prompt pools over a mix of sources: registered environments and dataset environments, with weights.

A registered environment contributes (difficulty, seed) for every configured difficulty and seed;
a dataset environment contributes its rows, keyed (row difficulty, row hash). Without weights
every source contributes all of its prompts. With weights (`weight:` on any entry; the others
count 1) each source's share of the pool, and so of every epoch of prompts the curriculum hands
out, is weight / sum of weights: the pool is the largest one every source can fill at its share,
each source taking its first prompts (datasets: lowest row hashes, a stable subset).
"""

from __future__ import annotations

import logging
from typing import Any, Iterable

from environments.registry import get_env, resolve_envs, source_entries

log = logging.getLogger(__name__)


def source_keys(name: str, difficulties: Iterable[int], seeds: Iterable[int]) -> list[tuple[int, int]]:
    """(difficulty, seed) of every prompt of one source."""
    env = get_env(name)
    keys = getattr(env, "prompt_keys", None)
    if keys is not None:  # a dataset: its rows, whatever the configured seeds and difficulties
        return keys()
    return [(d, s) for d in difficulties for s in seeds]  # curriculum.routing.build_pool's order


def weighted_counts(sizes: dict[str, int], weights: dict[str, float]) -> dict[str, int]:
    """Prompts per source so that counts are proportional to weights and no source exceeds its size.

    n_s = floor(T * w_s / W) with T = min_s(size_s * W / w_s): the largest pool every source fills.
    """
    total_w = sum(weights.values())
    t = min(sizes[s] * total_w / weights[s] for s in sizes)
    return {s: max(1, min(sizes[s], int(t * weights[s] / total_w + 1e-9))) for s in sizes}


def pool_keys(entries: list[Any], difficulties: Iterable[int], seeds: Iterable[int]) -> list[tuple[str, int, int]]:
    """(env, difficulty, seed) of every prompt of the pool that `envs` entries describe."""
    names = resolve_envs(entries)
    weights = {m["name"]: m.get("weight") for m in source_entries(entries)}
    levels, seeds = list(difficulties), list(seeds)
    keys = {name: source_keys(name, levels, seeds) for name in names}
    if any(w is not None for w in weights.values()):
        counts = weighted_counts({n: len(k) for n, k in keys.items()}, {n: float(weights[n] or 1.0) for n in names})
        for name in names:
            if counts[name] < len(keys[name]):
                log.warning("envs: %s contributes %d of its %d prompts to meet the weights %s", name, counts[name],
                            len(keys[name]), {n: weights[n] or 1.0 for n in names})
            # the first seeds of every difficulty (datasets: the lowest row hashes), kept in pool order
            keep = set(sorted(keys[name], key=lambda k: (k[1], k[0]))[: counts[name]])
            keys[name] = [k for k in keys[name] if k in keep]
    return [(name, d, s) for name in names for d, s in keys[name]]


def eval_keys(name: str, num_tasks: int, seed_offset: int, difficulty: int) -> list[tuple[int, int]]:
    """(difficulty, seed) of the held-out tasks of one source: a dataset's first rows (by row hash,
    point the entry at a held-out file or split), or an environment's seeds from seed_offset."""
    env = get_env(name)
    keys = getattr(env, "prompt_keys", None)
    if keys is not None:
        return keys()[:num_tasks]
    return [(difficulty, seed_offset + i) for i in range(num_tasks)]
