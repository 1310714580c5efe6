"""The RL driver: a single controller that reads like the algorithm.

    assign   (curriculum service)   -> (prompt, k) assignments          Scheduler
    generate (rollout workers)      -> groups of G completions, tagged with their policy version
    score    (scoring pool)         -> rewards, streamed as groups finish   GroupScorer
    advantage + update (learner)    -> one optimizer step over all depths
    sync     (learner -> workers)   -> new weights, then a logprob parity spot-check   RolloutFleet
    metrics                         -> one row per step                 StepWindow

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
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from curriculum.passrates import RolloutResult
from curriculum.routing import Assignment
from elr_rl.rl.config import RLConfig
from elr_rl.rl.messages import AsyncMode, GenerateReply, Group, StepResult
from elr_rl.rl.run_state import RunState, checkpoint_dir, latest_checkpoint, mark_latest, save_run_state
from elr_rl.rl.samples import RolloutBuffer, learner_batches, select_samples
from elr_rl.rl.stats import BatchInfo, StepWindow
from elr_rl.train.rank import check_shared_folder
from elr_rl.train.schedule import warmup_factor
from elr_rl.text import TextCodec

log = logging.getLogger("elr_rl.rl")
PARITY_DRAIN_S = 10.0  # how long a finished run waits for its last parity check (behind worker 0's running request)


@dataclass
class Training:
    """A learner step in progress."""

    refs: list[Any]  # one per learner rank
    info: BatchInfo
    started: float  # when it was submitted, or (queued behind another) when that one ended
    parity: tuple[list[list[int]], int] | None = None  # the sequences rank 0 scores after the update

    def done(self) -> bool:
        import ray

        return len(ray.wait(self.refs, num_returns=len(self.refs), timeout=0)[0]) == len(self.refs)


def queued_start(submitted: float, results: list[StepResult], now: float | None = None,
                 now_unix: float | None = None) -> float:
    """Where the driver's view (`perf_counter`) of a learner step queued behind another begins: when the ranks
    returned that other step (`results`), since each rank starts the queued one then, not when the driver
    noticed, which lags by whatever its loop was doing; never before the step was submitted. The ranks' end
    comes as `time.time()`, the one clock processes share (ranks on other nodes: to NTP's skew)."""
    now = time.perf_counter() if now is None else now
    now_unix = time.time() if now_unix is None else now_unix
    ended = [r.ended_unix for r in results if r.ended_unix is not None]
    lag = max(0.0, now_unix - min(ended)) if ended else 0.0
    return max(submitted, now - lag)


class Driver:
    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        self.run_dir = Path(cfg.run.output_dir)
        self.buffer = RolloutBuffer()
        self.ledger: Counter[str] = Counter()  # what happened to every scheduled prompt group
        self.window = StepWindow()
        self.reports: list[RolloutResult] = []  # finished groups not yet reported to the curriculum
        self.step = self.version = 0
        self.trainings: deque[Training] = deque()  # running first, then queued
        self.state: RunState | None = None
        self.started = False

    @property
    def workers(self) -> list[Any]:
        return self.fleet.workers

    # ------------------------------------------------------------------ the loop
    def run(self) -> dict[str, Any]:
        import ray

        stop_at = self.cfg.run.stop_after_steps or self.cfg.run.total_steps
        self.bar = None
        try:
            self._start()  # inside: whatever it started is shut down if a later part of it fails
            self.bar = _progress(self.cfg.run.progress, self.step, self.cfg.run.total_steps)
            while self.step < stop_at:
                # groups in queued steps are still ahead of the learner: the lookahead counts them
                queued = sum(len(t.info.groups) for t in list(self.trainings)[1:])
                self.scheduler.fill(self.workers, learner_busy=bool(self.trainings),
                                    downstream=len(self.buffer) + len(self.scorer) + queued, step=self.step)
                timeout = 0.005 if len(self.scorer) else 0.05  # soon, while rewards are being scored
                wake = self.trainings[0].refs if self.trainings else []
                for i, work, reply in self.scheduler.collect(timeout, wake=wake):
                    if isinstance(reply, GenerateReply):
                        self._take(reply)
                    else:
                        self._restart_worker(i, work, reply)
                for group in self.scorer.finished():
                    self._finish_group(group)
                self._collect_parity()
                if self.reports:  # live pass-rate refresh, one call per batch of finished groups
                    self.curriculum.report.remote(self.reports)
                    self.reports = []
                if self.trainings and self.trainings[0].done():
                    finished = self.trainings.popleft()
                    results = ray.get(finished.refs)  # done: no wait
                    if self.trainings:  # the queued step ran from the moment the ranks returned this one
                        self.trainings[0].started = queued_start(self.trainings[0].started, results)
                    self._end_step(finished, stop_at, results)
                if self._may_submit(stop_at):
                    training = self._start_training()
                    if training is not None:
                        self.trainings.append(training)
            self._collect_parity(PARITY_DRAIN_S)  # the last step's check: counted in summary.json
        finally:
            if self.bar is not None:
                self.bar.close()
            try:
                summary = self._summary()
            finally:  # whatever the summary met, what _start started is shut down
                self._shutdown()
        return summary

    # ------------------------------------------------------------------ set-up
    def _start(self) -> None:
        import ray

        from curriculum.routing import Prompt
        from curriculum.service import start_curriculum_service
        from elr_rl.config import save_config
        from elr_rl.metrics import MetricsWriter
        from elr_rl.model import config_from_dict
        from elr_rl.rl.fleet import RolloutFleet
        from elr_rl.rl.learner import LearnerGroup
        from elr_rl.rl.scheduler import Scheduler
        from elr_rl.rl.scoring import GroupScorer
        from environments.registry import resolve_envs
        from environments.sources import pool_keys

        c = self.cfg
        c.validate()  # the CLI's errors for a config built in code too (e.g. run.save_interval=0)
        # Absolute paths for the actors, whose working directory is their own (a Ray job's copy, another node's)
        c.model_path, c.run.output_dir = (str(Path(p).resolve()) for p in (c.model_path, c.run.output_dir))
        self.run_dir = Path(c.run.output_dir)
        log.warning("run folder: %s", self.run_dir)
        # The checkpoint's tokenizer and chat template, checked before Ray or any engine starts.
        TextCodec.load(c.model_path, c.rollout.chat)
        # Registers the dataset environments among envs.names before Ray starts (actors inherit them).
        resolve_envs(c.envs.names)
        # The sandbox tier, fixed before Ray starts (its processes inherit it); an error if it cannot run.
        self.sandbox_tier = c.sandbox.apply()
        log.warning("sandbox tier: %s (configured %s, allow_weaker_tier=%s)", self.sandbox_tier, c.sandbox.tier,
                    c.sandbox.allow_weaker_tier)
        if not ray.is_initialized():
            ray.init(address=c.run.ray_address or "local", num_cpus=c.run.ray_num_cpus, include_dashboard=False,
                     log_to_driver=False, logging_level=logging.WARNING)
        self.run_dir.mkdir(parents=True, exist_ok=True)
        save_config(c, self.run_dir / "config.yaml")
        self.started = True  # from here on the run folder is this run's: summary.json is written at the end
        config = json.loads((Path(c.model_path) / "config.json").read_text())
        self.depth = config_from_dict(config).loop_spec().effective_depth  # D_eff(k): a sample's cost is tokens x D_eff
        resume = latest_checkpoint(self.run_dir) if c.run.resume else None
        self.state = RunState.load(resume) if resume else None
        # a resumed run that has no step left to take still ends on a checkpoint: the one it resumed from
        self.last_checkpoint = str(resume) if resume else None
        seeds = range(c.envs.seed_offset, c.envs.seed_offset + c.envs.num_seeds)
        pool = [Prompt(*key) for key in pool_keys(c.envs.names, c.envs.difficulties, seeds)]
        # The RL checkpoint carries the curriculum state: never pick up a newer state.json of a killed run.
        self.curriculum = start_curriculum_service(c.curriculum, pool, str(self.run_dir), resume=False)
        self.metrics = MetricsWriter.from_config(self.run_dir, c.metrics, run_config=c)
        self.scheduler = Scheduler(c, lambda: ray.get(self.curriculum.next_batch.remote()), self.metrics, self.ledger,
                                   self.window)
        self.scorer = GroupScorer(c.envs.scoring_workers)
        self.learner = LearnerGroup(c, resume_dir=str(resume) if resume else None)
        if self.state is not None:
            ray.get(self.curriculum.load_state_dict.remote(self.state.curriculum))
            self.step, self.version = self.state.step, self.state.version
            self.buffer.load_state_dict(self.state.buffer)
            self.scheduler.queue.extend(Assignment(**a) for a in self.state.queue)
            self.ledger.update(self.state.ledger)
            log.warning("resumed from %s at step %d (%d buffered groups, %d queued prompts)",
                        resume, self.step, len(self.buffer), len(self.scheduler.queue))
        # a worker (re)started before this run's first step loads the resumed checkpoint, else the model
        self.fleet = RolloutFleet(c, str(resume) if resume else c.model_path, self.version)
        self.fleet.start()
        self.placement = {"learner": self.learner.node_ids(), "rollout": self.fleet.node_ids()}
        # learner ranks write the checkpoints, restarted workers and resumed runs read them
        check_shared_folder(self.run_dir, {"learner rank": self.learner.sees, "rollout worker": self.fleet.sees})

    # ------------------------------------------------------------ generation
    def _take(self, reply: GenerateReply) -> None:
        self.window.add_reply(reply)
        self._skip_too_long(reply.skipped)
        for group in reply.groups:
            for scored in self.scorer.submit(group):
                self._finish_group(scored)

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
        """A dead worker: re-queue its prompts and start a new one on the newest weights."""
        n = self.scheduler.requeue_worker(i, work)
        log.warning("rollout worker %d died (%s): restarting it and re-queueing %d prompts", i, type(exc).__name__, n)
        self.fleet.restart(i)

    def _finish_group(self, group: Group) -> None:
        self.buffer.add(group)
        self.window.groups.append(group)
        self.ledger["scored"] += 1
        n_ok = sum(s.accuracy for s in group.samples)
        resp = [s.num_model_tokens for s in group.samples]
        self.reports.append(RolloutResult(group.prompt_id, group.k, len(group.samples), n_ok,
                                          reward_mean=sum(group.rewards()) / len(group.samples),
                                          response_tokens_mean=sum(resp) / len(resp)))

    def _collect_parity(self, timeout: float = 0.0) -> None:
        worst = self.fleet.collect_parity(timeout)
        if worst is not None:
            self.window.parity.append(worst)

    # ------------------------------------------------------------------ learning
    def _may_submit(self, stop_at: int) -> bool:
        """Whether another learner step may be submitted now: none is running, or (async) fewer than
        `queued_steps` wait behind the running one, and no submitted step ends the run or is saved
        (a checkpoint holds the weights of its own step, and a queued step would change them first)."""
        n = len(self.trainings)
        if n == 0:
            return True
        c = self.cfg
        if c.async_.mode == AsyncMode.SYNC or n > c.async_.queued_steps or self.step + n >= stop_at:
            return False
        return not any((self.step + i) % c.run.save_interval == 0 for i in range(1, n + 1))

    def _start_training(self) -> Training | None:
        """Submit one learner step on the oldest fresh groups, if a batch is ready. Behind `n` submitted
        steps it updates version + n, and staleness is counted from there."""
        c = self.cfg
        version = self.version + len(self.trainings)  # the weights this step will update
        groups = self.buffer.pop_batch(c.algo.groups_per_step, version, c.async_.max_staleness)
        self.ledger["dropped_stale"] = self.buffer.dropped_stale
        if groups is None:
            return None
        samples, stats = select_samples(groups, c.algo.std_normalize, c.algo.dynamic_sampling,
                                        c.algo.overlong_filter, c.learner.max_seq_len)
        uninformative = int(stats["batch/uninformative_groups"])
        self.ledger["trained"] += len(groups) - uninformative
        self.ledger["uninformative"] += uninformative
        lb = learner_batches(samples, c.learner.world_size, self.depth, c.algo.aggregation, c.curriculum.loop_counts,
                             c.learner.share_prompts, c.learner.max_microbatch_tokens)
        dropped = self.buffer.dropped_stale - self.ledger["dropped_reported"]
        self.ledger["dropped_reported"] = self.buffer.dropped_stale
        lr = c.learner.optim.lr * warmup_factor(self.step + len(self.trainings), c.learner.warmup_steps)
        info = BatchInfo(groups, [version - g.version for g in groups], dropped, lr, stats | lb.stats,
                         queued=bool(self.trainings))
        # rank 0 scores the spot-check's sequences (3-4% of a learner step at 12M-47M parameters) for every
        # step that is not queued behind one carrying them: every step in sync mode, every other one while
        # steps queue
        riding = any(t.parity is not None for t in self.trainings)
        parity = None if riding else self.fleet.parity_sequences(groups[0] if groups else None)
        return Training(self.learner.train_step(lb.microbatches, lb.ks, lr, parity), info, time.perf_counter(),
                        parity)

    def _end_step(self, training: Training, stop_at: int, results: list[StepResult]) -> None:
        """The learner step finished (`results`, its ranks'): publish its weights, log its row, validate and
        save when due."""
        learner_s = time.perf_counter() - training.started
        self.step += 1
        self.version += 1
        sync_s = self.fleet.publish(results, self.version)
        self.fleet.start_parity_check(training.parity, results[0].parity_logprobs)
        row = self.window.row(results, training.info, learner_s=learner_s, version=self.version, ledger=self.ledger,
                              restarts=self.fleet.restarts, sync_s=sync_s, num_workers=len(self.workers))
        c = self.cfg
        if c.run.eval_interval and (self.step % c.run.eval_interval == 0 or self.step >= stop_at):
            row.update(self._validate())
        self.metrics.log(self.step, row)
        self._log_samples(training.info)
        self.bar.update(1)
        self.bar.set_postfix(reward=f"{row.get('critic/score/mean', 0):.2f}", stale=self.ledger["dropped_stale"])
        if self.step % c.run.save_interval == 0 or self.step >= stop_at:
            self._checkpoint()

    # ------------------------------------------------------------------ persistence
    def _checkpoint(self) -> None:
        import ray

        ckpt = checkpoint_dir(self.run_dir, self.step)
        state = RunState(
            step=self.step, version=self.version, buffer=self.buffer.state_dict(),
            # prompts being generated or scored are re-queued on resume: nothing is lost
            queue=[asdict(a) for a in [a for _, work in self.scheduler.inflight.values() for a in work]
                   + self.scorer.assignments() + list(self.scheduler.queue)],
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
            prompt = (g.task or get_env(a.env).generate(a.seed, a.difficulty)).prompt  # a resumed buffer keeps no tasks
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
        out = run_validation(self.workers[0], self.scorer.pool, self._val_cfg, self._val_tasks)
        out["timing_s/validation"] = time.perf_counter() - t0
        return out

    def _summary(self) -> dict[str, Any]:
        """summary.json: where the run stopped and what happened to every prompt group."""
        c = self.cfg
        # _start may have failed part-way (e.g. the scoring pool did not start): count what exists
        pending = len(self.buffer)
        if hasattr(self, "scorer"):
            pending += len(self.scorer)
        if hasattr(self, "scheduler"):
            pending += len(self.scheduler.queue) + self.scheduler.in_flight()
        summary = {"step": self.step, "version": self.version, "ledger": dict(self.ledger),
                   "parity_checks": self.fleet.parity_summary() if hasattr(self, "fleet") else None,
                   "pending_groups": pending, "restarted_workers": self.fleet.restarts if hasattr(self, "fleet") else 0,
                   "resumed_from_step": self.state.step if self.state else None,
                   "final_checkpoint": getattr(self, "last_checkpoint", None),
                   "placement": getattr(self, "placement", None),
                   "sandbox": {"tier": getattr(self, "sandbox_tier", None), "configured": c.sandbox.tier,
                               "allow_weaker_tier": c.sandbox.allow_weaker_tier}}
        if self.started:
            (self.run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
        return summary

    def _shutdown(self) -> None:
        import ray

        if hasattr(self, "fleet"):
            self.fleet.shutdown()
        if hasattr(self, "learner"):
            self.learner.shutdown()
        if hasattr(self, "scorer"):
            self.scorer.close()
        if hasattr(self, "metrics"):
            self.metrics.close()
        if hasattr(self, "curriculum"):
            ray.kill(self.curriculum)
        if self.cfg.learner.borrow_idle_cores:  # what a killed worker left on this node
            import shutil

            from elr_rl.rl.cores import run_lend_dir

            shutil.rmtree(run_lend_dir(self.cfg.run.output_dir), ignore_errors=True)


def _progress(enabled: bool, start: int, total: int):
    from tqdm import tqdm

    return tqdm(total=total, initial=start, desc="rl", unit="step", disable=not enabled, dynamic_ncols=True)
