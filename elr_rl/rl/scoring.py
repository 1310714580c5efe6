"""Rewards of generated groups, through the scoring pool (environments/pool.py).

Single-turn groups are scored here against the task their worker built (never
built twice), with each environment's timeout and the rule that a failing
verifier gives reward 0. Multi-turn groups arrive scored: their episodes were
played and scored in the worker's own scoring pool, under the same rules.
"""

from __future__ import annotations

from concurrent.futures import Future

from elr_rl.rl.messages import Group


class GroupScorer:
    def __init__(self, num_workers: int) -> None:
        from environments.pool import ScoringPool

        self.pool = ScoringPool(num_workers)
        self._scoring: list[tuple[Group, list[Future]]] = []

    def __len__(self) -> int:
        """Groups being scored."""
        return len(self._scoring)

    def submit(self, group: Group) -> list[Group]:
        """Start scoring a group; returns it at once (in a list) if it arrived scored."""
        if group.scored:
            return [group]
        a = group.assignment
        self._scoring.append((group, [self.pool.submit(a.env, group.task, s.text) for s in group.samples]))
        return []

    def finished(self) -> list[Group]:
        """Groups whose every sample has its reward now."""
        done, still = [], []
        for group, futures in self._scoring:
            if not all(f.done() for f in futures):
                still.append((group, futures))
                continue
            for s, f in zip(group.samples, futures):
                score = f.result()
                s.reward, s.accuracy, s.error = float(score.reward), bool(score.accuracy), score.error
            group.scored = True
            done.append(group)
        self._scoring = still
        return done

    def assignments(self) -> list:
        return [g.assignment for g, _ in self._scoring]

    def close(self) -> None:
        self.pool.close()
