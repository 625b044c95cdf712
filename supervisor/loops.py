"""Supervised concurrency and the clock the daemon's stateful parts are driven by.

The daemon runs a few loops beside its main work (receiving messages, the tick that judges hangs,
the checkpoint directory watch, the systemd watchdog, the time-limit poll). A loop that raises
must never leave the daemon waiting forever: :func:`run_beside` runs the main coroutine with its
loops and, when any loop ends, cancels everything and raises :class:`LoopFailedError`. Cleanup that
must finish even when the caller is cancelled (tearing a process tree down) runs through
:func:`shielded`. Python 3.10 has no ``asyncio.TaskGroup``; this is the part of it we need.

Every timeout is measured on :class:`Clock` (monotonic); unit tests drive the stateful core with
a fake clock whose ``sleep`` advances virtual time.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Coroutine, Mapping
from typing import Any, Protocol, TypeVar

__all__ = [
    "SYSTEM_CLOCK",
    "Clock",
    "Liveness",
    "LoopFailedError",
    "SystemClock",
    "first_done",
    "run_beside",
    "shielded",
]

_T = TypeVar("_T")


class Clock(Protocol):
    """Time as the daemon's core sees it."""

    def monotonic(self) -> float:
        """Seconds on a clock that never goes back: every timeout and deadline."""
        ...

    def wall(self) -> float:
        """Seconds since the epoch: only for timestamps shown to people."""
        ...

    async def sleep(self, seconds: float) -> None:
        """Wait ``seconds`` of this clock."""
        ...


class SystemClock:
    """The real clock: :func:`time.monotonic`, :func:`time.time`, :func:`asyncio.sleep`."""

    def monotonic(self) -> float:
        return time.monotonic()

    def wall(self) -> float:
        return time.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)


SYSTEM_CLOCK: Clock = SystemClock()


class LoopFailedError(RuntimeError):
    """A loop that should run until cancelled raised (or returned): a bug in the daemon."""

    def __init__(self, name: str, cause: BaseException | None) -> None:
        what = "returned" if cause is None else f"raised {cause!r}"
        super().__init__(f"the {name} loop {what}")
        self.name = name


class Liveness:
    """Beats of the loops that must keep running; the systemd watchdog pings only while every
    registered loop has beaten recently (a live event loop alone proves nothing)."""

    def __init__(self, clock: Clock = SYSTEM_CLOCK) -> None:
        self._clock = clock
        self._last: dict[str, float] = {}

    def beat(self, name: str) -> None:
        """Loop ``name`` is alive now."""
        self._last[name] = self._clock.monotonic()

    def forget(self, name: str) -> None:
        """Loop ``name`` ended on purpose (its attempt is over)."""
        self._last.pop(name, None)

    def stale(self, within_s: float) -> list[str]:
        """The registered loops that have not beaten within the last ``within_s`` seconds."""
        now = self._clock.monotonic()
        return sorted(name for name, t in self._last.items() if now - t > within_s)


async def run_beside(main: Awaitable[_T], loops: Mapping[str, Coroutine[Any, Any, None]]) -> _T:
    """``main``'s result, computed while ``loops`` run beside it.

    The loops are meant to run until cancelled. If one raises or returns first, every task is
    cancelled and :class:`LoopFailedError` is raised from its exception. When ``main`` finishes
    (or raises, or the caller is cancelled) the loops are cancelled and awaited before this returns.
    """
    main_task: asyncio.Future[_T] = asyncio.ensure_future(main)
    tasks: dict[asyncio.Future[Any], str] = {
        asyncio.ensure_future(coro): name for name, coro in loops.items()
    }
    everything: list[asyncio.Future[Any]] = [main_task, *tasks]
    try:
        while True:
            done, _ = await asyncio.wait([main_task, *tasks], return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                if task is main_task:
                    continue
                name = tasks[task]
                cause = None if task.cancelled() else task.exception()
                raise LoopFailedError(name, cause) from cause
            if main_task in done:
                return main_task.result()
    finally:
        pending = [t for t in everything if not t.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for task in tasks:  # retrieve every exception so that none is logged as "never retrieved"
            if task.done() and not task.cancelled():
                task.exception()


async def shielded(work: Awaitable[_T]) -> _T:
    """Await ``work`` to its end even if the caller is cancelled meanwhile; the cancellation is
    delivered afterwards (like trio's shielded cancel scope around a child's teardown)."""
    task = asyncio.ensure_future(work)
    cancelled = False
    while True:
        try:
            result = await asyncio.shield(task)
        except asyncio.CancelledError:
            if task.done():
                raise
            cancelled = True
            continue
        break
    if cancelled:
        raise asyncio.CancelledError
    return result


async def first_done(*waits: Awaitable[Any]) -> None:
    """Return when the first of ``waits`` finishes; cancel the others."""
    tasks = [asyncio.ensure_future(w) for w in waits]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
