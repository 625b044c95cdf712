"""The coordinated-save handshake, the rank's side.

Coordinated saves (a stop, or a time-based save the supervisor schedules) must happen at one step on
every rank, or a rank would block in a collective the others skip. The supervisor sends
SYNC_REQUEST; each rank notices it at its next heartbeat and from then on reports every finished step
with SYNC and waits for the answer: CONTINUE, or SAVE_AT S once every rank has reported. Because each
rank waits after every reported step, no rank can be past S = (highest reported step) + 1.
:meth:`~.runtime.Runtime.slow_path` acts on the answer.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Final

from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

from .channel import Channel

__all__ = ["await_answer"]

_ANSWER_WAIT_S: Final = 600.0  # no answer in this long: the rank exits (EXIT_SYNC_TIMEOUT)


def await_answer(channel: Channel, rank: int, step: int) -> m.Continue | m.SyncCancel | m.SaveAt:
    """Report finished ``step`` (SYNC) and wait for the supervisor's answer; a rank that hears
    none in time exits with :data:`~worker_sdk.contract.protocol.EXIT_SYNC_TIMEOUT`."""
    channel.send(m.Sync(step))
    deadline = time.monotonic() + _ANSWER_WAIT_S
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            print(f"rvsup: rank {rank}: no answer to a coordinated save", file=sys.stderr)
            os._exit(p.EXIT_SYNC_TIMEOUT)
        answer = channel.receive(timeout_s=min(left, 1.0))
        if isinstance(answer, (m.Continue, m.SyncCancel, m.SaveAt)):
            return answer
