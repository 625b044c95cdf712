"""When an attempt ends (:class:`~supervisor.attempt.Attempt`): the first ending set wins; a
sign of failure (a rank's exit, its FAILURE report) waits a moment for the rest of the evidence,
then ends the attempt as the evidence says (the scripts finished after all, or it failed); a
requested stop that has not ended by its deadline ends as stopped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from supervisor.loops import Clock
from supervisor.outcome import Ending

__all__ = ["SETTLE_NODES_S", "SETTLE_S", "AttemptEnd"]

SETTLE_S = 0.05  # after the first sign of a failure, gather the rest of the evidence this long
SETTLE_NODES_S = 0.25  # the same on several nodes, where the ranks' reports cross the network


class AttemptEnd:
    """The end of one attempt on ``nnodes`` nodes; ``finished``: whether, the evidence settled,
    every script ended by itself (a success)."""

    def __init__(self, clock: Clock, nnodes: int, finished: Callable[[], bool]) -> None:
        self._clock = clock
        self._settle_s = SETTLE_S if nnodes == 1 else SETTLE_NODES_S
        self._finished = finished
        self._done: asyncio.Future[Ending] | None = None
        self._settling: asyncio.Task[None] | None = None
        self._stop_deadline = float("inf")

    def begin(self) -> asyncio.Future[Ending]:
        """The attempt runs: the future its loops run beside, set by the first ending."""
        self._done = asyncio.get_running_loop().create_future()
        return self._done

    @property
    def over(self) -> bool:
        """Whether nothing can end the attempt any more (it ended, or it does not run yet)."""
        return self._done is None or self._done.done()

    def finish(self, ending: Ending) -> None:
        """End the attempt so, unless it has ended already."""
        if self._done is not None and not self._done.done():
            self._done.set_result(ending)

    def failure_seen(self) -> None:
        """A sign of failure: the attempt ends once the evidence has settled (the first sign
        starts the wait; later ones join it)."""
        if self._settling is None and not self.over:
            self._settling = asyncio.ensure_future(self._settle())

    async def _settle(self) -> None:
        await self._clock.sleep(self._settle_s)
        self.finish(Ending.SUCCEEDED if self._finished() else Ending.FAILED)

    def stop_by(self, deadline: float) -> None:
        """A stop was requested: it ends the attempt at the monotonic ``deadline`` at the latest."""
        self._stop_deadline = deadline

    def tick(self, now: float) -> None:
        """The attempt's tick: a stop past its deadline ends the attempt as stopped."""
        if now >= self._stop_deadline:
            self.finish(Ending.STOPPED)

    def close(self) -> None:
        """The attempt is over: a wait still running is cancelled."""
        if self._settling is not None:
            self._settling.cancel()
