"""What the ranks say about the training itself: losses and the replicas' comparison.

The messages (``HEARTBEAT`` with a ``loss``, ``LOSS_NONFINITE``, ``REPLICAS_DIVERGED``) are
decoded here and handed to the pure rules (:class:`supervisor.rules.anomalies.LossWatch`).
"""

from __future__ import annotations

import math
from pathlib import Path

from supervisor.record.schema import AnomalyDetected
from supervisor.rules.anomalies import LossWatch
from supervisor.rules.observation import Anomaly
from worker_sdk.contract import layout
from worker_sdk.contract import messages as m

__all__ = ["PruneGuard", "TrainingChecks", "anomaly_event", "anomaly_in"]


def anomaly_in(losses: LossWatch, rank: int, body: m.Body) -> Anomaly | None:
    """The anomaly a message of ``rank`` reports or completes (a heartbeat's loss), if any."""
    match body:
        case m.LossNonFinite(step, value, since):
            return losses.nonfinite(rank, step, _onset(step, since), value)
        case m.ReplicasDiverged(step, ranks, since):
            return losses.diverged(ranks or (rank,), step, _onset(step, since))
        case m.Heartbeat(step, _, loss):
            return losses.heartbeat(rank, step, loss)
    return None


class PruneGuard:
    """Keeps the checkpoint a rollback may need from being pruned: writes the loss rules'
    earliest possible onset (:meth:`LossWatch.earliest_onset`) to the checkpoint directory's
    ``PROTECT`` file, which the ranks' pruning reads (``worker_sdk.contract.layout.prune``).

    Written when it moves back, or forward past a known commit (it then changes which
    checkpoint is kept): about once per checkpoint, not per heartbeat. A commit not yet
    known only leaves an older checkpoint kept.
    """

    def __init__(self, directory: Path, world_size: int) -> None:
        self.directory = directory
        self.written: int | None = layout.read_protect(directory)
        self._every = max(1, world_size)
        self._reports = 0

    def due(self) -> bool:
        """Whether to look again at this report: once per ``world_size`` reports (a look costs
        O(ranks), so about one per heartbeat round). The step only grows within an attempt (a
        resume from an older checkpoint than planned lowers it, but the planned one was not
        valid), so a late look only keeps an older checkpoint meanwhile."""
        self._reports += 1
        return self._reports % self._every == 1 % self._every

    def update(self, step: int | None, newest_commit: int | None) -> None:
        """The earliest possible onset is now ``step``; ``newest_commit``: the newest known."""
        old = self.written
        if step == old:
            return
        moved_past = newest_commit is not None and (old is None or newest_commit >= old)
        if step is not None and old is not None and step > old and not moved_past:
            return
        try:
            layout.write_protect(self.directory, step)
        except OSError:
            return  # a directory not there yet or not writable: the next report tries again
        self.written = step


class TrainingChecks:
    """One attempt's side of the loss rules (:class:`LossWatch` outlives the attempts): what
    each message adds to them, and the checkpoint a rollback may need, kept from pruning."""

    def __init__(self, losses: LossWatch, directory: Path, world_size: int) -> None:
        self.losses = losses
        self.world_size = world_size
        self._guard = PruneGuard(directory, world_size)

    def begin(self, newest_commit: int | None) -> None:
        """Before any report: the protection goes back to the attempt's first step."""
        self._guard.update(self.losses.earliest_onset(self.world_size), newest_commit)

    def heard(self, rank: int, body: m.Body) -> Anomaly | None:
        """The anomaly a message of ``rank`` reports or completes, if any."""
        return anomaly_in(self.losses, rank, body)

    def beat(self, rank: int, step: int, loss: float | None) -> Anomaly | None:
        """:meth:`heard` for a heartbeat's step and loss (thousands a second)."""
        return self.losses.heartbeat(rank, step, loss)

    def protect(self, found: Anomaly | None, newest_commit: int | None) -> None:
        """After a message (looked at once per round of them): keep the checkpoint the earliest
        possible onset needs (``found``: the anomaly the attempt ends with, if any)."""
        if self._guard.due():
            onset = self.losses.earliest_onset(self.world_size, found)
            self._guard.update(onset, newest_commit)


def _onset(step: int, since: int | None) -> int:
    """The first step an anomaly seen at ``step`` may come from (``since``, when it makes sense)."""
    return since if since is not None and since <= step else step


def anomaly_event(anomaly: Anomaly) -> AnomalyDetected:
    """The history's line for an anomaly (a value that is not finite is null)."""
    return AnomalyDetected(
        kind=str(anomaly.kind),
        step=anomaly.step,
        onset=anomaly.onset,
        rank=anomaly.rank,
        value=anomaly.value if math.isfinite(anomaly.value) else None,
        baseline=anomaly.baseline,
    )
