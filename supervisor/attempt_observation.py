"""What an attempt hears and how it reacts: the rank channel's messages (the ranks', and on
several nodes their node agents' beats and looks), the ranks' exits and their checkpoints.

A part of :class:`supervisor.attempt.Attempt` (its base class), kept apart so that each fits in
a head: the attempt's lifecycle, tick and ending there, its observation here. Nothing here
decides; a sign of failure ends the attempt through its :class:`~supervisor.attempt_end.AttemptEnd`,
and the job's state changes only through the :class:`JobOwner`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

from supervisor.agent.wire import Beat
from supervisor.attempt_end import AttemptEnd
from supervisor.config.model import JobConfig
from supervisor.loops import Clock
from supervisor.outcome import Ending, Evidence
from supervisor.process.diagnostics import read_steps
from supervisor.process.tree import ProcessTree
from supervisor.ranks.channel import Channel
from supervisor.ranks.checkpoints import CheckpointsSeen, CommitTracker, commit_event
from supervisor.ranks.coordinated import Saves
from supervisor.ranks.exits import ExitBook
from supervisor.ranks.hang_check import HangCheck
from supervisor.ranks.rank_table import RankTable
from supervisor.ranks.reports import exit_from_report, report_from_message
from supervisor.ranks.resume_prints import ResumeBook, Verdict, stopping
from supervisor.ranks.snapshots import SnapshotBook
from supervisor.ranks.stragglers import StragglerReports
from supervisor.ranks.training import TrainingChecks, anomaly_event
from supervisor.record import rank_logs
from supervisor.record.events import EventLog
from supervisor.rules.observation import Anomaly, RankExit, StopReason
from supervisor.rules.states import JobState
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

__all__ = ["AttemptObservation", "JobOwner"]


class JobOwner(Protocol):
    """The one owner of the job's state (the supervisor)."""

    @property
    def state(self) -> JobState: ...

    def transition(self, new: JobState) -> None:
        """The only way the job's state changes."""


class AttemptObservation:
    """The observing half of an attempt (see the module docstring); the attempt's parts it
    uses are made by :class:`supervisor.attempt.Attempt`."""

    cfg: JobConfig
    number: int
    channel: Channel
    clock: Clock
    job: JobOwner
    world_size: int
    diag_dir: Path
    ranks: RankTable
    tree: ProcessTree
    events: EventLog
    tracker: CommitTracker
    snapshots: SnapshotBook
    resumes: ResumeBook
    saves: Saves
    hang_check: HangCheck
    stragglers: StragglerReports
    checkpoints: CheckpointsSeen
    exits: ExitBook
    evidence: Evidence
    training: TrainingChecks
    end: AttemptEnd
    stop_reason: StopReason | None

    async def _receive_loop(self) -> None:
        while True:
            batch = await self.channel.receive_batch()
            now = self.clock.monotonic()
            for identity, msg in batch:
                self._on_message(identity, msg, now)

    def _on_message(self, identity: bytes, msg: p.Message, now: float) -> None:
        if msg.rank < 0:  # a node agent's: its node's heartbeats, or what it saw of a rank
            self._on_beats(identity, self.hang_check.agents.heard(identity, msg, now), now)
            return
        body = m.read(msg)
        if isinstance(body, m.RankExit):  # from the rank's parent, not the rank: no sign of life
            self._on_exit_report(msg, body, now)
            return
        st = self.ranks.fold(identity, msg.rank, msg.pid, body, now)
        match body:
            case m.Hello():
                self.tree.watch_rank(msg.pid, msg.rank, st.host)
                rank_logs.note_hello(
                    self.cfg.job.run_dir, self.number, msg.rank, body.stdout, body.stderr
                )
                self.saves.ask(msg.rank, now)
            case m.Heartbeat():
                self._on_heartbeat(msg.rank, body, now)
            case m.Exiting(_, reason):
                self.exits.exiting(msg.rank, reason, now)
            case m.Sync():
                self.saves.answer(identity, msg.rank, body)
            case m.CheckpointCommitted() | m.CheckpointExternal():
                # external: rvsup's marker of the framework's own checkpoint (its manifest
                # names it; the watchdog and a restarted daemon read it from there too)
                self._on_commit(Path(body.path), seconds=body.seconds, source="sdk")
            case m.CheckpointFailed():
                self.events.log(self.checkpoints.trouble(msg.rank, body))
            case m.CheckpointSkipped():
                self.events.log(self.checkpoints.trouble(msg.rank, body))
                self.tracker.mark_damaged(Path(body.path))  # no rollback target, not the newest
            case m.Snapshots() if (off := self.snapshots.heard(body)) is not None:
                self.events.log(off)
            case m.Loaded():
                self._on_loaded(body)
            case m.StepPrints():
                self._on_resume_verdict(self.resumes.heard(msg.rank, body), now)
            case m.Failure():
                self.evidence.reports.append(report_from_message(msg))
                self._sign_of_failure(now)
        self._on_anomaly(self.training.heard(msg.rank, body), now)
        self.training.protect(self.evidence.anomaly, self.tracker.newest_step)

    def _on_beats(self, identity: bytes, beat: Beat, now: float) -> None:
        """What a node agent's beat carried: the heartbeats, each heard ``age_s`` before it, as
        :meth:`_on_heartbeat` for each, in one pass (thousands a second); the exact steps read
        from the step slots of its node's ranks."""
        for rank, step in beat.steps.items():
            self._exact_step(rank, step, now)
        if not beat.ranks:
            return
        ranks, stragglers, saves, training = self.ranks, self.stragglers, self.saves, self.training
        for rank, pid, step, longest_s, loss, wait_s, age_s in beat.ranks:
            ranks.beat(identity, rank, pid, step, longest_s, now - age_s)
            stragglers.heard(rank, step, wait_s, now)
            saves.ask(rank, now)
            if (anomaly := training.beat(rank, step, loss)) is not None:
                self._on_anomaly(anomaly, now)
        self._running_once_all_stepped()
        training.protect(self.evidence.anomaly, self.tracker.newest_step)

    def _on_heartbeat(self, rank: int, body: m.Heartbeat, now: float) -> None:
        self.stragglers.heard(rank, body.step, body.comm_wait_s, now)
        self._running_once_all_stepped()
        self.saves.ask(rank, now)

    def _running_once_all_stepped(self) -> None:
        """A starting job is running once every rank has finished a first step."""
        if self.job.state is JobState.STARTING and self.ranks.started(self.world_size):
            self.job.transition(JobState.RUNNING)

    def _on_loaded(self, body: m.Loaded) -> None:
        """What the ranks resumed from (logged once); the loss rules date onsets from its step,
        which is earlier than planned when the planned checkpoint proved damaged."""
        if (event := self.checkpoints.loaded(body)) is not None:
            self.events.log(event)
            self.training.losses.resumed_at(body.step)
            self.resumes.loaded(body)

    def _on_resume_verdict(self, verdict: Verdict | None, now: float) -> None:
        """The resume check's verdict: logged; one that stops the job ends the attempt."""
        if verdict is not None:
            self.events.log(verdict)
        if (diverged := stopping(verdict)) is not None and self._ends_in_failure(now):
            self.evidence.diverged = diverged

    def _on_anomaly(self, anomaly: Anomaly | None, now: float) -> None:
        """The training went wrong: record it and end the attempt (a rollback follows)."""
        if anomaly is not None and self.evidence.anomaly is None and self._ends_in_failure(now):
            self.evidence.anomaly = anomaly
            self.events.log(anomaly_event(anomaly))

    def _ends_in_failure(self, now: float) -> bool:
        """End the attempt as failed now, unless it is over or a requested stop goes on."""
        if self.end.over or self.stop_reason is not None:
            return False
        self.evidence.noticed(now, self.clock.wall())
        self.end.finish(Ending.FAILED)
        return True

    def _on_exit_report(self, msg: p.Message, report: m.RankExit, now: float) -> None:
        """A rank's waiting parent says how the rank ended (and its last step)."""
        self._exact_step(msg.rank, report.last_step, now)
        ended = exit_from_report(msg)
        if ended is not None and self.tree.record(ended):
            self._on_rank_exit(ended)

    def refresh_steps(self) -> None:
        """Each rank's exact last finished step, from the step slots of the ranks on this node
        (heartbeats, rate-limited, can be a second old)."""
        now = self.clock.monotonic()
        for rank, step in read_steps(self.diag_dir, [st.rank for st in self.ranks]).items():
            self._exact_step(rank, step, now)

    def _exact_step(self, rank: int, step: object, now: float) -> None:
        if not self.evidence.steps_final:
            self.ranks.exact_step(rank, step, now)

    def _on_rank_exit(self, ended: RankExit) -> None:
        """A rank's end, seen here or reported by its parent (each told once)."""
        if ended.exit_code == 0:
            return
        if ended.signal is not None and not self.end.over:
            self.tree.hold_launcher()  # the attempt ends: torchrun must not race the teardown
        self._sign_of_failure(self.clock.monotonic())

    def _on_commit(self, path: Path, *, seconds: float | None, source: str) -> None:
        commit = self.tracker.observe(path, seconds=seconds, source=source)
        if commit is None:
            return
        self.ranks.commit_seen(commit.step)
        self.checkpoints.last_commit_t = self.clock.monotonic()
        self.events.log(commit_event(commit))
        if self.saves.finished_by(commit.step):
            self.job.transition(JobState.RUNNING)

    def _sign_of_failure(self, now: float) -> None:
        self.evidence.noticed(now, self.clock.wall(), first=True)
        if self.stop_reason is not None:  # a rank died during the stop: give up on the stop
            self.end.finish(Ending.STOPPED)
            return
        self.end.failure_seen()
