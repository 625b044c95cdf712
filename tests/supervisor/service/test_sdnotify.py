"""supervisor.service.sdnotify: datagrams on real AF_UNIX sockets, watchdog settings."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from supervisor.service.sdnotify import MAX_STATUS_CHARS, Notifier

RECEIVE_TIMEOUT_S = 5.0


class Receiver:
    """A bound AF_UNIX datagram socket standing in for systemd's notification socket."""

    def __init__(self, sock: socket.socket, notify_socket: str) -> None:
        self.sock = sock
        self.notify_socket = notify_socket
        """The value systemd would put in $NOTIFY_SOCKET for this socket."""

    def next(self) -> bytes:
        """The next datagram (waits up to RECEIVE_TIMEOUT_S)."""
        self.sock.settimeout(RECEIVE_TIMEOUT_S)
        return self.sock.recv(65536)

    def pending(self) -> list[bytes]:
        """Every datagram already queued, without waiting."""
        self.sock.setblocking(False)
        out = []
        while True:
            try:
                out.append(self.sock.recv(65536))
            except BlockingIOError:
                return out


def _path_receiver(tmp_path: Path) -> Receiver:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    path = tmp_path / "notify.sock"
    sock.bind(str(path))
    return Receiver(sock, str(path))


def _abstract_receiver(tmp_path: Path) -> Receiver:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    name = f"rvsup-test-{uuid.uuid4().hex}"
    sock.bind("\0" + name)
    return Receiver(sock, "@" + name)


@pytest.fixture(params=[_path_receiver, _abstract_receiver], ids=["path", "abstract"])
def receiver(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Receiver]:
    """A notification socket, once on the filesystem and once in the abstract namespace."""
    make: Callable[[Path], Receiver] = request.param
    rx = make(tmp_path)
    yield rx
    rx.sock.close()


@pytest.fixture
def notifier(receiver: Receiver) -> Iterator[Notifier]:
    """A notifier built from an environment that points at ``receiver``."""
    n = Notifier.from_env({"NOTIFY_SOCKET": receiver.notify_socket})
    yield n
    n.close()


@pytest.mark.parametrize(
    ("send", "expected"),
    [
        (lambda n: n.ready(), b"READY=1"),
        (lambda n: n.ready("running attempt 1"), b"READY=1\nSTATUS=running attempt 1"),
        (lambda n: n.status("attempt 2, step 500"), b"STATUS=attempt 2, step 500"),
        (lambda n: n.watchdog(), b"WATCHDOG=1"),
        (lambda n: n.stopping(), b"STOPPING=1"),
        (lambda n: n.stopping("checkpointing"), b"STOPPING=1\nSTATUS=checkpointing"),
        (lambda n: n.status("a\nREADY=1\r\0b"), b"STATUS=a READY=1  b"),
        (lambda n: n.status("\u00e9tape 3"), "STATUS=\u00e9tape 3".encode()),
        (lambda n: n.status("x" * 5000), b"STATUS=" + b"x" * MAX_STATUS_CHARS),
    ],
    ids=[
        "ready",
        "ready+status",
        "status",
        "watchdog",
        "stopping",
        "stopping+status",
        "no-injection",
        "utf8",
        "truncated",
    ],
)
def test_each_call_sends_exactly_one_datagram(
    receiver: Receiver, notifier: Notifier, send: Callable[[Notifier], None], expected: bytes
) -> None:
    """Each call sends exactly the protocol datagram, single-line values, nothing else."""
    assert notifier.enabled
    send(notifier)
    assert receiver.next() == expected
    assert receiver.pending() == []
    assert (notifier.sent, notifier.send_failures) == (1, 0)


def test_calls_arrive_in_order(receiver: Receiver, notifier: Notifier) -> None:
    """A sequence of calls arrives as the same sequence of datagrams."""
    notifier.ready()
    notifier.watchdog()
    notifier.status("s")
    notifier.stopping()
    got = [receiver.next() for _ in range(4)]
    assert got == [b"READY=1", b"WATCHDOG=1", b"STATUS=s", b"STOPPING=1"]


@pytest.mark.parametrize(
    "env",
    [{}, {"NOTIFY_SOCKET": ""}, {"NOTIFY_SOCKET": "@"}, {"NOTIFY_SOCKET": "relative/notify"}],
    ids=["unset", "empty", "bare-at", "relative"],
)
def test_disabled_without_usable_socket(env: dict[str, str]) -> None:
    """Without a usable NOTIFY_SOCKET every call is a silent no-op and there is no watchdog."""
    n = Notifier.from_env({**env, "WATCHDOG_USEC": "30000000"})
    assert not n.enabled
    assert n.watchdog_interval_s is None
    n.ready("x")
    n.status("x")
    n.watchdog()
    n.stopping("x")
    asyncio.run(asyncio.wait_for(n.run_watchdog(lambda: True), timeout=1.0))  # returns at once
    n.close()
    assert (n.sent, n.send_failures) == (0, 0)


def test_from_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Without an explicit mapping, from_env reads os.environ."""
    rx = _path_receiver(tmp_path)
    try:
        monkeypatch.setenv("NOTIFY_SOCKET", rx.notify_socket)
        n = Notifier.from_env()
        n.ready()
        n.close()
        assert rx.next() == b"READY=1"
    finally:
        rx.sock.close()
    monkeypatch.delenv("NOTIFY_SOCKET")
    assert not Notifier.from_env().enabled


OUR_PID = os.getpid()


@pytest.mark.parametrize(
    ("watchdog_env", "expected_s"),
    [
        ({"WATCHDOG_USEC": "30000000"}, 15.0),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(OUR_PID)}, 15.0),
        ({"WATCHDOG_USEC": "1000"}, 0.0005),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": str(OUR_PID + 1)}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": ""}, None),
        ({"WATCHDOG_USEC": "30000000", "WATCHDOG_PID": "self"}, None),
        ({}, None),
        ({"WATCHDOG_PID": str(OUR_PID)}, None),
        ({"WATCHDOG_USEC": "0"}, None),
        ({"WATCHDOG_USEC": "-5"}, None),
        ({"WATCHDOG_USEC": "30s"}, None),
        ({"WATCHDOG_USEC": ""}, None),
    ],
    ids=[
        "usec-only",
        "our-pid",
        "tiny",
        "other-pid",
        "empty-pid",
        "bad-pid",
        "unset",
        "pid-only",
        "zero",
        "negative",
        "not-a-number",
        "empty-usec",
    ],
)
def test_watchdog_interval_is_half_of_watchdog_usec(
    watchdog_env: dict[str, str], expected_s: float | None
) -> None:
    """The ping interval is WATCHDOG_USEC/2 when meant for this process, else None."""
    n = Notifier.from_env({"NOTIFY_SOCKET": "/nonexistent/notify", **watchdog_env})
    assert n.enabled
    assert n.watchdog_interval_s == expected_s


@pytest.mark.serial  # three pings within 0.2 s
@pytest.mark.timeout(20)
def test_run_watchdog_pings_until_cancelled(receiver: Receiver) -> None:
    """run_watchdog sends WATCHDOG=1 repeatedly at the interval, and stops when cancelled."""
    n = Notifier.from_env({"NOTIFY_SOCKET": receiver.notify_socket, "WATCHDOG_USEC": "20000"})
    assert n.watchdog_interval_s == 0.01

    async def run_for_a_while() -> None:
        task = asyncio.create_task(n.run_watchdog(lambda: True))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run_for_a_while())
    got = receiver.pending()
    n.close()
    assert 3 <= len(got) <= 21
    assert set(got) == {b"WATCHDOG=1"}


@pytest.mark.serial  # a ping within 0.1 s
@pytest.mark.timeout(20)
def test_run_watchdog_stays_silent_while_loops_are_stale(receiver: Receiver) -> None:
    """No WATCHDOG=1 is sent while alive() says a loop stopped beating: systemd will restart a
    daemon whose event loop runs but whose loops are dead."""
    n = Notifier.from_env({"NOTIFY_SOCKET": receiver.notify_socket, "WATCHDOG_USEC": "20000"})
    alive = {"now": False}

    async def run_for_a_while() -> None:
        task = asyncio.create_task(n.run_watchdog(lambda: alive["now"]))
        await asyncio.sleep(0.1)
        assert receiver.pending() == []
        alive["now"] = True
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(run_for_a_while())
    got = receiver.pending()
    n.close()
    assert got and set(got) == {b"WATCHDOG=1"}


def test_send_to_vanished_path_socket_counts_failure(tmp_path: Path) -> None:
    """A removed socket file (systemd gone) never raises; the failure is counted."""
    rx = _path_receiver(tmp_path)
    n = Notifier.from_env({"NOTIFY_SOCKET": rx.notify_socket})
    n.ready()
    assert rx.next() == b"READY=1"
    rx.sock.close()
    Path(rx.notify_socket).unlink()
    n.watchdog()
    n.status("still alive")
    n.stopping()
    assert (n.sent, n.send_failures) == (1, 3)
    n.close()


def test_send_to_closed_abstract_socket_counts_failure(tmp_path: Path) -> None:
    """A closed abstract socket (nobody listening) never raises; the failure is counted."""
    rx = _abstract_receiver(tmp_path)
    n = Notifier.from_env({"NOTIFY_SOCKET": rx.notify_socket})
    rx.sock.close()
    n.ready()
    n.watchdog()
    assert (n.sent, n.send_failures) == (0, 2)
    n.close()


@pytest.mark.timeout(20)
def test_full_queue_does_not_block(tmp_path: Path) -> None:
    """A receiver that stops reading makes sends fail (counted) instead of blocking the caller."""
    rx = _path_receiver(tmp_path)
    n = Notifier.from_env({"NOTIFY_SOCKET": rx.notify_socket})
    try:
        for _ in range(20_000):
            n.status("x" * 200)
        assert n.send_failures > 0
        assert n.sent + n.send_failures == 20_000
    finally:
        n.close()
        rx.sock.close()


def test_close_is_idempotent_and_silences(receiver: Receiver, notifier: Notifier) -> None:
    """After close() calls send nothing, and close() may be called again."""
    notifier.close()
    notifier.close()
    notifier.ready()
    notifier.watchdog()
    assert not notifier.enabled
    assert notifier.watchdog_interval_s is None
    assert receiver.pending() == []
    assert (notifier.sent, notifier.send_failures) == (0, 0)
