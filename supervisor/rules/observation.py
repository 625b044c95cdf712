"""What an attempt's end looks like to the rules: the observation the supervisor collects and
the failure :func:`supervisor.rules.failures.classify` makes of it.

Plain frozen data and the two enums of the history's ``kind`` and ``reason`` fields; no rule
lives here.
"""

from __future__ import annotations

import enum
import signal
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Final, TypeAlias

if sys.version_info >= (3, 11):
    from enum import StrEnum
else:  # pragma: no cover - Python 3.10

    class StrEnum(str, enum.Enum):
        """``enum.StrEnum`` for Python 3.10: members are their string values."""

        def __str__(self) -> str:
            return str(self.value)


__all__ = [
    "ANOMALY_KINDS",
    "Anomaly",
    "Failure",
    "FailureKind",
    "Observation",
    "RankExit",
    "RankReport",
    "Signature",
    "StopReason",
    "signal_name",
    "signature",
]


class FailureKind(StrEnum):
    """Why an attempt ended; the values are the ``kind`` field of ``failure_detected``."""

    CRASH = "crash"
    OOM = "oom"
    HANG = "hang"
    PREEMPTED = "preempted"
    TIMELIMIT = "timelimit"
    NODE_FAILURE = "node_failure"
    STOPPED = "stopped"
    NONFINITE_LOSS = "nonfinite_loss"
    LOSS_SPIKE = "loss_spike"
    REPLICAS_DIVERGED = "replicas_diverged"
    RESUME_DIVERGED = "resume_diverged"


ANOMALY_KINDS: Final = frozenset(
    {FailureKind.NONFINITE_LOSS, FailureKind.LOSS_SPIKE, FailureKind.REPLICAS_DIVERGED}
)
"""Failures of the training itself, rolled back with the data that caused them skipped."""


class StopReason(StrEnum):
    """Why the supervisor asked the ranks to stop; the ``reason`` of ``stop_requested`` and
    ``job_stopped``, and the failure kind of the attempt it ends."""

    PREEMPTED = "preempted"
    """Slurm's SIGTERM (preemption, scancel)."""
    TIMELIMIT = "timelimit"
    """SIGUSR1, or the allocation's time limit is near (``slurm.stop_before_end``)."""
    STOPPED = "stopped"
    """``rvsup stop``, SIGINT."""

    @property
    def kind(self) -> FailureKind:
        return FailureKind(self.value)

    @property
    def text(self) -> str:
        return _STOP_TEXT[self]


_STOP_TEXT: Final[Mapping[StopReason, str]] = {
    StopReason.PREEMPTED: "stopped on preemption",
    StopReason.TIMELIMIT: "stopped before the time limit",
    StopReason.STOPPED: "stopped on request",
}


@dataclass(frozen=True, slots=True)
class RankExit:
    """One rank's process ended."""

    rank: int | None
    """The rank, or None if the process never said hello (only its pid is known)."""
    pid: int
    exit_code: int | None
    """The exit status; None if killed by a signal or unknown."""
    signal: int | None
    """The number of the signal that killed it, if any."""
    node: str | None = None


@dataclass(frozen=True, slots=True)
class RankReport:
    """What a rank said before dying (the SDK's FAILURE message)."""

    rank: int
    kind: str
    """``"oom"`` or ``"exception"``."""
    type: str
    """The exception's type name, e.g. ``"torch.OutOfMemoryError"``."""
    message: str
    step: int
    """The rank's last finished step (-1 before the first)."""


@dataclass(frozen=True, slots=True)
class Anomaly:
    """The training went wrong: a loss that is not finite, a spike above its baseline, or
    replicas whose parameters differ."""

    kind: FailureKind
    """``NONFINITE_LOSS``, ``LOSS_SPIKE`` or ``REPLICAS_DIVERGED``."""
    rank: int
    step: int
    """The step at which it was seen (the last reported)."""
    onset: int
    """The first step it may come from: no checkpoint of this step or later is trusted."""
    value: float
    baseline: float | None = None
    """The spike's baseline (the window's median); None for a non-finite loss."""
    others: tuple[int, ...] = ()
    """More ranks implicated (replicas that differ from the majority, after ``rank``)."""


@dataclass(frozen=True, slots=True)
class Divergence:
    """A resume that was not exact, the attempt ended for it (``resume_check = "fail"``)."""

    step: int
    """The first step whose value differed."""
    rank: int
    detail: str
    """What differed, as ``failure_detected`` says it."""


@dataclass(frozen=True, slots=True)
class Observation:
    """Everything the supervisor saw that ended (or is ending) an attempt."""

    exits: tuple[RankExit, ...] = ()
    """Ranks that ended, in the order seen."""
    reports: tuple[RankReport, ...] = ()
    """SDK failure reports during this attempt."""
    launcher_exit: int | None = None
    """torchrun's (or srun's) exit status if it ended; negative: ``-signal``."""
    silent_ranks: tuple[int, ...] = ()
    """Live ranks without progress past the hang timeout."""
    hang_timeout_s: float | None = None
    last_steps: Mapping[int, int] = field(default_factory=dict)
    """Rank -> last finished step it reported."""
    stop_reason: StopReason | None = None
    """Set when a stop was requested."""
    stderr_tail: str = ""
    """The last lines of the ranks' stderr (OOM fallback)."""
    oom_kills: int = 0
    """OOM kills of the job's processes during this attempt (its memory cgroup's count)."""
    oom_kills_host_wide: str = ""
    """Empty, or why ``oom_kills`` is the host's count instead (every job's kills; taken only
    when a rank died of SIGKILL)."""
    node_oom_kills: Mapping[str, tuple[int, str]] = field(default_factory=dict)
    """OOM kills on the other nodes, as their agents counted them during the attempt: node ->
    (kills, "" or why they are that host's count, taken only when a rank of that node died of
    SIGKILL)."""
    lost_nodes: Mapping[str, str] = field(default_factory=dict)
    """Nodes whose srun task or slurmd went away -> how that was established (``"slurmd at
    10.0.0.2:6818 refused the connection"``; "" when not said), in the order they were found."""
    hang_culprits: tuple[int, ...] = ()
    """In a hang, the ranks that were not in a collective while others were (their stacks)."""
    hang_evidence: str = ""
    """What the stacks said, e.g. ``"rank 1 is not in a collective (...); rank 0 waits in ..."``."""
    rank_nodes: Mapping[int, str] = field(default_factory=dict)
    """Rank -> the node (host name) it ran on, as its hello said."""
    anomaly: Anomaly | None = None
    """The training went wrong (the loss a rank reported): the attempt was ended for it."""
    resume_diverged: Divergence | None = None
    """The resume was not exact and ``checkpoint.resume_check = "fail"``: the attempt was
    ended for it."""


@dataclass(frozen=True, slots=True)
class Failure:
    """One classified failure, as ``failure_detected`` records it."""

    kind: FailureKind
    ranks: tuple[int, ...]
    """Ranks implicated: the first failing (or furthest behind) first, then the others
    ascending (so that the same failure twice gives the same tuple); may be empty."""
    exit_codes: tuple[int, ...]
    """Exit statuses of the implicated ranks that exited with a code, in the order seen."""
    signals: tuple[str, ...]
    """Names of the signals that killed implicated ranks, e.g. ``("SIGKILL",)``."""
    last_step: int | None
    """The highest last finished step over all ranks (None if none finished a step)."""
    detail: str
    """One human sentence, e.g. ``"rank 1 killed by SIGKILL at step 57"``."""
    nodes: tuple[str, ...] = ()
    """The nodes it is attributed to (:mod:`supervisor.rules.attribution`)."""
    node_ranks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """For each of ``nodes``, the ranks that ran on it."""


def signal_name(signum: int) -> str:
    """``9 -> "SIGKILL"``; a number this platform does not name becomes ``"SIG<n>"``."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"SIG{signum}"


Signature: TypeAlias = tuple[str, tuple[int, ...], int | None]
"""``(kind, first rank, last_step)``: what two failures that look like the same bug share."""


def signature(kind: str, ranks: Sequence[int], last_step: int | None) -> Signature:
    """A failure's :data:`Signature` (of a :class:`Failure`, or of the ``failure_detected`` it
    is recorded as). Only the first rank, the one the failure is about: the peers that died of
    the broken connection after it are seen, or not, by timing."""
    return (str(kind), tuple(ranks[:1]), last_step)
