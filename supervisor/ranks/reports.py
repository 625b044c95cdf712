"""What the ranks say of their own ends, as the rules' observations: a rank's exit reported by
its waiting parent (``RANK_EXIT``), and a rank's last words about its failure (``FAILURE``)."""

from __future__ import annotations

from supervisor.rules.observation import RankExit, RankReport
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

__all__ = ["exit_from_report", "report_from_message"]


def exit_from_report(msg: p.Message) -> RankExit | None:
    """The rank exit a ``RANK_EXIT`` message reports, or None if its payload is malformed.

    Payload: ``pid`` (int), ``code`` (int, or None when a signal ended it), ``signal`` (int or
    None), ``host`` (str).
    """
    body = m.read(msg)
    if not isinstance(body, m.RankExit) or body.pid is None or body.host is None:
        return None
    if (body.code is None) == (body.signal is None):  # exactly one of them says how it ended
        return None
    return RankExit(msg.rank, body.pid, exit_code=body.code, signal=body.signal, node=body.host)


def report_from_message(msg: p.Message) -> RankReport:
    """What a rank said of its own failure in a ``FAILURE`` message."""
    body = m.read(msg)
    if not isinstance(body, m.Failure):
        raise TypeError(f"not a FAILURE message: {msg.kind.name}")
    return RankReport(
        rank=msg.rank, kind=body.kind, type=body.type, message=body.message, step=body.step
    )
