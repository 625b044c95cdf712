"""One attempt: observe the ranks until the attempt ends, then say how it ended.

Observation only: messages from the rank channel, process exits (through the attempt's
:class:`ProcessTree`), and a 0.1 s tick for hangs and scheduled saves. What it gathers toward its
ending is an :class:`~supervisor.outcome.Evidence`, the checkpoints it saw a
:class:`~supervisor.ranks.checkpoints.CheckpointsSeen`, the ranks' exits an
:class:`~supervisor.ranks.exits.ExitBook`; its hang check is a
:class:`~supervisor.ranks.hang_check.HangCheck`, its saves a
:class:`~supervisor.ranks.coordinated.Saves`, and :func:`~supervisor.outcome.result_of` builds
its result. It never decides whether to restart
(``rules.policy.decide``), and it keeps no job state of its own: it reads and changes the state
of the :class:`JobOwner` (the supervisor), whose ``transition`` is the only way it changes.
Its loops run under :func:`~supervisor.loops.run_beside`: a loop that raises ends the attempt
with that error instead of leaving it waiting. Whatever happens,
including cancellation, the attempt's whole process tree is torn down and reaped before
:meth:`Attempt.run` returns (the teardown is shielded from cancellation).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Protocol

from supervisor.config import JobConfig
from supervisor.loops import SYSTEM_CLOCK, Clock, Liveness, run_beside, shielded
from supervisor.outcome import AttemptResult, Ending, Evidence, result_of
from supervisor.process.cgroup import ended_events
from supervisor.process.diagnostics import read_steps
from supervisor.process.launch_plan import LaunchPlan
from supervisor.process.tree import ProcessTree
from supervisor.ranks.channel import Channel, RankTable, exit_from_report, report_from_message
from supervisor.ranks.checkpoints import (
    CheckpointsSeen,
    CommitTracker,
    commit_event,
    loaded_event,
    trouble_event,
)
from supervisor.ranks.coordinated import Saves
from supervisor.ranks.exits import EXIT_GRACE_S, ExitBook
from supervisor.ranks.hang_check import HangCheck
from supervisor.ranks.snapshots import SnapshotBook
from supervisor.ranks.stragglers import StragglerReports
from supervisor.ranks.training import PruneGuard, anomaly_event, anomaly_in
from supervisor.record import rank_logs, rundir
from supervisor.record.events import EventLog
from supervisor.rules import failures, hangs
from supervisor.rules.anomalies import LossWatch
from supervisor.rules.observation import Anomaly, RankExit, StopReason
from supervisor.rules.states import JobState
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

__all__ = ["EXIT_GRACE_S", "SETTLE_NODES_S", "SETTLE_S", "TICK_S", "Attempt", "JobOwner"]

TICK_S = 0.1
SETTLE_S = 0.05  # after the first sign of a failure, gather the rest of the evidence this long
SETTLE_NODES_S = 0.25  # the same on several nodes, where the ranks' reports cross the network
_SCAN_STARTING_S = 0.25  # how often to look for ranks that have not said hello, while starting
_SCAN_RUNNING_S = 2.0


class JobOwner(Protocol):
    """The one owner of the job's state (the supervisor)."""

    @property
    def state(self) -> JobState: ...

    def transition(self, new: JobState) -> None:
        """The only way the job's state changes."""
        ...


class Attempt:
    """Runs and watches attempt ``number`` of the job."""

    def __init__(
        self,
        cfg: JobConfig,
        number: int,
        plan: LaunchPlan,
        *,
        tree: ProcessTree,
        channel: Channel,
        ranks: RankTable,
        events: EventLog,
        tracker: CommitTracker,
        commits: asyncio.Queue[Path] | None,
        job: JobOwner,
        clock: Clock = SYSTEM_CLOCK,
        liveness: Liveness | None = None,
        losses: LossWatch | None = None,
        snapshots: SnapshotBook | None = None,
    ) -> None:
        self.cfg = cfg
        self.snapshots = snapshots  # the memory tier's summary (supervisor/ranks/snapshots.py)
        self.number = number
        self.losses = losses
        self.plan = plan
        self.tree = tree
        self.channel = channel
        self.ranks = ranks
        self.events = events
        self.tracker = tracker
        self.commits = commits
        self.job = job
        self.clock = clock
        self.liveness = liveness or Liveness(clock)
        self.world_size = plan.nnodes * plan.nproc_per_node
        self.diag_dir = rundir.diagnostics_dir(cfg.job.run_dir, number)
        self.saves = Saves(
            channel,
            ranks,
            world_size=self.world_size,
            resend_after_s=2 * cfg.heartbeat.interval_s,
            every_s=cfg.checkpoint.every_s,
        )
        self.stop_reason: StopReason | None = None
        self.hang_check = HangCheck(
            cfg.heartbeat,
            ranks,
            tree,
            events,
            world_size=self.world_size,
            diag_dir=self.diag_dir,
            t0=clock.monotonic(),
        )
        self.stragglers = StragglerReports(exclude=cfg.health.exclude_stragglers)
        self.checkpoints = CheckpointsSeen(tracker.newest_step, clock.monotonic())
        self.exits = ExitBook(self.world_size)
        self.evidence = Evidence()
        self._guard = PruneGuard(tracker.directory, self.world_size)
        self._settling: asyncio.Task[None] | None = None
        self._done: asyncio.Future[Ending] | None = None
        self._stop_deadline = float("inf")

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> AttemptResult:
        self._done = asyncio.get_running_loop().create_future()
        self.checkpoints.last_commit_t = self.clock.monotonic()
        if self.losses is not None:  # before any report: back to the attempt's first step
            self._guard.update(
                self.losses.earliest_onset(self.world_size), self.tracker.newest_step
            )
        self.hang_check.silence.restart_clock(self.checkpoints.last_commit_t)
        loops = {"receive": self._receive_loop(), "tick": self._tick_loop()}
        if self.commits is not None:
            loops["watch"] = self._watch_loop()
        ending = Ending.FAILED
        diagnostics: str | None = None
        lost: tuple[str, ...] = ()
        try:
            self.tree.start(self._on_launcher_exit, self._on_rank_exit)
            ending = await run_beside(self._done, loops)
            if ending is Ending.HANG:
                # the steps as they were when the hang was caught: a stopped rank continued to
                # dump its stacks goes on training while the diagnostics are collected
                self.refresh_steps()
                self.evidence.steps_final = True
                diagnostics, self.evidence.verdict = await self.hang_check.diagnose()
            if ending in (Ending.FAILED, Ending.HANG) and self.stop_reason is None:
                lost = await self.tree.lost_nodes()
            steps = {st.rank: st.last_step for st in self.ranks}
            for aborted in self.exits.aborted(self.tree.exits, steps, self.tree.stderr_tail):
                self.events.log(aborted)
        finally:
            self.hang_check.close_phase(self.clock.monotonic(), finished=False)
            for name in loops:
                self.liveness.forget(name)
            if self._settling is not None:
                self._settling.cancel()
            if ending is not Ending.SUCCEEDED:
                self.job.transition(JobState.TEARING_DOWN)
            report = await shielded(self.tree.teardown())
            if report is not None:
                for event in ended_events(report, scope="attempt", mechanism=self.tree.mechanism):
                    self.events.log(event)
        return self._result(ending, diagnostics, lost)

    @property
    def state(self) -> JobState:
        """The job's state, as its owner has it."""
        return self.job.state

    @property
    def hang_timeout_s(self) -> float | None:
        """The hang timeout in force (None: the automatic one has seen no step yet)."""
        return self.hang_check.silence.timeout_s

    def request_stop(self, reason: StopReason) -> None:
        """Checkpoint at a common step, then let the ranks exit (deadline: launch.stop_timeout)."""
        if self.stop_reason is not None or self._is_ending():
            return
        self.stop_reason = reason
        now = self.clock.monotonic()
        self._stop_deadline = now + self.cfg.launch.stop_timeout_s
        if not any(st.first_step_t is not None for st in self.ranks):
            # nobody has trained yet: the newest checkpoint is what they loaded; nothing to save
            self._finish(Ending.STOPPED)
            return
        self.job.transition(JobState.STOPPING)
        self.saves.begin(stop=True, now=now)

    # ------------------------------------------------------------------ observation
    async def _receive_loop(self) -> None:
        while True:
            batch = await self.channel.receive_batch()
            now = self.clock.monotonic()
            for identity, msg in batch:
                self._on_message(identity, msg, now)

    def _on_message(self, identity: bytes, msg: p.Message, now: float) -> None:
        body = m.read(msg)
        if isinstance(body, m.RankExit):  # from the rank's parent, not the rank: no sign of life
            self._on_exit_report(msg, body)
            return
        st = self.ranks.observe(identity, msg, now)
        match body:
            case m.Hello():
                self.tree.watch_rank(msg.pid, msg.rank, st.host)
                rank_logs.note_hello(
                    self.cfg.job.run_dir, self.number, msg.rank, body.stdout, body.stderr
                )
                self.saves.ask(msg.rank, now)
            case m.Heartbeat():
                self.stragglers.heard(msg.rank, body, now)
                if self.state is JobState.STARTING and self.ranks.started(self.world_size):
                    self.job.transition(JobState.RUNNING)
                self.saves.ask(msg.rank, now)
            case m.Exiting(_, reason):
                self.exits.exiting(msg.rank, reason, now)
            case m.Sync():
                self.saves.answer(identity, msg.rank, body)
            case m.CheckpointCommitted() | m.CheckpointExternal():
                # external: rvsup's marker of the framework's own checkpoint (its manifest
                # names it; the watchdog and a restarted daemon read it from there too)
                self._on_commit(Path(body.path), seconds=body.seconds, source="sdk")
            case m.CheckpointFailed() | m.CheckpointSkipped() | m.Snapshots():
                self._on_save_report(msg.rank, body)
            case m.Loaded() if not self.checkpoints.loaded_logged:
                self._on_loaded(body)
            case m.Failure():
                self.evidence.reports.append(report_from_message(msg))
                self._sign_of_failure(now)
        if self.losses is not None:
            self._on_anomaly(anomaly_in(self.losses, msg.rank, body), now)
            if self._guard.due():
                onset = self.losses.earliest_onset(self.world_size, self.evidence.anomaly)
                self._guard.update(onset, self.tracker.newest_step)

    def _on_save_report(
        self, rank: int, body: m.CheckpointFailed | m.CheckpointSkipped | m.Snapshots
    ) -> None:
        """A save that failed, a checkpoint passed over at load, the memory tier's summary."""
        if isinstance(body, m.Snapshots):
            if self.snapshots is not None and (off := self.snapshots.heard(body)) is not None:
                self.events.log(off)
            return
        if isinstance(body, m.CheckpointFailed):
            self.checkpoints.failures.append((rank, body.step, body.reason))
        self.events.log(trouble_event(rank, body))

    def _on_loaded(self, body: m.Loaded) -> None:
        """What the ranks resumed from (every rank loads the one checkpoint they all agreed
        on: the first report is logged); the loss rules date onsets from its step, which is
        earlier than planned when the planned checkpoint proved damaged."""
        self.checkpoints.loaded_logged = True
        self.events.log(loaded_event(body))
        if self.losses is not None:
            self.losses.resumed_at(body.step)

    def _on_anomaly(self, anomaly: Anomaly | None, now: float) -> None:
        """The training went wrong: record it and end the attempt (a rollback follows)."""
        if anomaly is None or self.evidence.anomaly is not None or self._is_ending():
            return
        if self.stop_reason is not None:  # a requested stop goes on
            return
        self.evidence.anomaly = anomaly
        self.events.log(anomaly_event(anomaly))
        self.evidence.noticed(now, self.clock.wall())
        self._finish(Ending.FAILED)

    def _on_exit_report(self, msg: p.Message, report: m.RankExit) -> None:
        """A rank's waiting parent says how the rank ended (and its last step)."""
        self._exact_step(msg.rank, report.last_step)
        ended = exit_from_report(msg)
        if ended is not None and self.tree.record(ended):
            self._on_rank_exit(ended)

    def refresh_steps(self) -> None:
        """Each rank's exact last finished step, from the step slots of the ranks on this node
        (heartbeats, rate-limited, can be a second old)."""
        for rank, step in read_steps(self.diag_dir, [st.rank for st in self.ranks]).items():
            self._exact_step(rank, step)

    def _exact_step(self, rank: int, step: object) -> None:
        if not self.evidence.steps_final:
            self.ranks.exact_step(rank, step)

    def _on_rank_exit(self, ended: RankExit) -> None:
        """A rank's end, seen here or reported by its parent (each told once)."""
        if ended.exit_code == 0:
            return
        if ended.signal is not None and not self._is_ending():
            self.tree.hold_launcher()  # the attempt ends: torchrun must not race the teardown
        self._sign_of_failure(self.clock.monotonic())

    def _on_launcher_exit(self, rc: int) -> None:
        if rc == 0 and not self.evidence.reports and not self.exits.left_for_stop:
            self._finish(Ending.SUCCEEDED)  # even with a stop pending: the training ended first
        elif self.stop_reason is not None:
            self._finish(Ending.STOPPED)
        else:
            self._sign_of_failure(self.clock.monotonic())

    async def _watch_loop(self) -> None:
        assert self.commits is not None
        while True:
            path = await self.commits.get()
            began = self.ranks.save_began(self.tracker.step_of(path))
            seconds = self.clock.monotonic() - began if began is not None else None
            self._on_commit(path, seconds=seconds, source="watchdog")

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
            self._finish(Ending.STOPPED)
            return
        if self._settling is None and not self._is_ending():
            self._settling = asyncio.ensure_future(self._settle_then_fail())

    async def _settle_then_fail(self) -> None:
        await self.clock.sleep(SETTLE_S if self.plan.nnodes == 1 else SETTLE_NODES_S)
        ev = self.evidence
        done = failures.scripts_finished(
            self.world_size, self.exits.ended, self.tree.exits, ev.reports
        )
        self._finish(Ending.SUCCEEDED if done else Ending.FAILED)

    # ------------------------------------------------------------------ the tick
    async def _tick_loop(self) -> None:
        next_scan = 0.0
        while True:
            await self.clock.sleep(TICK_S)
            self.liveness.beat("tick")
            now = self.clock.monotonic()
            if now >= next_scan:
                self.tree.scan()
                starting = self.state is JobState.STARTING
                next_scan = now + (_SCAN_STARTING_S if starting else _SCAN_RUNNING_S)
            self._check_hang(now)
            self._check_exit_stall(now)
            self._maybe_schedule_save(now)
            if self.stragglers.due(now):
                nodes = {st.rank: st.host for st in self.ranks if st.host != "?"}
                if (straggler := self.stragglers.judge(now, nodes)) is not None:
                    self.events.log(straggler)
            if now >= self._stop_deadline:
                self._finish(Ending.STOPPED)

    def _check_exit_stall(self, now: float) -> None:
        """Every rank's script ended without a failure, yet some interpreter has not exited
        after :data:`EXIT_GRACE_S`: the training is done; the teardown ends the stragglers."""
        if self._is_ending() or self.evidence.reports:
            return
        stalled = self.exits.stalled(now, self.tree.exits)
        if stalled is not None:
            self.events.log(stalled)
            self._finish(Ending.SUCCEEDED)

    def _check_hang(self, now: float) -> None:
        if self._is_ending() or self.stop_reason is not None:
            return
        found = self.hang_check.check(now)
        if found is None:
            return
        hung = found.ranks or tuple(s.rank for s in found.silences)
        self.refresh_steps()
        last_steps = {st.rank: st.last_step for st in self.ranks}
        ev = self.evidence
        ev.silent, ev.hang_silence_s = hangs.quiet_ranks(found.silences, hung, last_steps)
        ev.noticed(now, self.clock.wall())
        self._finish(Ending.HANG)

    def _maybe_schedule_save(self, now: float) -> None:
        if self.state is JobState.RUNNING and self.saves.due(now, self.checkpoints.last_commit_t):
            self.job.transition(JobState.SAVING)
            self.saves.begin(stop=False, now=now)

    # ------------------------------------------------------------------ ending
    def _is_ending(self) -> bool:
        return self._done is None or self._done.done()

    def _finish(self, ending: Ending) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(ending)

    def _result(
        self, ending: Ending, diagnostics: str | None, lost: tuple[str, ...]
    ) -> AttemptResult:
        self.refresh_steps()
        newest = self.tracker.newest_step
        return result_of(
            ending,
            self.evidence,
            self.tree,
            last_steps={st.rank: st.last_step for st in self.ranks if st.last_step >= 0},
            rank_nodes={st.rank: st.host for st in self.ranks if st.host != "?"},
            hang_timeout_s=self.hang_timeout_s,
            stop_reason=self.stop_reason,
            slow_note=self.hang_check.slow.note,
            stop_step=newest
            if ending is Ending.STOPPED and self.saves.committed_by(newest)
            else None,
            progressed=self.checkpoints.progressed(newest),
            diagnostics=diagnostics,
            lost=lost,
        )
