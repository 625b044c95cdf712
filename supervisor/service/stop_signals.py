"""The signals that mean "stop", honoured from the first instruction of ``rvsup start`` to its last.

Slurm may preempt a job at any moment, also while ``rvsup start`` is still importing its modules
or already tearing down. A signal's default action would kill the daemon there (exit -15, nothing
recorded, no requeue), so the command's entry point (:mod:`supervisor.entry`) installs
:class:`StopSignals` before it imports anything heavy, and the handler is never put back to
``SIG_DFL`` while the process has work:

- until the daemon can act on a stop, a signal is only kept (:meth:`StopSignals.pending`);
- while the daemon runs, :meth:`StopSignals.deliver_to` hands every signal to the event loop, the
  kept ones first (the daemon records and acts on them like any stop);
- on the way out, :meth:`StopSignals.hold` goes back to keeping them: the outcome is reached, the
  teardown continues undisturbed;
- once the exit status is known, :meth:`StopSignals.ignore` ignores them for the interpreter's
  last moments (whose finalisation would otherwise restore the default action).

The handler only appends to a list or enqueues a callback on the loop; this module imports nothing
but the standard library's smallest parts, so that it is in place a few milliseconds after the
interpreter starts.
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import asyncio
    import socket
    from types import FrameType

__all__ = ["SIGNALS", "StopSignals", "installed"]

SIGNALS: tuple[signal.Signals, ...] = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)
"""Preemption (Slurm's SIGTERM), the time limit (SIGUSR1) and Ctrl-C."""

_installed: StopSignals | None = None


def installed() -> StopSignals:
    """This process's :class:`StopSignals`, installed now unless it already was."""
    global _installed  # noqa: PLW0603 -- one disposition per process: one owner of it
    if _installed is None:
        _installed = StopSignals()
        _installed.install()
    return _installed


class StopSignals:
    """Catches :data:`SIGNALS`; keeps them until the daemon's loop takes them (see the module)."""

    def __init__(self) -> None:
        self._pending: list[signal.Signals] = []
        self._deliver: Callable[[signal.Signals], None] | None = None
        self._wakeup: tuple[socket.socket, socket.socket] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def install(self) -> None:
        """Catch the stop signals from now on (in the main thread)."""
        for sig in SIGNALS:
            signal.signal(sig, self._on_signal)

    def pending(self) -> list[signal.Signals]:
        """The signals kept so far, oldest first."""
        return list(self._pending)

    def _on_signal(self, signum: int, _frame: FrameType | None) -> None:
        deliver = self._deliver
        if deliver is None:
            self._pending.append(signal.Signals(signum))
        else:
            deliver(signal.Signals(signum))

    def deliver_to(
        self, loop: asyncio.AbstractEventLoop, callback: Callable[[signal.Signals], None]
    ) -> None:
        """From now on ``callback(signal)`` runs on ``loop`` for every stop signal; the kept ones
        are handed over first, at once. A signal received by another thread wakes the loop
        through a wakeup descriptor, as :meth:`asyncio.loop.add_signal_handler` does."""
        import socket  # not on the way to the handler: see the module

        reader, writer = socket.socketpair()
        reader.setblocking(False)
        writer.setblocking(False)
        signal.set_wakeup_fd(writer.fileno(), warn_on_full_buffer=False)
        loop.add_reader(reader.fileno(), _drain, reader)
        self._wakeup = (reader, writer)
        self._loop = loop

        def enqueue(sig: signal.Signals) -> None:
            loop.call_soon_threadsafe(callback, sig)

        self._deliver = enqueue
        kept, self._pending = self._pending, []
        for sig in kept:
            callback(sig)

    def hold(self) -> None:
        """Back to keeping the signals (the daemon's outcome is reached; it is tearing down)."""
        self._deliver = None
        if self._wakeup is None:
            return
        signal.set_wakeup_fd(-1)
        reader, writer = self._wakeup
        if self._loop is not None and not self._loop.is_closed():
            self._loop.remove_reader(reader.fileno())
        reader.close()
        writer.close()
        self._wakeup = None
        self._loop = None

    def ignore(self) -> None:
        """Ignore the stop signals: the exit status is final, nothing is left to do."""
        self.hold()
        for sig in SIGNALS:
            signal.signal(sig, signal.SIG_IGN)


def _drain(reader: socket.socket) -> None:
    """Empty the wakeup descriptor (its bytes only wake the loop; the handler does the rest)."""
    try:
        while reader.recv(512):
            pass
    except (BlockingIOError, InterruptedError):
        pass
