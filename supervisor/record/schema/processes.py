"""The processes' and the daemon's own events: exits, teardowns, dropped messages, Slurm errors,
the daemon's errors, attempts closed after a lost supervisor.

Part of :mod:`supervisor.record.schema` (its docstring: what an event is). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from supervisor.record.schema.base import Event

__all__ = [
    "AttemptClosed",
    "ExitAborted",
    "ExitStalled",
    "MessagesDropped",
    "ProcessesEnded",
    "ProcessesLeft",
    "RequeueFailed",
    "SupervisorError",
    "TimeLeftUnknown",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitStalled(Event):
    """Every rank's script had ended without a failure, but some interpreters had not exited
    after a grace period: they were ended by the teardown and the attempt counts as succeeded."""

    NAME = "exit_stalled"
    LEVEL = "warning"
    DIGITS: ClassVar[Mapping[str, int]] = {"waited_s": 3}
    ranks: tuple[int, ...]
    """The ranks whose processes were still there."""
    waited_s: float
    """How long they had had since the last rank said its script ended."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitAborted(Event):
    """A rank whose script had ended was killed by a signal while its interpreter shut down
    (an extension's destructor, an ``atexit`` hook): its training was done, so when every rank's
    script ended and none reported a failure, the attempt counts as succeeded."""

    NAME = "exit_aborted"
    LEVEL = "warning"
    rank: int
    """The rank whose process aborted."""
    signal: str
    """The signal's name, e.g. ``SIGABRT``."""
    last_step: int | None
    """The rank's last finished step."""
    stderr_tail: str
    """The last lines the rank wrote to its stderr (what the abort printed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessesEnded(Event):
    """A teardown ended every process of the attempt (`scope` "attempt"), at the job's end
    anything left in the job's groups once the zygote and standby ended (`scope` "job"; no
    line when nothing was), or at the start
    what a killed rvsup left in its groups (`scope` "previous"): how many, how many needed
    SIGKILL after the SIGTERM grace, and how."""

    NAME = "processes_ended"
    LEVEL = "info"
    DIGITS: ClassVar[Mapping[str, int]] = {"seconds": 3}
    scope: str
    """``"attempt"``, ``"job"`` or ``"previous"``."""
    mechanism: str
    """How they were found: ``cgroup v2 (DIR)``, or ``process tree (subreaper)``."""
    ended: int
    """Processes found and ended."""
    sigkilled: int
    """Of those, still alive after their SIGTERM grace and sent SIGKILL (a single-node
    torchrun, which is sent SIGKILL alone by design, is not counted)."""
    seconds: float
    """How long the teardown took."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessesLeft(Event):
    """Processes a teardown could not end, not even with SIGKILL (uninterruptible sleep, a
    process of another user), named so that they are not silently left behind."""

    NAME = "processes_left"
    LEVEL = "error"
    scope: str
    """``"attempt"``, ``"job"`` or ``"previous"``."""
    processes: tuple[str, ...]
    """Each as ``PID STATE COMMAND``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MessagesDropped(Event):
    """Malformed or unauthenticated messages were dropped."""

    NAME = "messages_dropped"
    LEVEL = "warning"
    counts: Mapping[str, int]
    """Dropped messages by reason."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequeueFailed(Event):
    """Asking Slurm to requeue the job failed (the job stops anyway)."""

    NAME = "requeue_failed"
    LEVEL = "error"
    job_id: str
    """The Slurm job."""
    error: str
    """What Slurm said."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeLeftUnknown(Event):
    """Slurm could not say how much time the allocation has left (asked again later)."""

    NAME = "time_left_unknown"
    LEVEL = "warning"
    error: str
    """What Slurm said."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorError(Event):
    """A bug in the daemon: it tore the job's processes down and exited 1."""

    NAME = "supervisor_error"
    LEVEL = "error"
    error: str
    """The exception (its ``repr``)."""
    traceback: str
    """Its formatted traceback."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptClosed(Event):
    """A later ``rvsup start`` closed an attempt whose supervisor died before it could log the
    attempt's end (SIGKILL, a lost node); the line's ``attempt`` is the closed one."""

    NAME = "attempt_closed"
    LEVEL = "warning"
    outcome: str
    """How it ended, as far as can be known: ``"supervisor lost"``."""
    last_seen: str | None
    """When it was last known alive (its last event, or its ranks' last step), ISO-8601 UTC."""
    last_step: int | None
    """The last step any of its ranks on this node finished (their step slots), if known."""
