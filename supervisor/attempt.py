"""One attempt: observe the ranks until the attempt ends, then say how it ended.

Observation only: messages, process exits (pidfds), a 0.1 s tick for hangs and scheduled saves.
It never decides whether to restart (``policy.decide``) and it changes the job's state only through
the ``transition`` callback the supervisor gives it. Whatever happens, including cancellation, the
attempt's whole process tree is torn down and reaped before :meth:`Attempt.run` returns.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psutil

from supervisor.config.load import JobConfig
from supervisor.process import launcher, proctree
from supervisor.process.launcher import LaunchPlan
from supervisor.ranks import diagnostics
from supervisor.ranks.channel import HeartbeatEndpoint, RankTable, exit_from_report
from supervisor.ranks.checkpoints import CommitTracker, DirectoryWatch
from supervisor.ranks.coordinated import SaveRound, answer_without_round
from supervisor.ranks.exits import ExitLedger
from supervisor.record.events import EventLog
from supervisor.rules import hangs
from supervisor.rules.failures import Observation, RankExit, RankReport
from supervisor.rules.states import JobState
from supervisor.slurm import commands as slurm
from worker_sdk import protocol as p

TICK_S = 0.1
SETTLE_S = 0.05  # after the first sign of a failure, gather the rest of the evidence this long


@dataclass(frozen=True, slots=True)
class AttemptResult:
    outcome: str  # "succeeded" | "failed" | "stopped"
    observation: Observation
    detect_s: float | None  # hangs: how long the most silent rank had been silent when caught
    diagnostics: str | None
    progressed: bool
    last_step: int | None
    stop_step: int | None  # the checkpoint committed by a stop, if any
    noticed_at: float | None  # wall-clock time of the first sign of the failure (for the history)


class Attempt:
    """Runs and watches attempt ``number`` of the job."""

    def __init__(
        self,
        cfg: JobConfig,
        number: int,
        plan: LaunchPlan,
        *,
        endpoint: HeartbeatEndpoint,
        ranks: RankTable,
        events: EventLog,
        tracker: CommitTracker,
        watch: DirectoryWatch | None,
        transition: Callable[[JobState], None],
        spawn: Callable[[LaunchPlan], subprocess.Popen[bytes]] = launcher.spawn,
    ) -> None:
        self.cfg = cfg
        self.number = number
        self.plan = plan
        self.endpoint = endpoint
        self.ranks = ranks
        self.events = events
        self.tracker = tracker
        self.watch = watch
        self._transition = transition
        self._spawn = spawn
        self.world_size = plan.nnodes * plan.nproc_per_node
        self.diag_dir = cfg.job.run_dir / "diagnostics" / f"attempt-{number}"
        self.sync: SaveRound | None = None
        self.stop_reason: str | None = None
        self.hang_timeout_s: float | None = cfg.heartbeat.hang_timeout_s
        self._started_step = tracker.newest_step
        self._last_commit_t = time.monotonic()
        self._popen: subprocess.Popen[bytes] | None = None
        self._ledger = ExitLedger(self._on_exit, reports_expected=plan.alloc is not None)
        self._reports: list[RankReport] = []
        self._silent: tuple[int, ...] = ()
        self._launcher_rc: int | None = None
        self._first_sign_t: float | None = None
        self._ending: asyncio.TimerHandle | None = None
        self._done: asyncio.Future[str] | None = None
        self._stop_deadline = float("inf")
        self._hang_silence_s: float | None = None
        self._noticed_at: float | None = None
        self._oom_baseline = proctree.host_oom_kill_count()
        self._left_for_stop: set[int] = set()  # ranks that exited because a stop asked them to
        self._lost_nodes: tuple[str, ...] = ()
        self._t0 = time.monotonic()
        self.state = JobState.STARTING

    # ------------------------------------------------------------------ lifecycle
    async def run(self) -> AttemptResult:
        loop = asyncio.get_running_loop()
        self._done = loop.create_future()
        self._t0 = time.monotonic()
        self._popen = self._spawn(self.plan)
        self._ledger.watch(self._popen.pid, rank=None)
        tasks = [
            asyncio.create_task(self._receive_loop(), name="receive"),
            asyncio.create_task(self._tick_loop(), name="tick"),
        ]
        if self.watch is not None:
            tasks.append(asyncio.create_task(self._watch_loop(), name="watch"))
        outcome = "failed"
        try:
            outcome = await self._done
            diagnostics = await self._dump_stacks_if_hung(outcome)
            self._lost_nodes = await self._find_lost_nodes(outcome)
        finally:
            if outcome != "succeeded":
                self._set_state(JobState.TEARING_DOWN)
            for t in tasks:
                t.cancel()
            for t in tasks:
                with contextlib.suppress(asyncio.CancelledError):
                    await t
            await self._teardown()
        return self._result(outcome, diagnostics)

    def request_stop(self, reason: str) -> None:
        """Checkpoint at a common step, then let the ranks exit (deadline: launch.stop_timeout)."""
        if self.stop_reason is not None or self._is_ending():
            return
        self.stop_reason = reason
        now = time.monotonic()
        self._stop_deadline = now + self.cfg.launch.stop_timeout_s
        if not any(st.first_step_t is not None for st in self.ranks):
            # nobody has trained yet: the newest checkpoint is what they loaded; nothing to save
            self._finish("stopped")
            return
        self._set_state(JobState.STOPPING)
        self._begin_sync(stop=True, now=now)

    # ------------------------------------------------------------------ observation
    async def _receive_loop(self) -> None:
        while True:
            for identity, msg in await self.endpoint.receive_batch():
                self._on_message(identity, msg, time.monotonic())

    def _on_message(self, identity: bytes, msg: p.Message, now: float) -> None:
        kind = msg.kind
        if kind is p.Kind.RANK_EXIT:  # from the rank's parent, not the rank: no sign of life
            self._on_exit_report(msg, now)
            return
        st = self.ranks.observe(identity, msg, now)
        if kind is p.Kind.HELLO:
            if st.host == self._ledger.host or self.plan.nnodes == 1:
                self._ledger.watch(msg.pid, rank=msg.rank)
            if self.sync is not None:
                self.sync.ask(self.endpoint, self.ranks, msg.rank, now)
        elif kind is p.Kind.HEARTBEAT:
            if self.state is JobState.STARTING and self._all_started():
                self._set_state(JobState.RUNNING)
            if self.sync is not None:
                self.sync.ask(self.endpoint, self.ranks, msg.rank, now)
        elif kind is p.Kind.EXITING:
            if msg.payload.get("reason") == "stop requested":
                self._left_for_stop.add(msg.rank)
        elif kind is p.Kind.SYNC:
            if self.sync is None:
                answer_without_round(self.endpoint, identity, msg)
            else:
                self.sync.answer(self.endpoint, identity, msg)
        elif kind is p.Kind.CKPT_COMMITTED:
            path = Path(str(msg.payload.get("path", "")))
            self._on_commit(path, seconds=msg.value, source="sdk")
        elif kind is p.Kind.CKPT_SKIPPED:
            self.events.checkpoint_skipped(
                path=str(msg.payload.get("path")),
                reason=str(msg.payload.get("reason")),
                rank=msg.rank,
            )
        elif kind is p.Kind.FAILURE:
            self._reports.append(
                RankReport(
                    rank=msg.rank,
                    kind=str(msg.payload.get("kind", "exception")),
                    type=str(msg.payload.get("type", "")),
                    message=str(msg.payload.get("message", "")),
                    step=msg.step,
                )
            )
            self._sign_of_failure(now)

    def _on_exit_report(self, msg: p.Message, now: float) -> None:
        """A rank's waiting parent says how the rank ended (multi-node attempts: the only news
        of a rank on another node, and of a local one its parent reaped before we looked)."""
        ended = exit_from_report(msg)
        if ended is not None:
            self._record_exit(ended, now)

    def _record_exit(self, ended: RankExit, now: float) -> None:
        """Record one rank's end once (a pidfd and a report may both tell of it)."""
        if self._ledger.record(ended) and ended.exit_code != 0:
            self._sign_of_failure(now)

    def _all_started(self) -> bool:
        started = [st for st in self.ranks if st.first_step_t is not None]
        return len(started) >= self.world_size

    async def _watch_loop(self) -> None:
        assert self.watch is not None
        while True:
            path = await self.watch.queue.get()
            began = [st.saving_since for st in self.ranks if st.saving_since is not None]
            seconds = time.monotonic() - min(began) if began else None
            self._on_commit(path, seconds=seconds, source="watchdog")

    def _on_commit(self, path: Path, *, seconds: float | None, source: str) -> None:
        commit = self.tracker.observe(path, seconds=seconds, source=source)
        if commit is None:
            return
        self.ranks.commit_seen(commit.step)
        self._last_commit_t = time.monotonic()
        self.events.checkpoint_committed(
            step=commit.step,
            path=str(commit.path),
            seconds=commit.seconds,
            nbytes=commit.nbytes,
            source=commit.source,
        )
        if self.sync is not None and not self.sync.stop and self.sync.committed_by(commit.step):
            self.sync = None
            self._set_state(JobState.RUNNING)

    def _on_exit(self, pid: int) -> None:
        now = time.monotonic()
        if self._popen is not None and pid == self._popen.pid:
            self._ledger.unwatch(pid)
            self._launcher_rc = self._popen.wait()
            self._on_launcher_exit(now)
            return
        ended = self._ledger.from_zombie(pid)
        if ended is not None:
            self._record_exit(ended, now)

    def _on_launcher_exit(self, now: float) -> None:
        rc = self._launcher_rc
        if rc == 0 and not self._reports and not self._left_for_stop:
            self._finish("succeeded")  # even with a stop pending: the training ended first
        elif self.stop_reason is not None:
            self._finish("stopped")
        else:
            self._sign_of_failure(now)

    def _sign_of_failure(self, now: float) -> None:
        if self._first_sign_t is None:
            self._first_sign_t = now
            self._noticed_at = time.time()
        if self.stop_reason is not None:  # a rank died during the stop: give up on the stop
            self._finish("stopped")
            return
        if self._ending is None and not self._is_ending():
            self._ending = asyncio.get_running_loop().call_later(SETTLE_S, self._finish, "failed")

    # ------------------------------------------------------------------ the tick
    async def _tick_loop(self) -> None:
        next_scan = 0.0
        while True:
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            if now >= next_scan:
                self._scan_ranks()
                next_scan = now + (0.25 if self.state is JobState.STARTING else 2.0)
            self._check_hang(now)
            self._maybe_schedule_save(now)
            if now >= self._stop_deadline:
                self._finish("stopped")

    def _scan_ranks(self) -> None:
        """Find local rank processes (torchrun's children) that have not said hello yet."""
        if self._popen is None or self.plan.nnodes > 1:
            return
        try:
            children = psutil.Process(self._popen.pid).children()
        except psutil.Error:
            return
        for child in children:
            if not self._ledger.is_watched(child.pid):
                try:
                    rank = int(child.environ().get("RANK", "-1"))
                except (psutil.Error, ValueError):
                    rank = -1
                self._ledger.watch(child.pid, rank=None if rank < 0 else rank)

    def _check_hang(self, now: float) -> None:
        if self._is_ending() or self.stop_reason is not None:
            return
        hb = self.cfg.heartbeat
        if hb.hang_timeout_s is None:
            self.hang_timeout_s = hangs.auto_timeout(
                self.ranks.step_times.percentile(hangs.PERCENTILE),
                interval_s=hb.interval_s,
                ceiling_s=hb.hang_timeout_max_s,
            )
        # cheap pre-check, every tick, over thousands of ranks: nobody has been quiet for even
        # the shortest allowance any rank can get
        shortest = min(self.hang_timeout_s or hb.startup_timeout_s, hb.startup_timeout_s)
        quiet_since = now - shortest
        complete = len(self.ranks.ranks) >= self.world_size
        if (complete or now - self._t0 <= shortest) and not any(
            st.last_progress_t < quiet_since for st in self.ranks
        ):
            return
        # once a rank has left cleanly the job is finishing: the others get the longer allowance
        finishing = self._ledger.any_left_cleanly()
        silences = [
            hangs.Silence(
                rank=st.rank,
                silent_s=now - st.last_progress_t,
                started=st.first_step_t is not None,
                busy=finishing or st.phase is not None or st.saving_since is not None,
            )
            for st in self.ranks
        ]
        missing = set(range(self.world_size)) - {st.rank for st in self.ranks}
        silences += [hangs.Silence(r, now - self._t0, False, False) for r in sorted(missing)]
        hung = hangs.hung_ranks(
            silences, timeout_s=self.hang_timeout_s, startup_timeout_s=hb.startup_timeout_s
        )
        if hung:
            last_steps = {st.rank: st.last_step for st in self.ranks}
            self._silent, self._hang_silence_s = hangs.quiet_ranks(silences, hung, last_steps)
            self._first_sign_t = now
            self._noticed_at = time.time()
            self._finish("hang")

    def _maybe_schedule_save(self, now: float) -> None:
        every = self.cfg.checkpoint.every_s
        if every is None or self.sync is not None or self.state is not JobState.RUNNING:
            return
        if now - self._last_commit_t >= every:
            self._set_state(JobState.SAVING)
            self._begin_sync(stop=False, now=now)

    # ------------------------------------------------------------------ coordinated saves
    def _begin_sync(self, *, stop: bool, now: float) -> None:
        self.sync = SaveRound(
            stop=stop,
            world_size=self.world_size,
            resend_after_s=2 * self.cfg.heartbeat.interval_s,
            started_t=now,
        )
        self.sync.ask_all(self.endpoint, self.ranks, now)

    # ------------------------------------------------------------------ ending
    def _is_ending(self) -> bool:
        return self._done is None or self._done.done()

    def _finish(self, outcome: str) -> None:
        if self._done is not None and not self._done.done():
            self._done.set_result(outcome)

    def _set_state(self, new: JobState) -> None:
        if new is not self.state:
            self.state = new
            self._transition(new)

    async def _dump_stacks_if_hung(self, outcome: str) -> str | None:
        if outcome != "hang":
            return None
        return await diagnostics.collect_stacks(self._ledger.known_ranks(), self.diag_dir)

    async def _teardown(self) -> None:
        self._ledger.close()
        if self._popen is None:
            return
        pids = set(self._ledger.rank_of_pid) | {self._popen.pid}
        await asyncio.to_thread(
            proctree.teardown,
            pids,
            term_timeout_s=self.cfg.launch.term_timeout_s,
            popens=[self._popen],
        )
        if self._launcher_rc is None:
            self._launcher_rc = self._popen.returncode

    async def _find_lost_nodes(self, outcome: str) -> tuple[str, ...]:
        """After a multi-node failure: the nodes Slurm says are gone (a probe step, seconds)."""
        alloc = self.plan.alloc
        if alloc is None or outcome not in ("failed", "hang") or self.stop_reason is not None:
            return ()
        return await asyncio.to_thread(slurm.unreachable_nodes, alloc)

    def _host_oom_kills(self) -> int:
        """OOM kills on this host during the attempt, counted only if a rank died of SIGKILL."""
        if not self._ledger.sigkilled or self._oom_baseline is None:
            return 0
        return max(0, (proctree.host_oom_kill_count() or 0) - self._oom_baseline)

    def _result(self, outcome: str, diagnostics: str | None) -> AttemptResult:
        last_steps = {st.rank: st.last_step for st in self.ranks if st.last_step >= 0}
        hb_timeout = self.hang_timeout_s
        obs = Observation(
            exits=tuple(self._ledger.exits),
            reports=tuple(self._reports),
            launcher_exit=self._launcher_rc,
            silent_ranks=self._silent,
            hang_timeout_s=hb_timeout,
            last_steps=last_steps,
            stop_reason=self.stop_reason,
            stderr_tail=launcher.stderr_tail(self.plan.log_dir) if outcome != "succeeded" else "",
            host_oom_kills=self._host_oom_kills(),
            lost_nodes=self._lost_nodes,
        )
        detect_s = self._hang_silence_s if outcome == "hang" else None
        newest = self.tracker.newest_step
        progressed = newest is not None and (
            self._started_step is None or newest > self._started_step
        )
        stop_step = None
        if outcome == "stopped" and self.sync is not None and self.sync.committed_by(newest):
            stop_step = newest
        return AttemptResult(
            outcome="failed" if outcome == "hang" else outcome,
            observation=obs,
            detect_s=detect_s,
            diagnostics=diagnostics,
            progressed=progressed,
            last_step=max(last_steps.values()) if last_steps else None,
            stop_step=stop_step,
            noticed_at=self._noticed_at,
        )
