"""What the daemon does with its Slurm allocation while it runs: watch the time left, requeue.

Both call Slurm's commands, which can block for seconds (``scontrol`` retried up to 4 x 30 s):
they run in a worker thread, never on the event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from supervisor.config.model import RequeueMode
from supervisor.loops import SYSTEM_CLOCK, Clock
from supervisor.record.events import EventLog
from supervisor.record.schema import RequeueFailed, TimeLeftUnknown
from supervisor.rules.observation import StopReason
from supervisor.slurm import commands as slurm

__all__ = ["TIME_LEFT_POLL_S", "requeue", "watch_time_limit"]

TIME_LEFT_POLL_S = 15.0


async def watch_time_limit(
    job_id: str,
    *,
    margin_s: float,
    request_stop: Callable[[StopReason, str], None],
    events: EventLog,
    clock: Clock = SYSTEM_CLOCK,
) -> None:
    """Ask for a ``timelimit`` stop once the allocation has ``margin_s`` or less left; then wait
    (the loop runs until cancelled, like every loop of the daemon)."""
    while True:
        try:
            left = await asyncio.to_thread(slurm.time_left_s, job_id)
        except slurm.SlurmError as exc:
            events.log(TimeLeftUnknown(error=str(exc)))
            left = None
        if left is not None and left <= margin_s:
            request_stop(StopReason.TIMELIMIT, f"{left:.0f}s left of the time limit")
            await asyncio.Event().wait()  # nothing more to watch
        wait = TIME_LEFT_POLL_S if left is None else min(TIME_LEFT_POLL_S, left - margin_s)
        await clock.sleep(max(1.0, wait))


async def requeue(job_id: str, *, mode: RequeueMode, events: EventLog) -> bool:
    """Requeue the allocation as ``slurm.requeue`` says (``"auto"``: if Slurm lets it be
    requeued); True when Slurm accepted."""
    if mode == "never":
        return False

    def attempt() -> bool:
        if mode == "auto" and not slurm.is_requeueable(job_id):
            return False
        slurm.requeue(job_id)
        return True

    try:
        return await asyncio.to_thread(attempt)
    except slurm.SlurmError as exc:
        events.log(RequeueFailed(job_id=job_id, error=str(exc)))
        return False


async def requeue_away(
    job_id: str, nodes: tuple[str, ...], *, mode: RequeueMode, events: EventLog
) -> tuple[bool, str]:
    """Requeue the allocation away from ``nodes`` (:func:`slurm.requeue_excluding`) as
    ``slurm.requeue`` allows; (requeued, a problem worth noting or "")."""
    if mode == "never":
        return False, 'slurm.requeue = "never"'

    def attempt() -> tuple[bool, str]:
        if mode == "auto" and not slurm.is_requeueable(job_id):
            return False, "Slurm does not let the job be requeued"
        refused = slurm.requeue_excluding(job_id, nodes)
        return True, f"the ExcNodeList update was refused: {refused}" if refused else ""

    try:
        return await asyncio.to_thread(attempt)
    except slurm.SlurmError as exc:
        events.log(RequeueFailed(job_id=job_id, error=str(exc)))
        return False, str(exc)
