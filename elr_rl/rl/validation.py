"""Held-out validation during RL: greedy pass@1 at each loop count on a fixed held-out set.

The set and the measure are those of `elr-rl eval` (elr_rl/eval/evaluate.py):
tasks from `held_out_tasks` (seeds from `eval_seed_offset` on, outside the
training pool), one greedy completion per task at each k, scored by the
environment (multi-turn ones as whole episodes), pass@1 = the mean accuracy. Generation runs on rollout worker 0's
engine (`RolloutWorker.validate`) with the weights of the step being validated,
so no second engine is started; scoring uses the driver's scoring pool.
"""

from __future__ import annotations

from typing import Any

from elr_rl.eval.evaluate import EvalConfig, held_out_tasks


def validation_config(cfg) -> EvalConfig:
    """The held-out set of an RL config (`RLConfig`): its environments and loop counts, `run.eval_*` sizes."""
    r = cfg.run
    difficulty = r.eval_difficulty if r.eval_difficulty is not None else cfg.envs.difficulties[0]
    return EvalConfig(envs=list(cfg.envs.names), ks=list(cfg.curriculum.loop_counts), difficulty=difficulty,
                      num_tasks=r.eval_num_tasks, seed_offset=r.eval_seed_offset,
                      max_new_tokens=cfg.rollout.max_new_tokens, max_model_len=cfg.rollout.max_model_len)


def validation_metrics(results: list[dict[str, Any]]) -> dict[str, float]:
    """Metric keys of one validation: `val/pass_at_1/k{k}` (all environments), `val/pass_at_1/{env}/k{k}`,
    `val/response_length/k{k}`, from rows `{env, k, accuracy: [bool], tokens: [int]}`."""
    out: dict[str, float] = {}
    per_k: dict[int, list[tuple[float, float]]] = {}
    for r in results:
        pairs = [(float(a), float(t)) for a, t in zip(r["accuracy"], r["tokens"])]
        if not pairs:
            continue
        out[f"val/pass_at_1/{r['env']}/k{r['k']}"] = sum(a for a, _ in pairs) / len(pairs)
        per_k.setdefault(int(r["k"]), []).extend(pairs)
    for k, pairs in sorted(per_k.items()):
        out[f"val/pass_at_1/k{k}"] = sum(a for a, _ in pairs) / len(pairs)
        out[f"val/response_length/k{k}"] = sum(t for _, t in pairs) / len(pairs)
    return out


def run_validation(worker, scorer, cfg: EvalConfig,
                   tasks: dict[tuple[str, int], list] | None = None) -> dict[str, float]:
    """Greedy pass@1 per (environment, k) on the held-out set, as metric keys (blocks until done).

    `worker` is a RolloutWorker actor handle, `scorer` a ScoringPool; `tasks` the
    held-out tasks (`held_out_tasks(cfg)`; pass them to build them once per run).
    """
    import ray

    tasks = tasks if tasks is not None else held_out_tasks(cfg)
    results = []
    for k in cfg.ks:
        for (env_name, _difficulty), env_tasks in tasks.items():  # one difficulty: run.eval_difficulty
            reply = ray.get(worker.validate.remote(env_tasks, k, cfg.max_new_tokens))
            unscored = [(t, c) for t, c in zip(env_tasks, reply) if c["score"] is None]  # multi-turn: scored there
            fresh = iter(scorer.score_many([(env_name, t, c["text"]) for t, c in unscored]))
            scores = [c["score"] if c["score"] is not None else next(fresh) for c in reply]
            results.append({"env": env_name, "k": k, "accuracy": [bool(s.accuracy) for s in scores],
                            "tokens": [c["tokens"] for c in reply]})
    return validation_metrics(results)
