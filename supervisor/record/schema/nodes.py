"""Nodes and ranks that need a look: health checks, excluded nodes, slow phases, stragglers.

Part of :mod:`supervisor.record.schema` (its docstring: what an event is). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from supervisor.record.schema.base import Event

__all__ = [
    "HealthChecked",
    "NodeExcluded",
    "SlowPhase",
    "StragglerDetected",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthChecked(Event):
    """A node's health checks ran (``[health]``): before the first attempt (``when``
    ``"start"``) or after a failure (``"failure"``); one line per node and round."""

    NAME = "health_checked"
    LEVEL = "info"
    DIGITS: ClassVar[Mapping[str, int]] = {"seconds": 3}
    node: str
    """The node checked."""
    healthy: bool
    """No check failed (a skipped check does not count)."""
    when: str
    """``"start"`` or ``"failure"``."""
    failed: Mapping[str, str]
    """Each failed check's name (``checkpoint_dir``, ``shm``, ``memory``, ``gpus``,
    ``command``) and why, with the command's output."""
    skipped: Mapping[str, str]
    """Each check that could not run here and why (no nvidia-smi, nothing configured)."""
    seconds: float
    """How long the round took on this node."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeExcluded(Event):
    """A node is excluded: no attempt of this job runs on it again, in this allocation or a
    requeued one (``supervisor.rules.health``)."""

    NAME = "node_excluded"
    LEVEL = "warning"
    node: str
    """Its host name."""
    reason: str
    """Why: a failed health check, or the failures attributed to it."""
    failures: int
    """Failures attributed to it so far."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowPhase(Event):
    """Ranks went longer than the hang timeout without a finished step, but were working (or
    waiting on their own) while the others waited for them, so it was not taken for a hang:
    one line per such phase, when steps resume (or the attempt ends inside it)."""

    NAME = "slow_phase"
    LEVEL = "warning"
    DIGITS: ClassVar[Mapping[str, int]] = {"seconds": 3}
    ranks: tuple[int, ...]
    """The ranks that were busy, outside collectives."""
    where: str
    """Where the first of them was, ``train.py:90 in main``."""
    seconds: float
    """From the ranks' last finished step to the end of the phase."""
    finished: bool
    """True when steps resumed; false when the attempt ended inside the phase."""
    detail: str
    """What each silent rank was doing."""
    hint: str
    """What to do about it (declare the phase with ``worker_sdk.phase()``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerDetected(Event):
    """One rank makes the others wait: in DDP's gradient all-reduce, the other ranks wait for it
    a share of every step (at least 20 %) over a recent window. Logged when it is first named
    (again after another rank was, or after none was for a window); the job goes on."""

    NAME = "straggler_detected"
    LEVEL = "warning"
    DIGITS: ClassVar[Mapping[str, int]] = {
        "slower": 2,
        "lost_s": 4,
        "step_s": 4,
        "window_s": 1,
    }
    rank: int
    """The rank the others wait for."""
    node: str | None
    """The node (host name) it runs on; None when its hello was not heard."""
    slower: float
    """Its time per step outside the wait over the other ranks' (2.0: twice as long)."""
    lost_s: float
    """Seconds per step the other ranks wait for it (the median of theirs less its own)."""
    step_s: float
    """Seconds per step over the window."""
    window_s: float
    """The span of the samples judged, in seconds."""
    samples: int
    """The fewest samples a judged rank had in the window."""
    exclude_node: bool
    """``[health] exclude_stragglers``: its node is to be excluded at the next restart."""
