"""The one place that changes the job's state: observe -> classify -> decide -> act.

:class:`Supervisor` runs attempts (:mod:`supervisor.attempt_start` plans each,
:mod:`supervisor.attempt` observes it), classifies how each ended
(:func:`supervisor.rules.failures.classify`, pure), decides what comes next
(:func:`supervisor.rules.policy.decide`, pure) and acts: back off and restart, give up, or stop
(and requeue the Slurm job). :meth:`Supervisor.transition` is the only way the state changes, and
every change is checked against :data:`supervisor.rules.states.TRANSITIONS`.

Everything with a socket, a file or a process comes in from outside (``supervisor.daemon`` builds
the real ones), so unit tests drive this class with a fake clock, fake launches and a fake channel.
"""

from __future__ import annotations

import asyncio
import os
import random
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol

from supervisor.attempt import Attempt
from supervisor.attempt_start import LaunchSource, SlurmIds, prepare
from supervisor.config.model import JobConfig
from supervisor.exclusion import Exclusion, HealthSource
from supervisor.loops import SYSTEM_CLOCK, Clock, Liveness, first_done
from supervisor.outcome import AttemptResult, Outcome, failure_event, iso_utc
from supervisor.ranks.channel import Channel
from supervisor.ranks.checkpoints import CommitTracker
from supervisor.ranks.rank_table import RankTable
from supervisor.ranks.resume_prints import ResumeBook
from supervisor.ranks.snapshots import MemoryTier, SnapshotBook
from supervisor.record.events import EventLog
from supervisor.record.schema import (
    Event,
    JobGaveUp,
    JobStopped,
    JobSucceeded,
    MessagesDropped,
    RestartScheduled,
    RolledBack,
    StopRequested,
)
from supervisor.rules import budget as budgets
from supervisor.rules.anomalies import LossWatch, RollbackRefused, decide_rollback
from supervisor.rules.budget import Budget
from supervisor.rules.failures import classify
from supervisor.rules.observation import ANOMALY_KINDS, Anomaly, FailureKind, StopReason
from supervisor.rules.policy import GiveUp, Requeue, Restart, RestartPolicy, decide
from supervisor.rules.states import ExitCode, JobState, check_transition, exit_code

__all__ = ["StatusSink", "Supervisor", "iso_utc"]

_NO_STOP_CHECKPOINT = (
    "no checkpoint was committed by the stop; the job resumes from the previous one"
)


class StatusSink(Protocol):
    """Where state changes are announced (systemd's sd_notify)."""

    def status(self, text: str) -> None: ...
    def stopping(self, status: str = "") -> None: ...


class Supervisor:
    """Supervises one job until it succeeds, gives up or stops."""

    def __init__(
        self,
        cfg: JobConfig,
        *,
        events: EventLog,
        channel: Channel,
        tracker: CommitTracker,
        commits: asyncio.Queue[Path] | None,
        launches: LaunchSource,
        budget: Budget,
        secret_file: Path,
        requeue: Callable[[StopReason], Awaitable[bool]],
        notifier: StatusSink,
        slurm_ids: SlurmIds | None = None,
        clock: Clock = SYSTEM_CLOCK,
        liveness: Liveness | None = None,
        jitter: Callable[[], float] = random.random,
        health: HealthSource | None = None,
        requeue_away: Callable[[tuple[str, ...]], Awaitable[tuple[bool, str]]] | None = None,
        memory_dir: Path | None = None,
    ) -> None:
        self.cfg = cfg
        self.events = events
        self.channel = channel
        self.tracker = tracker
        self.commits = commits
        self.launches = launches
        self.budget = budget
        self.attempt_no = budget.attempts
        self.secret_file = secret_file
        self._requeue = requeue
        self.notifier = notifier
        self.slurm_ids = slurm_ids or SlurmIds()
        self.clock = clock
        self.liveness = liveness or Liveness(clock)
        self._jitter = jitter
        self.policy: RestartPolicy = cfg.restart
        self.state = JobState.STARTING
        self.ranks = RankTable()
        self.losses = LossWatch(cfg.anomaly)  # across attempts: a baseline outlives a rollback
        self.current: Attempt | None = None
        # node -> why: stragglers' nodes ([health] exclude_stragglers) for the next restart
        self.straggler_nodes: dict[str, str] = {}
        self.stop_reason: StopReason | None = None
        self._stop_wakeup = asyncio.Event()
        self.exclusion = Exclusion(
            cfg, events=events, nodes=launches, health=health, budget=lambda: self.budget
        )
        self._requeue_away = requeue_away
        self.memory = MemoryTier(cfg, memory_dir)  # the memory tier's snapshots on this node
        self.snapshots = SnapshotBook()  # what the current attempt's ranks say of them
        self.resumes = ResumeBook(cfg.checkpoint.resume_check)  # across attempts

    # ------------------------------------------------------------------ state
    def fold(self, event: Event) -> None:
        """Fold an event just logged into the budget (the same rule that read the history)."""
        self.budget = budgets.fold(self.budget, event)

    def transition(self, new: JobState) -> None:
        """The only way the job's state changes."""
        if new is self.state:
            return
        check_transition(self.state, new)
        self.state = new
        self.notifier.status(f"{new.name.lower()} (attempt {self.attempt_no})")
        if new is JobState.RUNNING and self.current is not None:
            self.launches.warm_up(self.current.plan)  # every rank runs: ready the next launcher
            self._log_cold_starts()

    def _log_cold_starts(self) -> None:
        for event in self.launches.cold_starts():
            self.events.log(event)

    # ------------------------------------------------------------------ the attempt loop
    async def run(self) -> ExitCode:
        """Attempts until the job succeeds, gives up or stops; the exit status. The job's
        memory snapshots on this node go with its end (docs/memory-tier.md)."""
        code = await self._attempts()
        self.memory.remove()
        return code

    async def _attempts(self) -> ExitCode:
        ended = await self._nodes_round("start")
        if ended is not None:
            return ended
        while True:
            if self.stop_reason is not None:
                return await self._stopped(self.stop_reason, None, "before the attempt began")
            self.attempt_no += 1
            if self.state is not JobState.STARTING:
                self.transition(JobState.STARTING)
            unsafe = self.tracker.unsafe()
            if unsafe is not None:  # its ranks would refuse it: no attempt can load or save
                self.transition(JobState.GAVE_UP)
                self.events.log(JobGaveUp(reason=f"checkpoint_dir is not safe any more: {unsafe}"))
                return exit_code(self.state)
            result = await self._run_attempt()
            if result.outcome is Outcome.SUCCEEDED:
                self.transition(JobState.SUCCEEDED)
                self.events.log(JobSucceeded(last_step=result.last_step))
                return exit_code(self.state)
            failure = classify(result.observation)
            if result.outcome is Outcome.STOPPED:
                note = "" if result.stop_step is not None else _NO_STOP_CHECKPOINT
                reason = self.stop_reason or StopReason.STOPPED
                return await self._stopped(reason, result.stop_step, note)
            self.events.log(failure_event(failure, result))
            anomaly = result.observation.anomaly
            if failure.kind in ANOMALY_KINDS and anomaly is not None:
                if not self._roll_back(anomaly):
                    return exit_code(self.state)
                continue
            nodes = None
            if failure.kind is FailureKind.NODE_FAILURE:
                nodes = self.launches.lose(failure.nodes)
            decision = decide(self.budget, failure, self.policy, jitter=self._jitter(), nodes=nodes)
            if isinstance(decision, GiveUp):
                self.transition(JobState.GAVE_UP)
                self.events.log(JobGaveUp(reason=decision.reason))
                return exit_code(self.state)
            if isinstance(decision, Requeue):
                return await self._stopped(decision.reason, None, failure.detail)
            assert isinstance(decision, Restart)
            self.transition(JobState.BACKOFF)
            ended = await self._nodes_round("failure")
            if ended is not None:
                return ended
            self.events.log(
                RestartScheduled(
                    backoff_s=decision.after_s,
                    restarts_left=decision.restarts_left,
                    charged=decision.charged,
                    deterministic=decision.deterministic,
                    note=decision.note,
                )
            )
            await first_done(self._stop_wakeup.wait(), self.clock.sleep(decision.after_s))

    async def _nodes_round(self, when: str) -> ExitCode | None:
        """Health checks and exclusion (:mod:`supervisor.exclusion`); the exit status when the
        job cannot go on in this allocation (requeued away from its excluded nodes, or given
        up), else None."""
        newest = self.tracker.newest_step
        path = None if newest is None else self.tracker.path_of(newest)
        answer = await self.exclusion.round(when, path, self.straggler_nodes)
        self.straggler_nodes.clear()  # excluded now (node_excluded), or nowhere to exclude them
        if answer is None:
            return None
        requeued, problem = False, "the job does not run in a Slurm allocation"
        if self._requeue_away is not None:
            requeued, problem = await self._requeue_away(answer.nodes)
        if requeued:
            self.transition(JobState.STOPPED)
            note = f"{answer.note}; {problem}" if problem else answer.note
            self.events.log(JobStopped(reason="excluded", requeued=True, step=None, note=note))
            return exit_code(self.state)
        self.transition(JobState.GAVE_UP)
        self.events.log(JobGaveUp(reason=f"{answer.note.split(';')[0]}; not requeued: {problem}"))
        return exit_code(self.state)

    def _roll_back(self, anomaly: Anomaly) -> bool:
        """Discard the checkpoints from the anomaly's onset on, record the rollback and the
        skip (the next attempt's environment comes from them); False: the job gave up."""
        policy = self.cfg.anomaly
        steps, committed = self.tracker.steps(), self.tracker.committed
        decision = decide_rollback(self.budget, anomaly, policy, steps, committed)
        if isinstance(decision, RollbackRefused):
            self.transition(JobState.GAVE_UP)
            self.events.log(JobGaveUp(reason=decision.reason))
            return False
        discarded = self.tracker.discard_from(decision.discard_from)
        # snapshots newer than the checkpoint restored: those of the onset and later may hold
        # the damage, and those before it hold steps the rollback skips; none is loaded later
        restored = decision.restore_step
        self.memory.discard_from(0 if restored is None else restored + 1)
        self.events.log(
            RolledBack(
                from_step=anomaly.step,
                to_step=decision.restore_step,
                resume_step=decision.resume_step,
                skipped_steps=decision.skipped_steps,
                onset=decision.discard_from,
                discarded=discarded,
                rollbacks_left=policy.max_rollbacks - self.budget.rollbacks_used - 1,
                note=decision.note,
            )
        )
        self.transition(JobState.BACKOFF)
        left = self.policy.max_restarts - self.budget.restarts_used
        self.events.log(
            RestartScheduled(
                backoff_s=0.0,
                restarts_left=left,
                charged=False,
                deterministic=False,
                note=decision.note,
            )
        )
        return True

    async def _run_attempt(self) -> AttemptResult:
        cfg = self.cfg
        n = self.attempt_no
        self.channel.new_attempt(n)
        self.ranks.clear()
        start = prepare(
            cfg,
            n,
            endpoint=self.channel.endpoint,
            secret_file=self.secret_file,
            budget=self.budget,
            tracker=self.tracker,
            memory=self.memory,
            launches=self.launches,
            slurm_ids=self.slurm_ids,
        )
        plan = start.plan
        self.events.attempt = n
        self.snapshots = SnapshotBook()
        self.losses.begin_attempt(start.resume_step)
        self.resumes.begin_attempt(rollback=self.budget.resume_before is not None)
        self.events.log(start.started)
        self.current = Attempt(
            cfg,
            n,
            plan,
            tree=self.launches.tree(plan),
            channel=self.channel,
            ranks=self.ranks,
            events=self.events,
            tracker=self.tracker,
            commits=self.commits,
            job=self,
            clock=self.clock,
            liveness=self.liveness,
            losses=self.losses,
            snapshots=self.snapshots,
            resumes=self.resumes,
        )
        dropped_before = dict(self.channel.dropped)
        try:
            return await self.current.run()
        finally:
            if (summary := self.snapshots.summary()) is not None:
                self.events.log(summary)
            if (verdict := self.resumes.ended()) is not None:
                self.events.log(verdict)
            self.straggler_nodes.update(self.current.stragglers.to_exclude)
            self.current = None
            self._log_cold_starts()
            if dict(self.channel.dropped) != dropped_before:
                self.events.log(MessagesDropped(counts=dict(self.channel.dropped)))

    # ------------------------------------------------------------------ stopping
    def request_stop(self, reason: StopReason, source: str) -> None:
        """Called from signal handlers and the control socket: only records and forwards."""
        if self.stop_reason is not None or self.state in (
            JobState.SUCCEEDED,
            JobState.GAVE_UP,
            JobState.STOPPED,
        ):
            return
        self.stop_reason = reason
        self.notifier.stopping(f"stopping: {reason}")
        self.events.log(StopRequested(reason=reason, source=source))
        self._stop_wakeup.set()
        if self.current is not None:
            self.current.request_stop(reason)

    async def _stopped(self, reason: StopReason, step: int | None, note: str) -> ExitCode:
        if self.state is JobState.STARTING:  # stopped before the first attempt's launch
            self.transition(JobState.STOPPING)
        if self.state is not JobState.STOPPED:
            self.transition(JobState.STOPPED)
        requeued = False
        if reason in (StopReason.PREEMPTED, StopReason.TIMELIMIT):
            requeued = await self._requeue(reason)
        self.events.log(JobStopped(reason=reason, requeued=requeued, step=step, note=note))
        return exit_code(self.state)

    # ------------------------------------------------------------------ rvsup status
    def status(self) -> dict[str, Any]:
        now = self.clock.monotonic()
        cur = self.current
        if cur is not None:
            cur.refresh_steps()
        return {
            "ok": True,
            "job": self.cfg.job.name,
            "pid": os.getpid(),
            "state": self.state.name.lower(),
            "attempt": self.attempt_no,
            "restarts_used": self.budget.restarts_used,
            "excluded_nodes": dict(self.budget.excluded),
            "max_restarts": self.policy.max_restarts,
            "newest_checkpoint_step": self.tracker.newest_step,
            "hang_timeout_s": None if cur is None else cur.hang_check.silence.timeout_s,
            "stop_reason": None if self.stop_reason is None else str(self.stop_reason),
            "ranks": [st.to_status(now) for st in sorted(self.ranks, key=lambda s: s.rank)],
            "straggler": None if cur is None else cur.stragglers.status(now),
            "busy": None if cur is None else cur.hang_check.slow.status(now),
            "agents": None if cur is None else cur.hang_check.agents.status(now),
            "exclude_at_restart": {
                **self.straggler_nodes,
                **({} if cur is None else cur.stragglers.to_exclude),
            },
            "checkpoint_failures": [
                {"rank": rank, "step": step, "reason": reason}
                for rank, step, reason in ([] if cur is None else cur.checkpoints.failures[-5:])
            ],
            "messages": {
                "accepted": self.channel.accepted,
                "dropped": dict(self.channel.dropped),
            },
        }
