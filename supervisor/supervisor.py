"""The one place that changes the job's state: observe -> classify -> decide -> act.

:class:`Supervisor` runs attempts (:mod:`supervisor.attempt` observes), classifies how each ended
(:func:`supervisor.failures.classify`, pure), decides what comes next
(:func:`supervisor.policy.decide`, pure) and acts: back off and restart, give up, or stop (and
requeue the Slurm job). Signal handlers only enqueue a stop request. Every transition is checked
against :data:`supervisor.states.TRANSITIONS`.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import datetime
import fcntl
import os
import random
import signal
import socket
import sys
import time
from pathlib import Path
from typing import IO, Any

from supervisor.attempt import Attempt, AttemptResult
from supervisor.config.load import JobConfig
from supervisor.process import launcher
from supervisor.ranks.channel import HeartbeatEndpoint, RankTable, socket_dir
from supervisor.ranks.checkpoints import CommitTracker, DirectoryWatch
from supervisor.record import history
from supervisor.record.events import EventLog
from supervisor.rules.failures import Failure, FailureKind, classify
from supervisor.rules.policy import (
    GiveUp,
    JobHistory,
    Requeue,
    Restart,
    RestartPolicy,
    decide,
    nodes_for_restart,
)
from supervisor.rules.states import JobState, check_transition, exit_code
from supervisor.service.control import ControlServer, remove_daemon_file, write_daemon_file
from supervisor.service.sdnotify import Notifier
from supervisor.slurm import commands as slurm
from worker_sdk import protocol as p

_STOP_SIGNALS = {
    signal.SIGTERM: "preempted",
    signal.SIGUSR1: "timelimit",
    signal.SIGINT: "stopped",
}
_TIME_LEFT_POLL_S = 15.0


class AlreadyRunningError(RuntimeError):
    """Another daemon holds this job's run directory."""


class Supervisor:
    """Supervises one job until it succeeds, gives up or stops."""

    def __init__(self, cfg: JobConfig, *, console: IO[str] | None = sys.stderr) -> None:
        self.cfg = cfg
        self.console = console
        self.state = JobState.STARTING
        self.attempt_no = 0
        self.alloc = slurm.detect()
        #: nodes every attempt runs on: the job's setting, else all of the allocation's
        self.nodes_needed = cfg.launch.nnodes or (len(self.alloc.nodes) if self.alloc else 1)
        self.lost_nodes: set[str] = set()  # nodes of this allocation a node_failure named
        self.policy = RestartPolicy(
            max_restarts=cfg.restart.max_restarts,
            backoff_s=cfg.restart.backoff_s,
            backoff_max_s=cfg.restart.backoff_max_s,
            max_no_progress=cfg.restart.max_no_progress,
            on_oom=cfg.restart.on_oom,
            on_node_failure=cfg.restart.on_node_failure,
        )
        self.notifier = Notifier.from_env()
        self.ranks = RankTable()
        self.current: Attempt | None = None
        self.stop_reason: str | None = None
        self._stop_wakeup = asyncio.Event()
        self._last_failure: str | None = None
        self.standby: launcher.Standby | None = None

    # ------------------------------------------------------------------ state
    def transition(self, new: JobState) -> None:
        """The only way the job's state changes."""
        if new is self.state:
            return
        check_transition(self.state, new)
        self.state = new
        self.notifier.status(f"{new.name.lower()} (attempt {self.attempt_no})")
        if new is JobState.RUNNING and self.standby is not None and self.current is not None:
            self.standby.prepare(self.current.plan)  # every rank runs: warm up the next launcher

    # ------------------------------------------------------------------ entry point
    async def run(self) -> int:
        cfg = self.cfg
        run_dir = cfg.job.run_dir
        lock = _lock_run_dir(run_dir)
        loop = asyncio.get_running_loop()
        from supervisor.process.proctree import become_subreaper

        become_subreaper()
        secret = p.new_secret()
        self.secret_file = run_dir / "secret"
        p.write_secret(str(self.secret_file), secret)
        sock_dir = socket_dir(run_dir)
        multi_node = self.nodes_needed > 1
        tcp = cfg.heartbeat.transport == "tcp" or (cfg.heartbeat.transport == "auto" and multi_node)
        self.endpoint = HeartbeatEndpoint(secret, sock_dir=sock_dir, tcp=tcp)
        self.events = EventLog(run_dir, cfg.job.name, console=self.console)
        control = ControlServer(sock_dir / "control.sock", self._on_control)
        self.tracker = CommitTracker(cfg.job.checkpoint_dir)
        watch = DirectoryWatch(cfg.job.checkpoint_dir, loop)
        for sig, reason in _STOP_SIGNALS.items():
            loop.add_signal_handler(sig, self.request_stop, reason, f"signal {sig.name}")
        background: list[asyncio.Task[None]] = []
        try:
            await control.start()
            write_daemon_file(
                run_dir, pid=os.getpid(), control=control.path, endpoint=self.endpoint.endpoint
            )
            past, _ = history.read_events(self.events.path)
            budget = history.budget_state(past)
            self.attempt_no = budget.attempts
            self.job_history = JobHistory(
                restarts_used=budget.restarts_used,
                no_progress_streak=budget.no_progress_streak,
                oom_count=budget.oom_count,
            )
            self._last_failure = budget.last_failure
            self.events.job_started(
                config=str(cfg.path),
                host=socket.gethostname(),
                pid=os.getpid(),
                slurm_job_id=self.alloc.job_id if self.alloc else None,
                restart_count=self.alloc.restart_count if self.alloc else None,
                restarts_used=budget.restarts_used,
            )
            self.notifier.ready("supervising")
            background.append(asyncio.create_task(self.notifier.run_watchdog()))
            if self.alloc is not None and cfg.slurm.stop_before_end_s > 0:
                background.append(asyncio.create_task(self._watch_time_limit()))
            return await self._supervise(watch)
        finally:
            for sig in _STOP_SIGNALS:
                loop.remove_signal_handler(sig)
            for task in background:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            watch.close()
            await control.close()
            self.endpoint.close()
            remove_daemon_file(run_dir)
            self.notifier.close()
            self.events.close()
            lock.close()

    async def _supervise(self, watch: DirectoryWatch) -> int:
        torchrun = launcher.find_torchrun()
        assert torchrun is not None, "preflight checks that torchrun exists"
        if self.cfg.launch.warm_standby:
            self.standby = launcher.Standby(torchrun)
        try:
            return await self._attempts(torchrun, watch)
        finally:
            if self.standby is not None:
                self.standby.close()

    async def _attempts(self, torchrun: str, watch: DirectoryWatch) -> int:
        while True:
            if self.stop_reason is not None:
                return self._stopped(self.stop_reason, step=None, note="before the attempt began")
            self.attempt_no += 1
            if self.state is not JobState.STARTING:
                self.transition(JobState.STARTING)
            result = await self._run_attempt(torchrun, watch)
            if result.outcome == "succeeded":
                self.transition(JobState.SUCCEEDED)
                self.events.job_succeeded(last_step=result.last_step)
                return exit_code(self.state)
            failure = classify(result.observation)
            if result.outcome == "stopped":
                return self._stopped(
                    self.stop_reason or "stopped",
                    step=result.stop_step,
                    note="" if result.stop_step is not None else _no_stop_checkpoint(result),
                )
            self._record_failure(failure, result)
            nodes = None
            if failure.kind is FailureKind.NODE_FAILURE and self.alloc is not None:
                self.lost_nodes.update(failure.nodes)
                nodes = (len(self._launch_nodes()), self.nodes_needed)
            decision = decide(
                self.job_history,
                failure,
                self.policy,
                progressed=result.progressed,
                jitter=random.random(),
                nodes=nodes,
            )
            self.job_history = self.job_history.after(failure, decision, result.progressed)
            self._last_failure = str(failure.kind)
            if isinstance(decision, GiveUp):
                self.transition(JobState.GAVE_UP)
                self.events.job_gave_up(reason=decision.reason)
                return exit_code(self.state)
            if isinstance(decision, Requeue):
                return self._stopped(decision.reason, step=None, note=failure.detail)
            assert isinstance(decision, Restart)
            self.transition(JobState.BACKOFF)
            self.events.restart_scheduled(
                backoff_s=decision.after_s,
                restarts_left=decision.restarts_left,
                charged=decision.charged,
                deterministic=decision.deterministic,
                note=decision.note,
            )
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop_wakeup.wait(), timeout=decision.after_s)

    async def _run_attempt(self, torchrun: str, watch: DirectoryWatch) -> AttemptResult:
        cfg = self.cfg
        n = self.attempt_no
        self.endpoint.new_attempt(n)
        self.ranks.clear()
        diag = cfg.job.run_dir / "diagnostics" / f"attempt-{n}"
        rank_env = launcher.rank_environment(
            cfg,
            attempt=n,
            endpoint=self.endpoint.endpoint,
            secret_file=self.secret_file,
            diagnostics_dir=diag,
            last_failure=self._last_failure,
            oom_count=self.job_history.oom_count,
            restarts_used=self.job_history.restarts_used,
        )
        plan = launcher.build_plan(
            cfg,
            attempt=n,
            torchrun=torchrun,
            rank_env=rank_env,
            alloc=self._launch_alloc(),
            rdzv_port=_free_port(),
        )
        self.events.attempt = n
        newest = self.tracker.newest_step
        self.events.attempt_started(
            resume_step=0 if newest is None else newest + 1,
            checkpoint=None
            if newest is None
            else str(cfg.job.checkpoint_dir / f"step-{newest:010d}"),
            launcher=plan.argv,
            nnodes=plan.nnodes,
            nproc_per_node=plan.nproc_per_node,
            slurm_job_id=self.alloc.job_id if self.alloc else None,
            restart_count=self.alloc.restart_count if self.alloc else None,
        )
        self.current = Attempt(
            cfg,
            n,
            plan,
            endpoint=self.endpoint,
            ranks=self.ranks,
            events=self.events,
            tracker=self.tracker,
            watch=watch,
            transition=self.transition,
            spawn=launcher.spawn if self.standby is None else self.standby.spawn,
        )
        try:
            return await self.current.run()
        finally:
            self.current = None

    def _launch_nodes(self) -> tuple[str, ...]:
        assert self.alloc is not None
        return nodes_for_restart(self.alloc.nodes, self.lost_nodes, self.nodes_needed)

    def _launch_alloc(self) -> slurm.Allocation | None:
        """The allocation as the next attempt uses it: its first nodes that are not lost."""
        if self.alloc is None:
            return None
        return dataclasses.replace(self.alloc, nodes=self._launch_nodes())

    def _record_failure(self, failure: Failure, result: AttemptResult) -> None:
        self.events.failure_detected(
            kind=str(failure.kind),
            ranks=failure.ranks,
            exit_codes=failure.exit_codes,
            signals=failure.signals,
            last_step=failure.last_step,
            detail=failure.detail,
            diagnostics=result.diagnostics,
            detect_s=result.detect_s,
            hang_timeout_s=result.observation.hang_timeout_s,
            noticed_at=_iso(result.noticed_at),
            nodes=list(failure.nodes),
        )

    # ------------------------------------------------------------------ stopping
    def request_stop(self, reason: str, source: str) -> None:
        """Called from signal handlers and the control socket: only records and forwards."""
        if self.stop_reason is not None or self.state in (
            JobState.SUCCEEDED,
            JobState.GAVE_UP,
            JobState.STOPPED,
        ):
            return
        self.stop_reason = reason
        self.notifier.stopping(f"stopping: {reason}")
        self.events.stop_requested(reason=reason, source=source)
        self._stop_wakeup.set()
        if self.current is not None:
            self.current.request_stop(reason)

    def _stopped(self, reason: str, *, step: int | None, note: str) -> int:
        if self.state is not JobState.STOPPED:
            self.transition(JobState.STOPPED)
        requeued = False
        if reason in (FailureKind.PREEMPTED, FailureKind.TIMELIMIT) and self.alloc is not None:
            requeued = self._requeue(self.alloc.job_id)
        self.events.job_stopped(reason=reason, requeued=requeued, step=step, note=note)
        return exit_code(self.state)

    def _requeue(self, job_id: str) -> bool:
        mode = self.cfg.slurm.requeue
        if mode == "never":
            return False
        try:
            if mode == "auto" and not slurm.is_requeueable(job_id):
                return False
            slurm.requeue(job_id)
        except slurm.SlurmError as exc:
            self.events.emit("requeue_failed", level="error", job_id=job_id, error=str(exc))
            return False
        return True

    async def _watch_time_limit(self) -> None:
        assert self.alloc is not None
        margin = self.cfg.slurm.stop_before_end_s
        while True:
            try:
                left = await asyncio.to_thread(slurm.time_left_s, self.alloc.job_id)
            except slurm.SlurmError as exc:
                self.events.emit("time_left_unknown", level="warning", error=str(exc))
                left = None
            if left is not None and left <= margin:
                self.request_stop("timelimit", f"{left:.0f}s left of the time limit")
                return
            wait = _TIME_LEFT_POLL_S if left is None else min(_TIME_LEFT_POLL_S, left - margin)
            await asyncio.sleep(max(1.0, wait))

    # ------------------------------------------------------------------ control socket
    async def _on_control(self, request: dict[str, Any]) -> dict[str, Any]:
        op = request.get("op")
        if op == "status":
            return self.status()
        if op == "stop":
            self.request_stop("stopped", "rvsup stop")
            return {"ok": True, "state": self.state.name.lower()}
        return {"ok": False, "error": f"unknown op {op!r}; valid: status, stop"}

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        cur = self.current
        return {
            "ok": True,
            "job": self.cfg.job.name,
            "pid": os.getpid(),
            "state": self.state.name.lower(),
            "attempt": self.attempt_no,
            "restarts_used": self.job_history.restarts_used,
            "max_restarts": self.policy.max_restarts,
            "newest_checkpoint_step": self.tracker.newest_step,
            "hang_timeout_s": None if cur is None else cur.hang_timeout_s,
            "stop_reason": self.stop_reason,
            "ranks": [st.to_status(now) for st in sorted(self.ranks, key=lambda s: s.rank)],
            "messages": {
                "accepted": self.endpoint.accepted,
                "dropped": dict(self.endpoint.dropped),
            },
        }


def _iso(wall: float | None) -> str | None:
    if wall is None:
        return None
    return datetime.datetime.fromtimestamp(wall, datetime.UTC).isoformat().replace("+00:00", "Z")


def _no_stop_checkpoint(result: AttemptResult) -> str:
    return "no checkpoint was committed by the stop; the job resumes from the previous one"


class _RunDirLock:
    def __init__(self, f: IO[str]) -> None:
        self._f = f

    def close(self) -> None:
        self._f.close()


def _lock_run_dir(run_dir: Path) -> _RunDirLock:
    f = open(run_dir / "lock", "a+")  # noqa: SIM115
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise AlreadyRunningError(
            f"another rvsup daemon is supervising this job (run_dir {run_dir})"
        ) from None
    return _RunDirLock(f)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("", 0))
        return int(s.getsockname()[1])
