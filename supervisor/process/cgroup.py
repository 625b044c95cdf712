"""The job's cgroups: one per attempt, one for the zygote, so that nothing outlives its attempt.

At start-up the daemon makes a group of its own under the cgroup v2 group it runs in
(``rvsup-PID``; found through ``worker_sdk.spawn.cgroup``, wherever the hierarchy is mounted) and
proves it may place processes there (it places itself in and back). Every process is placed by
the one that starts it, before it runs anything, and never moved again (the rule of
``worker_sdk.spawn.cgroup``): the daemon places each launcher into a fresh child group (the
bootstrap's ``--cgroup`` waits for it): ``attempt-N`` for attempt N (the warm standby, started
while attempt N-1 runs, is placed in ``attempt-N`` at once and waits there), ``zygote`` for the
zygote; the zygote places each rank it forks into its client's group before the rank's code
runs. Whatever the processes in a group start is in it too, whatever session, process group or
parent they end up with. The teardown signals every member and ends with ``cgroup.kill``; the
group is removed once empty.

A daemon killed with SIGKILL leaves its groups behind: the next ``rvsup start`` on the host
ends what is still in them and removes them (:meth:`JobGroups.stale`).

Where no group can be made or joined (no cgroup v2 mounted, nothing writable) the daemon
falls back to what it did before: it is the subreaper of its descendants and the teardown
walks the process tree. :attr:`JobGroups.mechanism` (or :func:`mechanism_here`) says which,
for ``job_started`` and ``rvsup validate``.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from pathlib import Path

import psutil

from supervisor.process import proctree
from supervisor.process.oom_count import OomCounter
from supervisor.process.proctree import TeardownReport
from supervisor.record.schema import Event, ProcessesEnded, ProcessesLeft
from worker_sdk.spawn import cgroup as _cgroup
from worker_sdk.spawn.cgroup import Group

__all__ = [
    "TREE_WALK",
    "Group",
    "JobGroups",
    "end_group",
    "ended_events",
    "job_memory",
    "mechanism_here",
]

TREE_WALK = "process tree (subreaper)"


class JobGroups:
    """The groups of one ``rvsup start`` (see the module docstring)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @property
    def mechanism(self) -> str:
        return f"cgroup v2 ({self.root})"

    @classmethod
    def create(cls) -> JobGroups | str:
        """The job's group, made under the daemon's own; or why there is none."""
        own = _cgroup.own_group_dir()
        if own is None:
            return "no cgroup v2 hierarchy is mounted"
        root = Path(own) / f"rvsup-{os.getpid()}"
        try:
            root.mkdir(exist_ok=True)
        except OSError as exc:
            return f"cannot create a cgroup under {own}: {exc.strerror or exc}"
        try:
            _cgroup.place(os.getpid(), str(root))  # may we place processes here, and back?
            _cgroup.place(os.getpid(), own)
        except OSError as exc:
            with contextlib.suppress(OSError):
                _cgroup.place(os.getpid(), own)
            with contextlib.suppress(OSError):
                root.rmdir()
            return f"cannot move processes into {root}: {exc.strerror or exc}"
        return cls(root)

    def attempt(self, number: int) -> str:
        """The (not yet made) directory of attempt ``number``'s group."""
        return str(self.root / f"attempt-{number}")

    def zygote(self) -> str:
        """The zygote's group, made."""
        path = self.root / "zygote"
        path.mkdir(exist_ok=True)
        return str(path)

    def group(self) -> Group:
        return Group(self.root)

    def stale(self) -> list[Group]:
        """The groups beside this job's of daemons that are gone: killed (SIGKILL, a lost
        node) before they could end what was left in them."""
        return _cgroup.stale_groups(self.root.parent, "rvsup-")


def end_group(group: Group) -> TeardownReport:
    """Every process left in ``group`` ended at once (SIGTERM, then SIGKILL; nothing is waited
    for: what is left there has outlived its attempt already), and the group removed."""
    report = proctree.teardown((), term_timeout_s=0.0, members=group.pids, kill_all=group.kill)
    group.remove()
    return report


def job_memory(groups: JobGroups | None) -> tuple[OomCounter, Callable[[], None]]:
    """Where the job's OOM kills are counted (:mod:`.oom_count`), and what undoes it at the job's
    end. Its v2 group when the memory controller is on there; else a v1 memory group
    ``rvsup-PID`` beside those of the other daemons in the daemon's own, which the daemon places
    itself in before it starts anything (whatever it starts is in it too; empty groups of
    daemons that are gone are removed first); else the host's counter, saying why."""
    if groups is not None and (groups.root / "memory.events").exists():
        return OomCounter.of_job(groups.root, None, ""), _nothing
    made = _cgroup.join_memory_group("rvsup-")
    if made is None:
        why = "no memory controller in the job's cgroup v2 group, no cgroup v1 memory controller"
        return OomCounter.of_job(None, None, why), _nothing
    if isinstance(made, str):
        return OomCounter.of_job(None, None, made), _nothing
    path, own = made
    return OomCounter.of_job(None, path, ""), lambda: _cgroup.leave_memory_group(path, own)


def _nothing() -> None:
    pass


def mechanism_here() -> str:
    """How a job started here would have its processes kept and ended (a group is made, tried
    and removed): what ``rvsup validate`` says."""
    made = JobGroups.create()
    if isinstance(made, str):
        return f"{TREE_WALK}: {made}"
    made.group().remove()
    return f"cgroup v2, one group per attempt under {made.root.parent}"


def ended_events(report: TeardownReport, *, scope: str, mechanism: str) -> list[Event]:
    """What a teardown did, as events: ``processes_ended``, and ``processes_left`` naming each
    process it could not end."""
    out: list[Event] = [
        ProcessesEnded(
            scope=scope,
            mechanism=mechanism,
            ended=report.signalled - report.leftover,
            sigkilled=report.forced,
            seconds=report.seconds,
        )
    ]
    if report.left:
        out.append(ProcessesLeft(scope=scope, processes=tuple(map(_describe, report.left))))
    return out


def _describe(pid: int) -> str:
    """``PID STATE COMMAND`` of a live process (state as ps shows it: D, T, ...)."""
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            status, command = proc.status(), " ".join(proc.cmdline()) or proc.name()
    except psutil.Error:
        return f"{pid} gone"
    return f"{pid} {status} {command[:200]}"
