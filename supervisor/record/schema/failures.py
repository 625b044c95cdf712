"""How an attempt failed: a failure classified, a training anomaly, the rollback it leads to.

Part of :mod:`supervisor.record.schema` (its docstring: what an event is). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

from supervisor.record.schema.base import Event

__all__ = [
    "AnomalyDetected",
    "FailureDetected",
    "RolledBack",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureDetected(Event):
    """The attempt ended without success; ``kind`` says how."""

    NAME = "failure_detected"
    LEVEL = "error"
    DIGITS: ClassVar[Mapping[str, int]] = {"detect_s": 4}
    kind: str
    """``crash``, ``oom``, ``hang``, ``preempted``, ``timelimit``, ``node_failure``, ``stopped``,
    the anomalies (``nonfinite_loss``, ``loss_spike``, ``replicas_diverged``), or
    ``resume_diverged`` (a resume that was not exact, under ``resume_check = "fail"``)."""
    ranks: tuple[int, ...]
    """The ranks implicated, the first failing (or furthest behind) first; may be empty."""
    exit_codes: tuple[int, ...]
    """Exit statuses of the implicated ranks that exited with a code."""
    signals: tuple[str, ...]
    """Names of the signals that killed implicated ranks, e.g. ``"SIGKILL"``."""
    last_step: int | None
    """The highest step any rank finished; None before the first."""
    detail: str
    """One human sentence."""
    diagnostics: str | None
    """The directory of the ranks' stacks (hangs); None if none were collected."""
    detect_s: float | None
    """From the first sign of the failure to its classification."""
    hang_timeout_s: float | None
    """The hang timeout in force; None when not known."""
    noticed_at: str | None
    """When the first sign was seen (ISO-8601 UTC)."""
    nodes: tuple[str, ...]
    """The nodes the failure is attributed to (``supervisor.rules.attribution``): the lost
    nodes, a crash's culprit's node, an OOM's nodes, a hang's culprits' nodes; none for a
    stop or a hang without a culprit."""
    node_ranks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """For each of ``nodes``, the ranks that ran on it (where to look for its GPUs and logs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnomalyDetected(Event):
    """The training went wrong: a rank's loss was not finite or spiked above its baseline, or
    the DDP replicas' parameters differ; the attempt is ended and rolled back.
    """

    NAME = "anomaly_detected"
    LEVEL = "error"
    kind: str
    """``nonfinite_loss``, ``loss_spike`` or ``replicas_diverged``."""
    step: int
    """The step at which it was seen."""
    onset: int
    """The first step it may come from: checkpoints of this step or later are not trusted."""
    rank: int
    """The rank that reported the loss; the first that differs (``replicas_diverged``)."""
    value: float | None
    """The loss reported; None when not finite."""
    baseline: float | None
    """The median of the rank's recent losses (spikes); None for a non-finite loss."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RolledBack(Event):
    """The job goes back to a checkpoint from before an anomaly and skips the steps after it;
    the next attempt resumes past them.
    """

    NAME = "rolled_back"
    LEVEL = "warning"
    from_step: int
    """The step at which the anomaly was seen."""
    to_step: int | None
    """The checkpoint restored; None: the start (no checkpoint before the onset)."""
    resume_step: int
    """The step the next attempt starts at."""
    skipped_steps: int
    """Steps never trained on: from the restored checkpoint's next step to ``resume_step``."""
    onset: int
    """Checkpoints of this step or later were discarded."""
    discarded: tuple[int, ...]
    """The steps of the checkpoints discarded."""
    rollbacks_left: int
    """Rollbacks left in the budget after this one."""
    note: str
    """One human sentence."""
