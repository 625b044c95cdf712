"""The job's and its attempts' course: started, restart scheduled, stop requested, and how the job ended.

Part of :mod:`supervisor.record.schema` (its docstring: what an event is). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from supervisor.record.schema.base import Event

__all__ = [
    "AttemptStarted",
    "JobGaveUp",
    "JobStarted",
    "JobStopped",
    "JobSucceeded",
    "RestartScheduled",
    "StopRequested",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStarted(Event):
    """A ``rvsup start`` took the job over: the first start, a requeued allocation, a restart."""

    NAME = "job_started"
    LEVEL = "info"
    config: str
    """The job file the daemon read."""
    host: str
    """The host the daemon runs on."""
    pid: int
    """The daemon's process id."""
    slurm_job_id: str | None
    """``SLURM_JOB_ID``; None outside Slurm."""
    restart_count: int | None
    """``SLURM_RESTART_COUNT`` (times Slurm requeued the job); None outside Slurm."""
    restarts_used: int
    """Charged restarts the history showed at this start."""
    containment: str | None = None
    """How the job's processes are kept and ended: ``cgroup v2 (DIR)``, one group per
    attempt, or ``process tree (subreaper): WHY`` where no cgroup could be used."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptStarted(Event):
    """An attempt was launched; the line's ``attempt`` numbers it."""

    NAME = "attempt_started"
    LEVEL = "info"
    resume_step: int
    """The first step it runs: the loaded checkpoint's step + 1, or 0."""
    checkpoint: str | None
    """The checkpoint it resumes from; None when it starts from scratch."""
    launcher: tuple[str, ...]
    """The launcher's command line."""
    nnodes: int
    """Nodes it runs on."""
    nproc_per_node: int
    """Ranks per node."""
    slurm_job_id: str | None
    """``SLURM_JOB_ID``; None outside Slurm."""
    restart_count: int | None
    """``SLURM_RESTART_COUNT``; None outside Slurm."""
    resharded_from: int | None = None
    """The number of ranks that wrote the checkpoint it resumes from, when that differs from its
    own (the state is resharded); None otherwise."""
    source: str | None = None
    """Where the checkpoint it resumes from is: ``memory`` (a snapshot of the memory tier,
    docs/memory-tier.md), ``replica`` (a snapshot another node sends to a node of the attempt
    that holds no copy: a spare in place of a lost node) or ``storage``; None from scratch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartScheduled(Event):
    """The next attempt starts after a backoff."""

    NAME = "restart_scheduled"
    LEVEL = "warning"
    DIGITS: ClassVar[Mapping[str, int]] = {"backoff_s": 3}
    backoff_s: float
    """The delay before the next attempt."""
    restarts_left: int
    """Restarts left in the budget after this one."""
    charged: bool
    """The restart uses one from the budget."""
    deterministic: bool
    """The previous charged failure had the same kind, ranks and step."""
    note: str
    """One human sentence."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StopRequested(Event):
    """A stop was asked for: the ranks checkpoint at a common step, then exit."""

    NAME = "stop_requested"
    LEVEL = "info"
    reason: str
    """``preempted``, ``timelimit`` or ``stopped``."""
    source: str
    """Who asked: a signal's name, ``rvsup stop``, the time limit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSucceeded(Event):
    """The training ended: exit 0."""

    NAME = "job_succeeded"
    LEVEL = "info"
    last_step: int | None
    """The last step finished; None if unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobGaveUp(Event):
    """The job ends without success: exit 3."""

    NAME = "job_gave_up"
    LEVEL = "error"
    reason: str
    """Why: the budget is spent, no progress, a failure configured to end the job."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStopped(Event):
    """This allocation's run ended on a stop: exit 75, requeued where possible."""

    NAME = "job_stopped"
    LEVEL = "warning"
    reason: str
    """``preempted``, ``timelimit``, ``stopped``, or ``excluded`` (requeued away from the excluded
    nodes, docs/health.md)."""
    requeued: bool
    """The Slurm job was requeued."""
    step: int | None
    """The stop's checkpoint; None when the stop committed none."""
    note: str
    """One human sentence, or empty."""
