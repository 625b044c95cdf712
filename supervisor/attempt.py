"""One attempt: observe the ranks until the attempt ends, then say how it ended.

Observation only: messages from the rank channel, process exits (through the attempt's
:class:`ProcessTree`), and a 0.1 s tick for hangs and scheduled saves. What it hears and how it
reacts is its base, :class:`~supervisor.attempt_observation.AttemptObservation`; what it sees
goes to its parts from ``supervisor/ranks/`` (its hang check, saves, exits, checkpoints seen,
training checks) and to its :class:`~supervisor.outcome.Evidence`;
:class:`~supervisor.attempt_end.AttemptEnd` says when it ends,
:func:`~supervisor.outcome.result_of` how. It never decides whether to restart
(``rules.policy.decide``), and it keeps no job state of its own: it reads and changes the state
of the :class:`~supervisor.attempt_observation.JobOwner` (the supervisor), whose ``transition``
is the only way it changes. Its loops run under :func:`~supervisor.loops.run_beside`: a loop
that raises ends the attempt with that error instead of leaving it waiting. Whatever happens,
including cancellation, the attempt's whole process tree is torn down and reaped before
:meth:`Attempt.run` returns (the teardown is shielded from cancellation).
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from supervisor.attempt_end import AttemptEnd
from supervisor.attempt_observation import AttemptObservation, JobOwner
from supervisor.config.model import JobConfig
from supervisor.loops import SYSTEM_CLOCK, Clock, Liveness, run_beside, shielded
from supervisor.outcome import AttemptResult, Ending, Evidence, result_of
from supervisor.process.cgroup import ended_events
from supervisor.process.launch_plan import LaunchPlan
from supervisor.process.tree import ProcessTree
from supervisor.ranks.channel import Channel
from supervisor.ranks.checkpoints import CheckpointsSeen, CommitTracker
from supervisor.ranks.coordinated import Saves
from supervisor.ranks.exits import EXIT_GRACE_S, ExitBook
from supervisor.ranks.hang_check import HangCheck
from supervisor.ranks.rank_table import RankTable
from supervisor.ranks.resume_prints import ResumeBook
from supervisor.ranks.snapshots import SnapshotBook
from supervisor.ranks.stragglers import StragglerReports
from supervisor.ranks.training import TrainingChecks
from supervisor.record import rundir
from supervisor.record.events import EventLog
from supervisor.rules import failures
from supervisor.rules.anomalies import LossWatch
from supervisor.rules.observation import StopReason
from supervisor.rules.states import JobState

__all__ = ["EXIT_GRACE_S", "TICK_S", "Attempt"]

TICK_S = 0.1
_SCAN_STARTING_S = 0.25  # how often to look for ranks that have not said hello, while starting
_SCAN_RUNNING_S = 2.0


class Attempt(AttemptObservation):
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
        losses: LossWatch,
        snapshots: SnapshotBook,
        resumes: ResumeBook,
        clock: Clock = SYSTEM_CLOCK,
        liveness: Liveness | None = None,
    ) -> None:
        self.cfg = cfg
        self.snapshots = snapshots  # the memory tier's summary (supervisor/ranks/snapshots.py)
        self.resumes = resumes  # the resume check (supervisor/ranks/resume_prints.py)
        self.number = number
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
            channel=channel,
        )
        self.stragglers = StragglerReports(exclude=cfg.health.stragglers_excluded)
        self.checkpoints = CheckpointsSeen(tracker.newest_step, clock.monotonic())
        self.exits = ExitBook(self.world_size)
        self.evidence = Evidence()
        self.training = TrainingChecks(losses, tracker.directory, self.world_size)
        self.end = AttemptEnd(clock, plan.nnodes, self._scripts_finished)

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> AttemptResult:
        done = self.end.begin()
        self.checkpoints.last_commit_t = self.clock.monotonic()
        self.training.begin(self.tracker.newest_step)
        self.hang_check.silence.restart_clock(self.checkpoints.last_commit_t)
        loops = {"receive": self._receive_loop(), "tick": self._tick_loop()}
        if self.commits is not None:
            loops["watch"] = self._watch_loop()
        ending = Ending.FAILED
        diagnostics: str | None = None
        lost: dict[str, str] = {}
        try:
            self.tree.start(self._on_launcher_exit, self._on_rank_exit)
            ending = await run_beside(done, loops)
            if ending is Ending.HANG:
                # the steps as they were when the hang was caught: a stopped rank continued to
                # dump its stacks goes on training while the diagnostics are collected
                self.refresh_steps()
                self.evidence.steps_final = True
                diagnostics, self.evidence.verdict = await self.hang_check.diagnose()
            if ending in (Ending.FAILED, Ending.HANG) and self.stop_reason is None:
                lost = self.hang_check.lost_agents | await self.tree.lost_nodes()
            steps = self.ranks.last_steps()
            for aborted in self.exits.aborted(self.tree.exits, steps, self.tree.stderr_tail):
                self.events.log(aborted)
        finally:
            self.hang_check.close_phase(self.clock.monotonic(), finished=False)
            for name in loops:
                self.liveness.forget(name)
            self.end.close()
            if ending is not Ending.SUCCEEDED:
                self.job.transition(JobState.TEARING_DOWN)
            report = await shielded(self.tree.teardown(lost_nodes=tuple(lost)))
            if report is not None:
                for event in ended_events(report, scope="attempt", mechanism=self.tree.mechanism):
                    self.events.log(event)
        return self._result(ending, diagnostics, lost)

    @property
    def state(self) -> JobState:
        """The job's state, as its owner has it."""
        return self.job.state

    def request_stop(self, reason: StopReason) -> None:
        """Checkpoint at a common step, then let the ranks exit (deadline: launch.stop_timeout)."""
        if self.stop_reason is not None or self.end.over:
            return
        self.stop_reason = reason
        now = self.clock.monotonic()
        self.end.stop_by(now + self.cfg.launch.stop_timeout_s)
        if not any(st.first_step_t is not None for st in self.ranks):
            # nobody has trained yet: the newest checkpoint is what they loaded; nothing to save
            self.end.finish(Ending.STOPPED)
            return
        self.job.transition(JobState.STOPPING)
        self.saves.begin(stop=True, now=now)

    def _on_launcher_exit(self, rc: int) -> None:
        if rc == 0 and not self.evidence.reports and not self.exits.left_for_stop:
            self.end.finish(Ending.SUCCEEDED)  # even with a stop pending: the training ended first
        elif self.stop_reason is not None:
            self.end.finish(Ending.STOPPED)
        else:
            self._sign_of_failure(self.clock.monotonic())

    async def _watch_loop(self) -> None:
        assert self.commits is not None
        while True:
            path = await self.commits.get()
            began = self.ranks.save_began(self.tracker.step_of(path))
            seconds = self.clock.monotonic() - began if began is not None else None
            self._on_commit(path, seconds=seconds, source="watchdog")

    def _scripts_finished(self) -> bool:
        """After a sign of failure, the evidence settled: every script ended by itself."""
        return failures.scripts_finished(
            self.world_size, self.exits.ended, self.tree.exits, self.evidence.reports
        )

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
                nodes = self.ranks.nodes()
                if (straggler := self.stragglers.judge(now, nodes)) is not None:
                    self.events.log(straggler)
            self.end.tick(now)

    def _check_exit_stall(self, now: float) -> None:
        """Every rank's script ended without a failure, yet some interpreter has not exited
        after :data:`EXIT_GRACE_S`: the training is done; the teardown ends the stragglers."""
        if self.end.over or self.evidence.reports:
            return
        stalled = self.exits.stalled(now, self.tree.exits)
        if stalled is not None:
            self.events.log(stalled)
            self.end.finish(Ending.SUCCEEDED)

    def _check_hang(self, now: float) -> None:
        if self.end.over or self.stop_reason is not None:
            return
        if self.hang_check.nodes_lost(now) and self._ends_in_failure(now):
            return  # a node agent fell silent: its node is lost
        found = self.hang_check.check(now)
        if found is None:
            return
        self.refresh_steps()
        self.evidence.hung(found, self.ranks.last_steps(), now, self.clock.wall())
        self.end.finish(Ending.HANG)

    def _maybe_schedule_save(self, now: float) -> None:
        if self.state is JobState.RUNNING and self.saves.due(now, self.checkpoints.last_commit_t):
            self.job.transition(JobState.SAVING)
            self.saves.begin(stop=False, now=now)

    # ------------------------------------------------------------------ ending
    def _result(
        self, ending: Ending, diagnostics: str | None, lost: dict[str, str]
    ) -> AttemptResult:
        self.refresh_steps()
        newest = self.tracker.newest_step
        stopped = ending is Ending.STOPPED and self.saves.committed_by(newest)
        return result_of(
            ending,
            self.evidence,
            self.tree,
            last_steps={r: s for r, s in self.ranks.last_steps().items() if s >= 0},
            rank_nodes=self.ranks.nodes(),
            hang_timeout_s=self.hang_check.silence.timeout_s,
            stop_reason=self.stop_reason,
            slow_note=self.hang_check.slow.note,
            stop_step=newest if stopped else None,
            progressed=self.checkpoints.progressed(newest),
            diagnostics=diagnostics,
            lost=lost,
            node_oom_kills=self.hang_check.agents.oom_kills(),
        )
