"""The RL driver: a single controller that reads like the algorithm.

    assign   (curriculum service)   -> (prompt, k) assignments
    generate (rollout workers)      -> groups of G completions, tagged with their policy version
    score    (environment pool)     -> rewards, streamed as groups finish
    advantage + update (learner)    -> one optimizer step over all depths
    sync     (learner -> workers)   -> new weights, then a logprob parity spot-check

In async mode generation never waits for the learner: workers keep sampling
with the weights they hold while the learner trains, and a group older than
`max_staleness` versions is dropped. Sync mode runs the same steps in order.
New weights are staged on every worker without waiting for its running request
(it loads them before its next one), and the parity spot-check is collected
whenever it finishes, so neither side waits for the other.
"""

from __future__ import annotations

import json
import logging
import time
from collections import Counter, deque
from concurrent.futures import Future
from dataclasses import asdict
from pathlib import Path
from typing import Any

from curriculum.passrates import RolloutResult
from curriculum.routing import Assignment
from elr_rl.rl.config import RLConfig
from elr_rl.rl.messages import AsyncMode, GenerateReply, Group, StepResult
from elr_rl.rl.run_state import RunState, checkpoint_dir, latest_checkpoint, mark_latest, save_run_state
from elr_rl.rl.samples import RolloutBuffer, learner_batches, select_samples, take_one_loop_count
from elr_rl.rl.stats import BatchInfo, step_metrics
from elr_rl.train.schedule import warmup_factor
from elr_rl.text import TextCodec

log = logging.getLogger("elr_rl.rl")


class Driver:
    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run.output_dir)
        self.buffer = RolloutBuffer()
        self.queue: deque[Assignment] = deque()  # assignments waiting for a worker
        self.inflight: dict[Any, tuple[int, list[Assignment]]] = {}  # ref -> (worker index, assignments)
        self.scoring: list[tuple[Group, list[Future]]] = []
        self.ledger: Counter[str] = Counter()  # what happened to every scheduled prompt group
        self.step = 0
        self.version = 0
        self.window: list[Group] = []  # groups scored since the last metrics row
        self.routed: list[Assignment] = []  # assignments handed out since the last metrics row
        self.reports: list[RolloutResult] = []  # finished groups not yet reported to the curriculum
        self.rollout_busy_s = 0.0  # summed over workers: seconds spent in generate calls
        self.weight_loads: list[float] = []  # worker-side weight load seconds since the last metrics row
        self.parity_pending: tuple[int, Any, Any] | None = None  # (version, learner ref, worker ref)
        self.parity: list[float] = []  # finished parity checks since the last metrics row
        # The newest weights, for a worker (re)started at any time: a checkpoint folder until the
        # first step of this run (cfg.model_path, or the checkpoint it resumed from), then also
        # the object-store ref of the learner's last published weights.
        self.weights_from = cfg.model_path
        self.weights_ref: Any = None

    # ------------------------------------------------------------------ set-up
    def _start(self) -> None:
        import ray

        from curriculum.routing import Prompt
        from curriculum.service import start_curriculum_service
        from elr_rl.config import save_config
        from elr_rl.metrics import MetricsWriter
        from elr_rl.model import config_from_dict
        from elr_rl.rl.learner import LearnerGroup
        from environments.pool import ScoringPool
        from environments.registry import load_env_class, resolve_envs
        from environments.sources import pool_keys

        c = self.cfg
        c.validate()  # the CLI's errors for a config built in code too (e.g. run.save_interval=0)
        # The checkpoint's tokenizer and chat template, checked before Ray or any engine starts.
        TextCodec.load(c.model_path, c.rollout.chat)
        # Registers the dataset environments among envs.names before Ray starts (actors inherit them).
        names = resolve_envs(c.envs.names)
        # The sandbox tier, fixed before Ray starts (its processes inherit it); an error if it cannot run.
        self.sandbox_tier = c.sandbox.apply()
        log.warning("sandbox tier: %s (configured %s, allow_weaker_tier=%s)", self.sandbox_tier, c.sandbox.tier,
                    c.sandbox.allow_weaker_tier)
        if not ray.is_initialized():
            ray.init(address=c.run.ray_address or "local", num_cpus=c.run.ray_num_cpus, include_dashboard=False,
                     log_to_driver=False, logging_level=logging.WARNING)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(c, self.run_dir / "config.yaml")
        self.env_classes = {name: load_env_class(name) for name in names}
        config = json.loads((Path(c.model_path) / "config.json").read_text())
        self.depth = config_from_dict(config).loop_spec().effective_depth  # D_eff(k): a sample's cost is tokens x D_eff
        resume = latest_checkpoint(self.run_dir) if c.run.resume else None
        self.state = RunState.load(resume) if resume else None
        seeds = range(c.envs.seed_offset, c.envs.seed_offset + c.envs.num_seeds)
        pool = [Prompt(*key) for key in pool_keys(c.envs.names, c.envs.difficulties, seeds)]
        # The RL checkpoint carries the curriculum state: never pick up a newer state.json of a killed run.
        self.curriculum = start_curriculum_service(c.curriculum, pool, str(self.run_dir), resume=False)
        self.metrics = MetricsWriter.from_config(self.run_dir, c.metrics, run_config=c)
        self.scorer = ScoringPool(c.envs.scoring_workers)
        self.learner = LearnerGroup(c, resume_dir=str(resume) if resume else None)
        self.weights_from = str(resume) if resume else c.model_path
        if self.state is not None:
            ray.get(self.curriculum.load_state_dict.remote(self.state.curriculum))
            self.step, self.version = self.state.step, self.state.version
            self.buffer.load_state_dict(self.state.buffer)
            self.queue.extend(Assignment(**a) for a in self.state.queue)
            self.ledger.update(self.state.ledger)
            log.warning("resumed from %s at step %d (%d buffered groups, %d queued prompts)",
                        resume, self.step, len(self.buffer), len(self.queue))
        self.workers = [self._new_worker(i, self.weights_from) for i in range(c.rollout.num_workers)]
        self.worker_restarts = 0
        self.placement = {"learner": self.learner.node_ids(),
                          "rollout": ray.get([w.node_id.remote() for w in self.workers])}

    def _new_worker(self, i: int, model_path: str):
        import ray

        from elr_rl.rl.cores import CORE_OFFSET_ENV, layout_offsets
        from elr_rl.rl.ray_env import actor_runtime_env
        from elr_rl.rl.rollout_worker import MAX_CONCURRENCY, RolloutWorker

        c, lc = self.cfg.rollout, self.cfg.learner
        actor = ray.remote(num_cpus=c.num_cpus_per_worker, num_gpus=c.num_gpus_per_worker, max_restarts=0,
                           max_concurrency=MAX_CONCURRENCY)(RolloutWorker)
        # Threads and cores follow the worker's Ray CPUs (RolloutWorker applies them); its slot comes after the learner's.
        offset = layout_offsets(lc.world_size, lc.num_cpus_per_rank, c.num_workers, c.num_cpus_per_worker)["rollout"][i]
        env = {"OMP_NUM_THREADS": str(max(1, int(c.num_cpus_per_worker))), "VLLM_CPU_OMP_THREADS_BIND": "nobind",
               CORE_OFFSET_ENV: str(offset)}
        handle = actor.options(runtime_env=actor_runtime_env(env), resources=dict(c.resources) or None).remote(
            i, model_path, c, self.cfg.run.seed, self.version)
        ray.get(handle.ping.remote())
        return handle

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        import ray

        self._start()
        c = self.cfg
        stop_at = c.run.stop_after_steps or c.run.total_steps
        bar = _progress(c.run.progress, self.step, c.run.total_steps)
        learner_ref, learner_started, batch_info = None, 0.0, None
        learner_busy = 0.0  # seconds since the last metrics row (as is rollout_busy_s)
        t_run = t_row = time.perf_counter()
        try:
            while self.step < stop_at:
                self._schedule(learner_busy=learner_ref is not None)
                self._collect_generations(timeout=0.05, learner_refs=learner_ref or [])
                self._collect_scores()
                self._collect_parity()
                if self.reports:  # live pass-rate refresh, one call per batch of finished groups
                    self.curriculum.report.remote(self.reports)
                    self.reports = []
                if learner_ref is None:
                    batch = self.buffer.pop_batch(c.algo.groups_per_step, self.version, c.async_.max_staleness)
                    self.ledger["dropped_stale"] = self.buffer.dropped_stale
                    if batch is not None:
                        learner_ref, batch_info = self._train(batch)
                        learner_started = time.perf_counter()
                    continue
                done, _ = ray.wait(learner_ref, num_returns=len(learner_ref), timeout=0)
                if len(done) < len(learner_ref):
                    continue
                results = ray.get(learner_ref)
                learner_step_s = time.perf_counter() - learner_started
                learner_busy += learner_step_s
                learner_ref = None
                self.step += 1
                self.version += 1
                sync_s = self._sync_weights(results, batch_info)
                now = time.perf_counter()
                wall, window = now - t_run, max(now - t_row, 1e-9)
                # idle ratios over this step's window (start-up is not counted against either side)
                rollout_busy = self.rollout_busy_s / (len(self.workers) * window)
                row = step_metrics(results, batch_info, version=self.version, window=self.window, ledger=self.ledger,
                                   restarts=self.worker_restarts, sync_s=sync_s, parity=self.parity,
                                   weight_loads=self.weight_loads, learner_busy=learner_busy / window,
                                   rollout_busy=rollout_busy, wall=wall, window_s=window)
                t_row, learner_busy, self.rollout_busy_s = now, 0.0, 0.0
                row["timing_s/update_actor"] = learner_step_s
                if c.run.eval_interval and (self.step % c.run.eval_interval == 0 or self.step >= stop_at):
                    row.update(self._validate())
                row.update(_curriculum_metrics(self.routed))
                self.routed, self.parity, self.weight_loads = [], [], []
                self.metrics.log(self.step, row)
                self._log_samples(batch_info)
                self.window = []
                bar.update(1)
                bar.set_postfix(reward=f"{row.get('critic/score/mean', 0):.2f}", stale=self.ledger["dropped_stale"])
                if self.step % c.run.save_interval == 0 or self.step >= stop_at:
                    self._checkpoint()
        finally:
            bar.close()
            pending = len(self.queue) + len(self.buffer) + len(self.scoring) + sum(len(w) for _, w in self.inflight.values())
            summary = {"step": self.step, "version": self.version, "ledger": dict(self.ledger),
                       "pending_groups": pending, "restarted_workers": getattr(self, "worker_restarts", 0),
                       "resumed_from_step": self.state.step if getattr(self, "state", None) else None,
                       "final_checkpoint": getattr(self, "last_checkpoint", None),
                       "placement": getattr(self, "placement", None),
                       "sandbox": {"tier": getattr(self, "sandbox_tier", None), "configured": c.sandbox.tier,
                                   "allow_weaker_tier": c.sandbox.allow_weaker_tier}}
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
            self._shutdown()
        return summary

    # ------------------------------------------------------------ generation
    def _schedule(self, learner_busy: bool) -> None:
        """Hand prompts to idle workers (sync mode: only what the next step needs, never while training)."""
        c = self.cfg
        need = c.algo.groups_per_step
        pending_groups = len(self.buffer) + sum(len(a) for _, a in self.inflight.values()) + len(self.scoring)
        if c.async_.mode == AsyncMode.SYNC:
            if learner_busy or pending_groups >= need:
                return
        elif pending_groups >= need * (c.async_.max_staleness + 2):
            return  # far enough ahead: more would only go stale
        busy = {w for w, _ in self.inflight.values()}
        for i, worker in enumerate(self.workers):
            if i in busy:
                continue
            if c.async_.mode == AsyncMode.SYNC:
                pending_groups = len(self.buffer) + sum(len(a) for _, a in self.inflight.values()) + len(self.scoring)
                if pending_groups >= need:
                    return
            n = c.rollout.prompts_per_request
            if c.async_.mode == AsyncMode.SYNC:
                n = min(n, need - pending_groups)
            work = self._next_request(n)
            self.inflight[worker.generate.remote(work)] = (i, work)

    def _next_request(self, n: int) -> list[Assignment]:
        """Up to n queued assignments at one loop count, the oldest assignment's.

        A worker then runs one k per call (one batched vLLM generate instead of one per k); the
        queue holds enough curriculum batches for every k to fill a request.
        """
        import ray

        while len(self.queue) < n * len(self.cfg.curriculum.loop_counts):
            batch = ray.get(self.curriculum.next_batch.remote())
            self.queue.extend(batch)
            self.ledger["scheduled"] += len(batch)
            # labelled with the step whose metrics row counts these prompts (curriculum/prompts_k*)
            self.metrics.log_routing(self.step + 1, _routing(batch))
            self.routed.extend(batch)
        work, rest = take_one_loop_count(self.queue, n)
        self.queue = deque(rest)
        return work

    def _collect_generations(self, timeout: float, learner_refs=()) -> None:
        """Take in finished generate calls; waits at most `timeout`, returning early when a
        generation or the learner step finishes (or soon, while rewards are being scored)."""
        import ray
        from ray.exceptions import RayActorError

        if self.scoring:
            timeout = min(timeout, 0.005)
        waitables = list(self.inflight)
        if learner_refs:
            waitables += ray.wait(list(learner_refs), num_returns=len(learner_refs), timeout=0)[1]
        if not waitables:
            time.sleep(timeout)
            return
        ray.wait(waitables, num_returns=1, timeout=timeout)
        if not self.inflight:
            return
        ready, _ = ray.wait(list(self.inflight), num_returns=len(self.inflight), timeout=0)
        for ref in ready:
            i, work = self.inflight.pop(ref)
            try:
                reply: GenerateReply = ray.get(ref)
            except RayActorError as exc:
                self._restart_worker(i, work, exc)
                continue
            self.rollout_busy_s += reply.busy_s
            self._skip_too_long(reply.skipped)
            if reply.weight_load_s:
                self.weight_loads.append(reply.weight_load_s)
            for g in reply.groups:
                self._score(g)

    def _skip_too_long(self, skipped: list[Assignment]) -> None:
        """Prompts longer than the engine's context were not sampled: count them; fail if nothing fits."""
        if not skipped:
            return
        self.ledger["skipped_prompt_too_long"] += len(skipped)
        log.warning("%d prompt(s) longer than rollout.max_model_len - rollout.max_new_tokens were skipped "
                    "(e.g. %s)", len(skipped), skipped[0].prompt_id)
        if self.ledger["scored"] == 0 and self.ledger["skipped_prompt_too_long"] >= 4 * self.cfg.algo.groups_per_step:
            raise ValueError(
                f"config field `rollout.max_model_len`: {self.ledger['skipped_prompt_too_long']} prompts skipped as "
                f"longer than max_model_len - max_new_tokens = "
                f"{self.cfg.rollout.max_model_len - self.cfg.rollout.max_new_tokens} tokens and none fitted; "
                "raise rollout.max_model_len or use shorter prompts")

    def _restart_worker(self, i: int, work: list[Assignment], exc: Exception) -> None:
        """A dead worker: start a new one on the newest weights and re-queue its prompts.

        It starts from `weights_from` at the current version (after a resume: the resumed
        checkpoint's weights), then gets the last published weights if a step ran since.
        """
        log.warning("rollout worker %d died (%s): restarting it and re-queueing %d prompts", i, type(exc).__name__, len(work))
        for w, (j, other) in list(self.inflight.items()):
            if j == i:  # anything else it held is lost with it
                work = work + other
                del self.inflight[w]
        self.queue.extendleft(reversed(work))
        self.ledger["requeued"] += len(work)
        self.worker_restarts += 1
        self.workers[i] = self._new_worker(i, self.weights_from)
        if self.weights_ref is not None:
            self._push_weights([self.workers[i]], self.weights_ref)

    # ------------------------------------------------------------------ scoring
    def _score(self, group: Group) -> None:
        env_cls = self.env_classes[group.assignment.env]
        if env_cls.multi_turn:  # the worker scored the episode while running it
            self._finish_group(group)
            return
        from environments.registry import get_env

        a = group.assignment
        task = get_env(a.env).generate(a.seed, a.difficulty)
        futures = [self.scorer.submit(a.env, task, s.text) for s in group.samples]
        self.scoring.append((group, futures))

    def _collect_scores(self) -> None:
        still = []
        for group, futures in self.scoring:
            if not all(f.done() for f in futures):
                still.append((group, futures))
                continue
            for s, f in zip(group.samples, futures):
                score = f.result()
                s.reward, s.accuracy, s.error = float(score.reward), bool(score.accuracy), score.error
            self._finish_group(group)
        self.scoring = still

    def _finish_group(self, group: Group) -> None:
        self.buffer.add(group)
        self.window.append(group)
        self.ledger["scored"] += 1
        n_ok = sum(s.accuracy for s in group.samples)
        resp = [s.num_model_tokens for s in group.samples]
        self.reports.append(RolloutResult(group.prompt_id, group.k, len(group.samples), n_ok,
                                          reward_mean=sum(group.rewards()) / len(group.samples),
                                          response_tokens_mean=sum(resp) / len(resp)))

    # ------------------------------------------------------------------ learning
    def _train(self, groups: list[Group]) -> tuple[list[Any], BatchInfo]:
        """Start one learner step on `groups`: the learner's refs and what the step's metrics need."""
        c = self.cfg
        samples, stats = select_samples(groups, c.algo.std_normalize, c.algo.dynamic_sampling,
                                        c.algo.overlong_filter, c.learner.max_seq_len)
        uninformative = int(stats["batch/uninformative_groups"])
        self.ledger["trained"] += len(groups) - uninformative
        self.ledger["uninformative"] += uninformative
        lb = learner_batches(samples, c.learner.world_size, self.depth, c.algo.aggregation, c.curriculum.loop_counts)
        dropped = self.buffer.dropped_stale - self.ledger["dropped_reported"]
        self.ledger["dropped_reported"] = self.buffer.dropped_stale
        lr = c.learner.optim.lr * warmup_factor(self.step, c.learner.warmup_steps)
        info = BatchInfo(groups, [self.version - g.version for g in groups], dropped, lr, stats | lb.stats)
        return self.learner.train_step(lb.microbatches, lb.ks, lr), info

    def _sync_weights(self, results: list[StepResult], batch_info: BatchInfo) -> float:
        """Send the new weights to every worker as one object; start a parity spot-check. Returns seconds.

        The learner put the weights into the object store at the end of its step (`weights_ref`);
        the time is that serialisation plus the transfer to every worker. Workers stage the
        weights without waiting for their running request and load them between requests
        (perf/weight_load_s).
        """
        t0 = time.perf_counter()
        self.weights_ref = results[0].weights_ref[0]
        self._push_weights(self.workers, self.weights_ref)
        seconds = time.perf_counter() - t0 + max(r.weights_serialize_s for r in results)
        self._start_parity_check(batch_info)
        return seconds

    def _push_weights(self, workers, weights_ref) -> None:
        """Every worker stages the weights; a worker that dies meanwhile is restarted (on these weights)."""
        import ray
        from ray.exceptions import RayActorError

        refs = [(self.workers.index(w), w.update_weights.remote(weights_ref, self.version)) for w in workers]
        for i, ref in refs:
            try:
                ray.get(ref)
            except RayActorError as exc:
                self._restart_worker(i, [], exc)

    def _start_parity_check(self, batch_info: BatchInfo) -> None:
        """Score a few sequences of the last batch on the learner and on worker 0 (collected later)."""
        n = self.cfg.async_.parity_check_sequences
        groups = batch_info.groups
        if not n or not groups or self.parity_pending is not None:
            return
        g = groups[0]
        seqs = [s.prompt_ids + s.response_ids for s in g.samples[:n]]
        # the learner scores before its next step, the worker after loading this version
        self.parity_pending = (self.version, self.learner.logprobs_ref(seqs, g.k), self.workers[0].logprobs.remote(seqs, g.k))

    def _collect_parity(self) -> None:
        """Max |logprob(worker) - logprob(learner)|, when both sides have answered for the same version."""
        import ray
        from ray.exceptions import RayActorError

        if self.parity_pending is None:
            return
        version, ours_ref, theirs_ref = self.parity_pending
        done, _ = ray.wait([ours_ref, theirs_ref], num_returns=2, timeout=0)
        if len(done) < 2:
            return
        self.parity_pending = None
        try:
            worker_version, theirs = ray.get(theirs_ref)
        except RayActorError:  # the worker died; _collect_generations restarts it
            return
        if worker_version != version:  # newer weights arrived first: nothing comparable
            return
        ours = ray.get(ours_ref)
        diffs = [abs(a - b) for x, y in zip(ours, theirs) for a, b in zip(x, y[-len(x):])]
        worst = max(diffs) if diffs else 0.0
        if worst > 1e-2:
            log.warning("trainer/rollout logprob mismatch after sync to version %d: max |diff| = %.3g", version, worst)
        self.parity.append(worst)

    # ------------------------------------------------------------------ persistence
    def _checkpoint(self) -> None:
        import ray

        ckpt = checkpoint_dir(self.run_dir, self.step)
        state = RunState(
            step=self.step, version=self.version, buffer=self.buffer.state_dict(),
            # prompts being generated or scored are re-queued on resume: nothing is lost
            queue=[asdict(a) for a in [a for _, work in self.inflight.values() for a in work]
                   + [g.assignment for g, _ in self.scoring] + list(self.queue)],
            curriculum=ray.get(self.curriculum.state_dict.remote()), ledger=dict(self.ledger),
        )
        self.learner.save(str(ckpt), {"step": self.step, "version": self.version})
        save_run_state(ckpt, state)
        mark_latest(ckpt)
        self.last_checkpoint = str(ckpt)

    def _log_samples(self, batch_info: BatchInfo) -> None:
        """A few of the step's samples (two per group of the first groups) to rollouts.jsonl and W&B."""
        from environments.registry import get_env

        every = self.cfg.run.sample_log_interval
        if not every or self.step % every:
            return
        records = []
        for g in batch_info.groups[:4]:
            a = g.assignment
            prompt = get_env(a.env).generate(a.seed, a.difficulty).prompt
            for s in g.samples[:2]:
                records.append({"env": a.env, "prompt_id": g.prompt_id, "k": g.k, "policy_version": g.version,
                                "reward": s.reward, "accuracy": s.accuracy, "finish_reason": s.finish_reason,
                                "prompt": prompt, "completion": s.text})
        self.metrics.log_samples(self.step, records)

    def _validate(self) -> dict[str, float]:
        """Held-out greedy pass@1 per k with the weights of this step (on worker 0; blocks the driver)."""
        from elr_rl.eval.evaluate import held_out_tasks
        from elr_rl.rl.validation import run_validation, validation_config

        if not hasattr(self, "_val_cfg"):
            self._val_cfg = validation_config(self.cfg)
            self._val_tasks = held_out_tasks(self._val_cfg)
        t0 = time.perf_counter()
        out = run_validation(self.workers[0], self.scorer, self._val_cfg, self._val_tasks)
        out["timing_s/validation"] = time.perf_counter() - t0
        return out

    def _shutdown(self) -> None:
        import ray

        for w in getattr(self, "workers", []):
            try:
                ray.get(w.shutdown.remote(), timeout=60)
            except Exception:  # noqa: BLE001 - a dead worker has nothing to shut down
                pass
            ray.kill(w)
        if hasattr(self, "learner"):
            self.learner.shutdown()
        if hasattr(self, "scorer"):
            self.scorer.close()
        if hasattr(self, "metrics"):
            self.metrics.close()
        if hasattr(self, "curriculum"):
            ray.kill(self.curriculum)


def _routing(batch) -> dict[int, dict[str, list[float]]]:
    from elr_rl.metrics import routing_from_assignments

    return routing_from_assignments(batch)


def _curriculum_metrics(batch) -> dict[str, float]:
    from elr_rl.metrics import curriculum_metrics

    return curriculum_metrics(batch)


def _progress(enabled: bool, start: int, total: int):
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc="rl", unit="step", disable=not enabled, dynamic_ncols=True)
