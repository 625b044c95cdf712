"""What the ranks say about the training itself: losses and the replicas' comparison.

The messages (``HEARTBEAT`` with a ``loss``, ``LOSS_NONFINITE``, ``REPLICAS_DIVERGED``) are
decoded here and handed to the pure rules (:class:`supervisor.rules.anomalies.LossWatch`).
"""

from __future__ import annotations

import math
from typing import Final

from supervisor.record.schema import AnomalyDetected
from supervisor.rules.anomalies import LossWatch
from supervisor.rules.observation import Anomaly
from worker_sdk.contract import protocol as p

__all__ = ["TRAINING_REPORTS", "anomaly_event", "anomaly_in"]

TRAINING_REPORTS: Final = frozenset(
    {p.Kind.HEARTBEAT, p.Kind.LOSS_NONFINITE, p.Kind.REPLICAS_DIVERGED}
)
"""The messages that may carry an anomaly."""


def anomaly_in(losses: LossWatch, msg: p.Message) -> Anomaly | None:
    """The anomaly a message reports or completes (a heartbeat's loss), if any."""
    since = msg.payload.get("since")
    onset = since if isinstance(since, int) and since <= msg.step else msg.step
    if msg.kind is p.Kind.LOSS_NONFINITE:
        return losses.nonfinite(msg.rank, msg.step, onset, msg.value)
    if msg.kind is p.Kind.REPLICAS_DIVERGED:
        text = str(msg.payload.get("ranks", ""))
        ranks = tuple(int(r) for r in text.split(",") if r.isdecimal()) or (msg.rank,)
        return losses.diverged(ranks, msg.step, onset)
    loss = msg.payload.get("loss")
    if isinstance(loss, int | float) and not isinstance(loss, bool):
        return losses.observe(msg.rank, msg.step, float(loss))
    return None


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
