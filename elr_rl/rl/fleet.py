"""The rollout workers and the weights they hold.

The fleet starts the workers, restarts a dead one on the newest weights (a
checkpoint folder until this run's first step: the model, or the checkpoint the
run resumed from; then the learner's last published weights too), publishes each
step's weights to every worker as one object-store object, and spot-checks that
a worker's logprobs equal the learner's after a sync (the learner scores the
sequences at the end of its step, with the weights it publishes).
"""

from __future__ import annotations

import logging
import time
from typing import Any

from elr_rl.rl.config import RLConfig
from elr_rl.rl.messages import Group, StepResult

log = logging.getLogger("elr_rl.rl")


class RolloutFleet:
    def __init__(self, cfg: RLConfig, weights_from: str, version: int) -> None:
        self.cfg = cfg
        self.weights_from = weights_from  # a checkpoint folder a (re)started worker loads first
        self.weights_ref: Any = None  # the learner's last published weights (object-store ref)
        self.version = version
        self.workers: list[Any] = []
        self.restarts = 0
        self._parity: tuple[int, Any, Any] | None = None  # in flight: (version, learner logprobs, worker ref)
        # what became of every check the learner scored for: compared, or not (one was still in flight,
        # newer weights reached the worker first, or it died)
        self.parity_counts = {"compared": 0, "worker_busy": 0, "newer_weights": 0, "worker_died": 0, "worker_error": 0}
        self.parity_worst = 0.0  # over every compared check of the run

    def start(self) -> None:
        self.workers = [self._new_worker(i) for i in range(self.cfg.rollout.num_workers)]

    def node_ids(self) -> list[str]:
        import ray

        return ray.get([w.node_id.remote() for w in self.workers])

    def sees(self, path: str) -> list[bool]:
        import ray

        return ray.get([w.sees.remote(path) for w in self.workers])

    def _new_worker(self, i: int):
        import ray

        from elr_rl.rl.cores import CORE_OFFSET_ENV, layout_offsets, lend_env
        from elr_rl.rl.ray_env import actor_runtime_env
        from elr_rl.rl.rollout_worker import RolloutWorker, max_concurrency

        c, lc = self.cfg.rollout, self.cfg.learner
        actor = ray.remote(num_cpus=c.num_cpus_per_worker, num_gpus=c.num_gpus_per_worker, max_restarts=0,
                           max_concurrency=max_concurrency(c.requests_per_worker))(RolloutWorker)
        # Threads and cores follow the worker's Ray CPUs (RolloutWorker applies them); its slot comes after the learner's.
        offset = layout_offsets(lc.world_size, lc.num_cpus_per_rank, c.num_workers, c.num_cpus_per_worker)["rollout"][i]
        env = {"OMP_NUM_THREADS": str(max(1, int(c.num_cpus_per_worker))), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               CORE_OFFSET_ENV: str(offset), **lend_env(lc.borrow_idle_cores, self.cfg.run.output_dir)}
        handle = actor.options(runtime_env=actor_runtime_env(env), resources=dict(c.resources) or None).remote(
            i, self.weights_from, c, self.cfg.run.seed, self.version)
        ray.get(handle.ping.remote())
        return handle

    def restart(self, i: int) -> None:
        """Replace worker i by a new one on the newest weights (after a resume: the resumed checkpoint's)."""
        self.restarts += 1
        self.workers[i] = self._new_worker(i)
        if self.weights_ref is not None:
            self._push([i], self.weights_ref)

    def publish(self, results: list[StepResult], version: int) -> float:
        """Send a learner step's weights to every worker as one object; returns seconds (the learner's
        serialisation plus the transfer). Workers stage them without waiting for their running request
        and load them between requests."""
        t0 = time.perf_counter()
        self.version = version
        self.weights_ref = results[0].weights_ref[0]
        self._push(range(len(self.workers)), self.weights_ref)
        return time.perf_counter() - t0 + max(r.weights_serialize_s for r in results)

    def _push(self, indices, weights_ref) -> None:
        """Every worker stages the weights; a worker that died meanwhile is restarted (on these weights)."""
        import ray
        from ray.exceptions import RayActorError

        refs = [(i, self.workers[i].update_weights.remote(weights_ref, self.version)) for i in indices]
        for i, ref in refs:
            try:
                ray.get(ref)
            except RayActorError as exc:
                log.warning("rollout worker %d died during a weight sync (%s): restarting it", i, type(exc).__name__)
                self.restart(i)

    def parity_sequences(self, group: Group | None) -> tuple[list[list[int]], int] | None:
        """(sequences, k) of a step's first group for the learner to score with the step's new weights."""
        n = self.cfg.async_.parity_check_sequences
        if not n or group is None:
            return None
        return [s.prompt_ids + s.response_ids for s in group.samples[:n]], group.k

    def start_parity_check(self, parity: tuple[list[list[int]], int] | None, learner_scores: list | None) -> None:
        """Have worker 0 score the sequences the learner scored with the version just published (collected
        later). One check at a time: the worker's threads hold a generate, one parity call and a control
        call; a check due while one is still in flight is skipped and counted (`worker_busy`)."""
        if parity is None or learner_scores is None:
            return
        if self._parity is not None:
            self.parity_counts["worker_busy"] += 1
            return
        seqs, k = parity
        self._parity = (self.version, learner_scores, self.workers[0].logprobs.remote(seqs, k))

    def collect_parity(self, timeout: float = 0.0) -> float | None:
        """Max |logprob(worker) - logprob(learner)| once the worker answered for the same version (waiting
        up to `timeout` seconds); a check answered with newer weights, or never (the worker died; its next
        request finds out and restarts it), or failed in the worker (say, out of memory on a long
        sequence: logged, the run goes on), is counted in `parity_counts`."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        if self._parity is None:
            return None
        version, ours, theirs_ref = self._parity
        done, _ = ray.wait([theirs_ref], timeout=timeout)
        if not done:
            return None
        self._parity = None
        try:
            worker_version, theirs = ray.get(theirs_ref)
        except RayActorError:
            self.parity_counts["worker_died"] += 1
            return None
        except RayTaskError as exc:  # a spot-check is not worth the run
            self.parity_counts["worker_error"] += 1
            log.warning("parity check of version %d failed in rollout worker 0 (counted in summary.json's "
                        "parity_checks.worker_error): %s", version, str(exc).splitlines()[0] if str(exc) else exc)
            return None
        if worker_version != version:  # newer weights arrived first: nothing comparable
            self.parity_counts["newer_weights"] += 1
            return None
        diffs = [abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x, y[-len(x):])]
        worst = max(diffs) if diffs else 0.0
        if worst > 1e-2:
            log.warning("trainer/rollout logprob mismatch after sync to version %d: max |diff| = %.3g", version, worst)
        self.parity_counts["compared"] += 1
        self.parity_worst = max(self.parity_worst, worst)
        return worst

    def parity_summary(self) -> dict[str, Any]:
        """The run's spot-checks for summary.json: what became of each, and the worst difference compared."""
        worst = self.parity_worst if self.parity_counts["compared"] else None  # None: nothing compared
        return {**self.parity_counts, "unfinished": int(self._parity is not None), "worst_abs_diff": worst}

    def shutdown(self) -> None:
        import ray

        for w in self.workers:
            try:
                ray.get(w.shutdown.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead worker has nothing to shut down
                pass
            ray.kill(w)
