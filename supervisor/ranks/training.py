"""What the ranks say about the training itself: losses and the replicas' comparison.

The messages (``HEARTBEAT`` with a ``loss``, ``LOSS_NONFINITE``, ``REPLICAS_DIVERGED``) are
decoded here and handed to the pure rules (:class:`supervisor.rules.anomalies.LossWatch`).
"""

from __future__ import annotations

import math

from supervisor.record.schema import AnomalyDetected
from supervisor.rules.anomalies import LossWatch
from supervisor.rules.observation import Anomaly
from worker_sdk.contract import messages as m

__all__ = ["anomaly_event", "anomaly_in"]


def anomaly_in(losses: LossWatch, rank: int, body: m.Body) -> Anomaly | None:
    """The anomaly a message of ``rank`` reports or completes (a heartbeat's loss), if any."""
    match body:
        case m.LossNonFinite(step, value, since):
            return losses.nonfinite(rank, step, _onset(step, since), value)
        case m.ReplicasDiverged(step, ranks, since):
            return losses.diverged(ranks or (rank,), step, _onset(step, since))
        case m.Heartbeat(step, _, loss) if loss is not None:
            return losses.observe(rank, step, loss)
    return None


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
