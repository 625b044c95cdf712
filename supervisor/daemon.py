"""The daemon's house: everything around the :class:`~supervisor.supervisor.Supervisor`.

:func:`run_daemon` is ``rvsup start`` after the configuration passed its checks. In order: lock the
run directory (one daemon per job), become the subreaper of the job's processes, write the per-job
secret, bind the rank channel and the control socket, open the history (closing the attempts of a
daemon that died, ``attempt_closed``) and fold it into the restart budget, install the stop
signals (kept since the process began, :mod:`supervisor.service.stop_signals`; handlers only
enqueue), then run the supervisor with its loops beside it (systemd watchdog, Slurm time limit).
A loop or the supervisor raising is a bug (``supervisor_error``, with its traceback): the
attempt's tree is torn down (shielded from cancellation) and the daemon exits 1. Everything it
opened is closed on every path."""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import fcntl
import os
import resource
import signal
import socket
import sys
import traceback
from collections.abc import AsyncIterator, Coroutine, Sequence
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from supervisor.attempt_start import SlurmIds
from supervisor.config.metrics import MetricsStartError
from supervisor.config.model import JobConfig
from supervisor.config.torchrun import resolve_torchrun
from supervisor.loops import Liveness, run_beside
from supervisor.process import proctree
from supervisor.process.cgroup import TREE_WALK, JobGroups, end_group, ended_events, job_memory
from supervisor.process.health import HealthChecks
from supervisor.process.plan import Launches
from supervisor.ranks import snapshot_home
from supervisor.ranks.channel import HeartbeatEndpoint, socket_dir
from supervisor.ranks.checkpoints import CommitTracker, DirectoryWatch, commit_event
from supervisor.record import history, rundir
from supervisor.record.entries import Entry
from supervisor.record.events import EventLog
from supervisor.record.schema import (
    AttemptClosed,
    CheckpointCommitted,
    Event,
    JobStarted,
    MemoryTierOff,
    SupervisorError,
)
from supervisor.rules.budget import budget_of
from supervisor.rules.observation import StopReason
from supervisor.rules.states import ExitCode
from supervisor.service import sdnotify
from supervisor.service.control import ControlServer, remove_daemon_file, write_daemon_file
from supervisor.service.sdnotify import Notifier
from supervisor.service.stop_signals import StopSignals
from supervisor.service.stop_signals import installed as installed_stop_signals
from supervisor.slurm import commands as slurm
from supervisor.slurm import lifecycle
from supervisor.supervisor import Supervisor
from worker_sdk.contract import layout
from worker_sdk.contract import protocol as p

if TYPE_CHECKING:
    from supervisor.service.metrics import JobMetrics

__all__ = ["STOP_SIGNALS", "AlreadyRunningError", "MetricsStartError", "run_daemon"]

STOP_SIGNALS: dict[signal.Signals, StopReason] = {
    signal.SIGTERM: StopReason.PREEMPTED,
    signal.SIGUSR1: StopReason.TIMELIMIT,
    signal.SIGINT: StopReason.STOPPED,
}


def _end_job_processes(launches: Launches, events: EventLog, containment: str) -> None:
    """At the job's end: the zygote and the standby end, then anything left in the job's
    cgroups, and the history says so when there was any (after the job's last word, which
    the line stays when nothing was left)."""
    report = launches.close()
    if report is not None and report.signalled:
        for event in ended_events(report, scope="job", mechanism=containment):
            events.log(event)


def _after_start(events: EventLog, said: Sequence[Event], groups: JobGroups | None) -> None:
    """Once ``job_started`` is logged: what the start found of the snapshot directory (refused,
    swept, not made), then the end of what dead daemons left in their groups."""
    for event in said:
        events.log(event)
    if groups is not None:
        _end_stale_groups(groups, events)


def _end_stale_groups(groups: JobGroups, events: EventLog) -> None:
    """What daemons killed before their teardown left in their groups ends now (scope
    ``previous``)."""
    for group in groups.stale():
        report = end_group(group)
        if report.signalled:
            mechanism = f"cgroup v2 ({group.path})"
            for event in ended_events(report, scope="previous", mechanism=mechanism):
                events.log(event)


class AlreadyRunningError(RuntimeError):
    """Another daemon holds this job's run directory."""


async def run_daemon(
    cfg: JobConfig, *, console: IO[str] | None = sys.stderr, stops: StopSignals | None = None
) -> ExitCode:
    """Supervise the job of ``cfg`` until it ends; the exit status of ``rvsup start``. The stop
    signals come through ``stops`` (this process's :func:`~supervisor.service.stop_signals.
    installed` when None), which may already hold those received before."""
    stops = stops if stops is not None else installed_stop_signals()
    async with _house(cfg, console, stops) as (events, sup, loops):
        try:
            return await run_beside(sup.run(), loops)
        except Exception as exc:  # noqa: BLE001 -- a bug: record it; the tree is already torn down
            trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
            events.log(SupervisorError(error=repr(exc), traceback=trace))
            return ExitCode.ERROR


@contextlib.asynccontextmanager
async def _house(
    cfg: JobConfig, console: IO[str] | None, stops: StopSignals
) -> AsyncIterator[tuple[EventLog, Supervisor, dict[str, Coroutine[Any, Any, None]]]]:
    run_dir = cfg.job.run_dir
    loop = asyncio.get_running_loop()
    async with contextlib.AsyncExitStack() as stack:
        stack.enter_context(_lock_run_dir(run_dir))
        _raise_descriptor_limit()
        metrics = _start_metrics(cfg)  # a port in use refuses the start before anything runs
        if metrics is not None:
            stack.callback(metrics.close)
        proctree.become_subreaper()
        secret_file = run_dir / rundir.SECRET_FILE
        secret = p.new_secret()
        p.write_secret(str(secret_file), secret)
        alloc = await asyncio.to_thread(slurm.detect)
        torchrun = resolve_torchrun(cfg)
        assert torchrun is not None, "preflight checks that torchrun exists"
        made = JobGroups.create()
        groups = made if isinstance(made, JobGroups) else None
        containment = f"{TREE_WALK}: {made}" if groups is None else groups.mechanism
        oom, leave_memory = job_memory(groups)
        stack.callback(leave_memory)  # after everything else: the group must be empty
        events = EventLog(run_dir, cfg.job.name, console=console)
        stack.callback(events.close)
        home, said = _snapshot_home(cfg)
        if home is not None:
            stack.callback(home.close, remove=False)  # the supervisor removes it at the job's end
        launches = Launches(
            cfg,
            alloc,
            torchrun,
            groups,
            withheld_env=sdnotify.CHILD_ENV_VARS,  # torchrun must not talk to systemd for us
            snapshots=None if home is None else home.path,
            oom=oom,
        )
        stack.callback(launches.close)
        transport = cfg.heartbeat.transport
        tcp = transport == "tcp" or (transport == "auto" and launches.multi_node)
        channel = HeartbeatEndpoint(secret, sock_dir=socket_dir(run_dir), tcp=tcp)
        stack.callback(channel.close)
        stack.callback(_end_job_processes, launches, events, containment)
        notifier = Notifier.from_env()
        stack.callback(notifier.close)
        watch = DirectoryWatch(cfg.job.checkpoint_dir, loop)
        stack.callback(watch.close)
        past = history.read(events.path)
        close_lost_attempts(events, past.entries, run_dir, cfg.job.checkpoint_dir)
        budget = budget_of(past.events)
        liveness = Liveness()
        slurm_ids = SlurmIds(alloc.job_id, alloc.restart_count) if alloc else SlurmIds()

        async def requeue(_reason: StopReason) -> bool:
            if alloc is None:
                return False
            return await lifecycle.requeue(alloc.job_id, mode=cfg.slurm.requeue, events=events)

        async def requeue_away(nodes: tuple[str, ...]) -> tuple[bool, str]:
            if alloc is None:
                return False, "the job does not run in a Slurm allocation"
            mode = cfg.slurm.requeue
            return await lifecycle.requeue_away(alloc.job_id, nodes, mode=mode, events=events)

        sup = Supervisor(
            cfg,
            events=events,
            channel=channel,
            tracker=CommitTracker(cfg.job.checkpoint_dir),
            commits=watch.queue,
            launches=launches,
            budget=budget,
            secret_file=secret_file,
            requeue=requeue,
            notifier=notifier,
            slurm_ids=slurm_ids,
            liveness=liveness,
            health=HealthChecks(cfg, alloc),
            requeue_away=requeue_away,
            memory_dir=None if home is None else home.path,
        )

        async def on_control(request: dict[str, Any]) -> dict[str, Any]:
            op = request.get("op")
            if op == "status":
                return sup.status()
            if op == "stop":
                sup.request_stop(StopReason.STOPPED, "rvsup stop")
                return {"ok": True, "state": sup.state.name.lower()}
            return {"ok": False, "error": f"unknown op {op!r}; valid: status, stop"}

        control = ControlServer(socket_dir(run_dir) / "control.sock", on_control)
        await control.start()
        stack.push_async_callback(control.close)
        write_daemon_file(run_dir, pid=os.getpid(), control=control.path, endpoint=channel.endpoint)
        stack.callback(remove_daemon_file, run_dir)
        events.on_log = sup.fold  # every event logged from now on moves the budget
        loops: dict[str, Coroutine[Any, Any, None]] = {}
        if metrics is not None:
            _feed_metrics(metrics, events, sup, loops)
        events.log(
            JobStarted(
                config=str(cfg.path),
                host=socket.gethostname(),
                pid=os.getpid(),
                slurm_job_id=slurm_ids.job_id,
                restart_count=slurm_ids.restart_count,
                restarts_used=budget.restarts_used,
                containment=containment,
            )
        )
        # a stop that came while the daemon was starting is recorded now, the later ones as
        # they come; on the way out they are kept again, never left to their default action
        stops.deliver_to(
            loop, lambda sig: sup.request_stop(STOP_SIGNALS[sig], f"signal {sig.name}")
        )
        stack.callback(stops.hold)
        _after_start(events, said, groups)
        notifier.ready("supervising")
        interval = notifier.watchdog_interval_s
        if interval is not None:
            loops["watchdog"] = notifier.run_watchdog(lambda: not liveness.stale(interval))
        if alloc is not None and cfg.slurm.stop_before_end_s > 0:
            loops["time limit"] = lifecycle.watch_time_limit(
                alloc.job_id,
                margin_s=cfg.slurm.stop_before_end_s,
                request_stop=sup.request_stop,
                events=events,
            )
        try:
            yield events, sup, loops
        finally:
            for coro in loops.values():
                coro.close()  # never started when run_beside was not reached


def _raise_descriptor_limit() -> None:
    """The soft limit of open descriptors up to the hard one: connections strangers open to
    the listeners (each held until its handshake fails) must not use up the daemon's few
    (often 1024) while its own files and the ranks' connections need them."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft < hard:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _snapshot_home(cfg: JobConfig) -> tuple[snapshot_home.SnapshotHome | None, list[Event]]:
    """The job's private snapshot directory on this node (:mod:`supervisor.ranks.snapshot_home`),
    the directories dead daemons of this user left swept; None when the tier is off or no
    directory can be made (the job runs storage-only). The events to log: a recorded directory
    refused, what was swept, why none could be made."""
    if cfg.checkpoint.memory_every_steps == 0:
        return None, []
    base = Path(cfg.checkpoint.memory_dir)
    try:
        home, said = snapshot_home.claim(base, cfg.job.run_dir)
    except (OSError, snapshot_home.UntrustedPathError) as exc:
        why = f"cannot make a private snapshot directory in {base}: {exc}"
        return None, [MemoryTierOff(reason=why)]
    return home, [*said, *snapshot_home.sweep(base, keep=home.path)]


def _start_metrics(cfg: JobConfig) -> JobMetrics | None:
    """The job's metrics, their endpoint served (``[metrics]``), or None without the section."""
    if not cfg.metrics.enabled:
        return None
    from supervisor.service.metrics import JobMetrics

    metrics = JobMetrics(cfg)
    metrics.serve()
    return metrics


def _feed_metrics(
    metrics: JobMetrics,
    events: EventLog,
    sup: Supervisor,
    loops: dict[str, Coroutine[Any, Any, None]],
) -> None:
    """Seed the metrics with the history, feed them every event logged from now on, refresh
    them beside the supervisor, and once more (with the file) when the job ends."""
    metrics.seed(history.read(events.path).entries)

    def on_log(event: Event) -> None:
        sup.fold(event)
        metrics.observe(event, events.attempt)

    def view() -> dict[str, Any]:
        now = sup.clock.monotonic()
        return {
            "state": sup.state.value,
            "attempt": sup.attempt_no,
            "restarts_used": sup.budget.restarts_used,
            "max_restarts": sup.policy.max_restarts,
            "ranks": [
                {"rank": st.rank, "last_step": st.last_step, "age_s": now - st.last_seen_t}
                for st in sup.ranks
            ],
            "step_s": sup.ranks.step_times.percentile(0.5),
        }

    events.on_log = on_log
    loops["metrics"] = metrics.run(view)


@contextlib.contextmanager
def _lock_run_dir(run_dir: Path) -> Any:
    """Hold an exclusive lock on ``<run_dir>/lock`` for the daemon's lifetime."""
    f = open(run_dir / rundir.LOCK_FILE, "a+")  # noqa: SIM115
    try:
        fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        f.close()
        raise AlreadyRunningError(
            f"another rvsup daemon is supervising this job (run_dir {run_dir})"
        ) from None
    try:
        yield f
    finally:
        f.close()


def close_lost_attempts(
    events: EventLog, past: Sequence[Entry], run_dir: Path, checkpoint_dir: Path
) -> None:
    """Log ``attempt_closed`` for every attempt whose end was never logged: this daemon holds
    the job's lock, so their supervisor is gone (killed, or its node lost). What is known of
    its end comes from the ranks' step slots left in its diagnostics folder. Checkpoints the
    last of them committed after its supervisor last logged one (the ranks outlive it by a few
    steps) are logged first, as ``checkpoint_committed`` with source ``"found"``: the history
    then names every checkpoint a later attempt may resume from."""
    lost = history.unfinished(history.attempt_rows(past))
    if lost:
        _log_found_commits(events, past, checkpoint_dir, attempt=lost[-1].attempt)
    for row in lost:
        seen = row.ended or row.started
        steps: list[int] = []
        slots = rundir.diagnostics_dir(run_dir, row.attempt)
        for slot in sorted(slots.glob("rank-*.step")) if slots.is_dir() else []:
            step = p.read_step_slot(slot)
            if step is not None and step >= 0:
                steps.append(step)
            with contextlib.suppress(OSError):
                moment = datetime.datetime.fromtimestamp(
                    slot.stat().st_mtime, datetime.timezone.utc
                )
                seen = max(seen, moment)
        last = max([*steps, *([row.last_step] if row.last_step is not None else [])], default=None)
        events.log(
            AttemptClosed(
                outcome="supervisor lost",
                last_seen=history.format_timestamp(seen),
                last_step=last,
            ),
            attempt=row.attempt,
        )


def _log_found_commits(
    events: EventLog, past: Sequence[Entry], checkpoint_dir: Path, *, attempt: int
) -> None:
    """``checkpoint_committed`` for the valid checkpoints newer than any the history names."""
    logged = [e.event.step for e in past if isinstance(e.event, CheckpointCommitted)]
    newest = max(logged, default=-1)
    tracker = CommitTracker(checkpoint_dir)
    infos, _skipped = layout.scan(checkpoint_dir)
    for info in sorted(infos, key=lambda i: i.step):
        if info.step <= newest:
            continue
        commit = tracker.observe(info.path, seconds=None, source="found")
        if commit is not None:
            events.log(commit_event(commit), attempt=attempt)
