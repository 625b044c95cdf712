"""Readiness, status and watchdog notifications to systemd, written from the protocol.

When systemd runs ``rvsup start`` as a ``Type=notify`` service it puts the address of its
notification socket in ``$NOTIFY_SOCKET``: a filesystem path, or a name in the Linux abstract
namespace when the value starts with ``@``. A notification is one ``AF_UNIX``/``SOCK_DGRAM``
datagram of newline-separated ``KEY=VALUE`` assignments (``READY=1``, ``STATUS=...``,
``WATCHDOG=1``, ``STOPPING=1``). With ``WatchdogSec=`` set, systemd also passes
``$WATCHDOG_USEC`` (and ``$WATCHDOG_PID``, the process meant to ping) and kills the service
when no ``WATCHDOG=1`` arrives within that time; the usual practice is to ping at half of it.

Design points:

* Outside systemd (no ``$NOTIFY_SOCKET``) a :class:`Notifier` is a no-op, so the daemon calls it
  unconditionally.
* Sending never raises and never blocks: the socket is non-blocking, and an error (systemd gone,
  socket removed, queue full) is only counted in :attr:`Notifier.send_failures`. The daemon must
  not die, nor stall its event loop, because the service manager went away.
* The watchdog is pinged from the daemon's own event loop (:meth:`Notifier.run_watchdog`), so a
  loop that stops turning stops the pings and systemd restarts the daemon.
* ``os.environ`` is left untouched; the daemon gives :data:`CHILD_ENV_VARS` to the launch
  planning (:class:`supervisor.process.plan.Launches`), which leaves them out of every child's
  environment, so that the children neither notify systemd nor think they own the watchdog.
"""

from __future__ import annotations

import asyncio
import os
import socket
from collections.abc import Callable, Mapping
from typing import Final

__all__ = ["CHILD_ENV_VARS", "Notifier"]

NOTIFY_SOCKET_VAR: Final = "NOTIFY_SOCKET"
WATCHDOG_USEC_VAR: Final = "WATCHDOG_USEC"
WATCHDOG_PID_VAR: Final = "WATCHDOG_PID"
CHILD_ENV_VARS: Final = (NOTIFY_SOCKET_VAR, WATCHDOG_USEC_VAR, WATCHDOG_PID_VAR)
"""The variables systemd sets for the main process only; children must not inherit them."""

MAX_STATUS_CHARS: Final = 1000
"""Longer status texts are cut, keeping a datagram well below systemd's notification buffer."""

# A newline would start a new assignment (``STATUS=x\nREADY=1``), and systemd drops a whole
# datagram that contains a NUL byte: both become spaces in status texts.
_UNSAFE_IN_VALUE: Final = str.maketrans({"\n": " ", "\r": " ", "\0": " "})


def _socket_address(value: str) -> bytes | None:
    """The ``sendto`` address for a ``$NOTIFY_SOCKET`` value; None when unusable."""
    if value.startswith("/"):
        return os.fsencode(value)
    if value.startswith("@") and len(value) > 1:
        return b"\0" + os.fsencode(value[1:])
    return None  # empty, relative, or a transport this module does not speak (e.g. vsock)


def _watchdog_interval_s(env: Mapping[str, str], pid: int) -> float | None:
    """Half of ``$WATCHDOG_USEC`` in seconds when the watchdog is meant for ``pid``, else None."""
    usec_text = env.get(WATCHDOG_USEC_VAR, "")
    if not (usec_text.isascii() and usec_text.isdigit()) or int(usec_text) == 0:
        return None
    if WATCHDOG_PID_VAR in env:
        pid_text = env[WATCHDOG_PID_VAR]
        if not (pid_text.isascii() and pid_text.isdigit()) or int(pid_text) != pid:
            return None
    return int(usec_text) / 2 / 1_000_000


def _clean_value(text: str) -> str:
    """``text`` as a single-line assignment value of bounded length."""
    return text.translate(_UNSAFE_IN_VALUE)[:MAX_STATUS_CHARS]


class Notifier:
    """Sends notifications to systemd's ``$NOTIFY_SOCKET``; a silent no-op when there is none."""

    def __init__(self, address: bytes | None, *, watchdog_interval_s: float | None = None) -> None:
        """Notify the ``AF_UNIX`` datagram socket at ``address`` (None: disabled).

        ``address`` is a filesystem path, or a name starting with a NUL byte for the abstract
        namespace. Prefer :meth:`from_env`.
        """
        self._address = address
        self._sock: socket.socket | None = None
        self.enabled: bool = address is not None
        """Whether notifications are sent at all; False outside systemd and after close()."""
        self.watchdog_interval_s: float | None = watchdog_interval_s if self.enabled else None
        """How often to send WATCHDOG=1 (half of systemd's timeout); None: no watchdog."""
        self.sent: int = 0
        """Datagrams handed to the kernel."""
        self.send_failures: int = 0
        """Datagrams that could not be sent (systemd gone, socket removed, queue full, ...)."""

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Notifier:
        """A notifier for the systemd that started this process (``os.environ`` by default).

        Disabled when ``NOTIFY_SOCKET`` is unset, empty or not a path/abstract name. The
        watchdog interval is set only when ``WATCHDOG_USEC`` is a positive integer and
        ``WATCHDOG_PID`` is unset or names this process (systemd's own rule), and only when
        notifications are enabled: without a socket there is nobody to ping.
        """
        source = os.environ if env is None else env
        address = _socket_address(source.get(NOTIFY_SOCKET_VAR, ""))
        return cls(address, watchdog_interval_s=_watchdog_interval_s(source, os.getpid()))

    def ready(self, status: str = "") -> None:
        """Tell systemd start-up is complete (``READY=1``), with an optional status line."""
        self._send(["READY=1", *self._status_field(status)])

    def status(self, text: str) -> None:
        """Set the one-line status ``systemctl status`` shows (``STATUS=...``)."""
        self._send([f"STATUS={_clean_value(text)}"])

    def watchdog(self) -> None:
        """Ping the service watchdog (``WATCHDOG=1``)."""
        self._send(["WATCHDOG=1"])

    def stopping(self, status: str = "") -> None:
        """Tell systemd the daemon is shutting down (``STOPPING=1``), with an optional status."""
        self._send(["STOPPING=1", *self._status_field(status)])

    async def run_watchdog(self, alive: Callable[[], bool]) -> None:
        """Ping every :attr:`watchdog_interval_s` while ``alive()`` says the daemon's loops
        run, until cancelled; return at once without a watchdog.

        Run it as a task on the daemon's event loop: if the loop stalls, or the loops that must
        keep running stop beating, the pings stop and systemd restarts the service.
        """
        interval = self.watchdog_interval_s
        if interval is None:
            return
        while self.enabled:
            if alive():
                self.watchdog()
            await asyncio.sleep(interval)

    def close(self) -> None:
        """Close the socket; later notifications are no-ops. Safe to call more than once."""
        self.enabled = False
        self.watchdog_interval_s = None
        if self._sock is not None:
            self._sock.close()
            self._sock = None

    @staticmethod
    def _status_field(status: str) -> list[str]:
        return [f"STATUS={_clean_value(status)}"] if status else []

    def _send(self, assignments: list[str]) -> None:
        """Send one datagram; count, never raise, any failure."""
        if not self.enabled or self._address is None:
            return
        payload = "\n".join(assignments).encode("utf-8", errors="replace")
        try:
            if self._sock is None:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)  # close-on-exec
                sock.setblocking(False)
                self._sock = sock
            self._sock.sendto(payload, socket.MSG_NOSIGNAL, self._address)
        except OSError:
            self.send_failures += 1
        else:
            self.sent += 1
