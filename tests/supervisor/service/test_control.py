"""The control socket: request/answer round trips, permissions and 'no daemon' detection."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest

from supervisor.record.rundir import DAEMON_FILE
from supervisor.service.control import (
    ControlServer,
    NotRunningError,
    remove_daemon_file,
    request,
    write_daemon_file,
)


class FakeDaemon:
    """A handler that answers like the daemon would and remembers what it was asked."""

    def __init__(self) -> None:
        self.seen: list[dict[str, Any]] = []

    async def __call__(self, req: dict[str, Any]) -> dict[str, Any]:
        self.seen.append(req)
        if req.get("op") == "status":
            return {"ok": True, "state": "RUNNING", "attempt": 2}
        if req.get("op") == "stop":
            return {"ok": True}
        if req.get("op") == "bad":
            raise ValueError("no such operation")
        return {"ok": False, "error": f"unknown op {req.get('op')!r}"}


def _serve(tmp_path: Path, body: Callable[[ControlServer, Path], Awaitable[Any]]) -> FakeDaemon:
    """Run ``body(server, run_dir)`` with a started server and a daemon.json pointing at it."""
    handler = FakeDaemon()
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    sock = tmp_path / "c.sock"

    async def main() -> None:
        server = ControlServer(sock, handler)
        await server.start()
        write_daemon_file(run_dir, pid=os.getpid(), control=sock, endpoint="ipc://x")
        try:
            await body(server, run_dir)
        finally:
            await server.close()
        assert not sock.exists()  # close removes the socket file

    asyncio.run(main())
    return handler


async def _raw(path: Path, data: bytes) -> dict[str, Any]:
    """Send raw bytes to the control socket and parse the one-line answer."""
    reader, writer = await asyncio.open_unix_connection(str(path))
    writer.write(data)
    await writer.drain()
    line = await asyncio.wait_for(reader.readline(), timeout=10)
    writer.close()
    await writer.wait_closed()
    assert line.endswith(b"\n")
    answer = json.loads(line)
    assert isinstance(answer, dict)
    return answer


def test_status_and_stop_round_trip(tmp_path: Path) -> None:
    """request() sends {'op': ...} and returns the handler's answer, for status and stop."""

    async def body(server: ControlServer, run_dir: Path) -> None:
        status = await asyncio.to_thread(request, run_dir, "status")
        assert status == {"ok": True, "state": "RUNNING", "attempt": 2}
        stop = await asyncio.to_thread(request, run_dir, "stop")
        assert stop == {"ok": True}

    handler = _serve(tmp_path, body)
    assert handler.seen == [{"op": "status"}, {"op": "stop"}]


def test_socket_and_daemon_file_are_private(tmp_path: Path) -> None:
    """The socket is 0600 and daemon.json is 0600 and says pid, socket and endpoint."""

    async def body(server: ControlServer, run_dir: Path) -> None:
        assert stat.S_ISSOCK(server.path.stat().st_mode)
        assert stat.S_IMODE(server.path.stat().st_mode) == 0o600
        info_path = run_dir / DAEMON_FILE
        assert stat.S_IMODE(info_path.stat().st_mode) == 0o600
        info = json.loads(info_path.read_text())
        assert info == {"pid": os.getpid(), "control": str(server.path), "endpoint": "ipc://x"}

    _serve(tmp_path, body)


def test_start_replaces_stale_socket_file(tmp_path: Path) -> None:
    """A leftover socket file from a dead daemon does not stop a new server from binding."""
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(tmp_path / "c.sock"))
    stale.close()

    async def body(server: ControlServer, run_dir: Path) -> None:
        assert (await asyncio.to_thread(request, run_dir, "status"))["ok"] is True

    _serve(tmp_path, body)


@pytest.mark.parametrize(
    ("data", "error"),
    [
        pytest.param(b"not json\n", "Expecting value", id="not JSON"),
        pytest.param(b"[1, 2]\n", "must be a JSON object", id="a list"),
        pytest.param(b'"stop"\n', "must be a JSON object", id="a string"),
        pytest.param(b'{"op": "bad"}\n', "no such operation", id="handler refuses"),
        pytest.param(b'{"op": "' + b"x" * 5000 + b'"}\n', "too long", id="too long"),
    ],
)
def test_malformed_request_gets_ok_false(tmp_path: Path, data: bytes, error: str) -> None:
    """A request that is not a small JSON object is answered ok=false with the reason."""
    answers: list[dict[str, Any]] = []

    async def body(server: ControlServer, run_dir: Path) -> None:
        answers.append(await _raw(server.path, data))
        # the server keeps serving after a bad request
        answers.append(await _raw(server.path, b'{"op": "status"}\n'))

    handler = _serve(tmp_path, body)
    assert answers[0]["ok"] is False
    assert error in answers[0]["error"]
    assert answers[1]["ok"] is True
    assert handler.seen[-1] == {"op": "status"}


def test_not_running_without_daemon_file(tmp_path: Path) -> None:
    """No daemon.json: NotRunningError naming the run directory."""
    with pytest.raises(NotRunningError, match="no rvsup daemon is running"):
        request(tmp_path, "status")


def test_not_running_with_garbled_daemon_file(tmp_path: Path) -> None:
    """An unreadable daemon.json counts as no daemon."""
    (tmp_path / DAEMON_FILE).write_text("{half")
    with pytest.raises(NotRunningError):
        request(tmp_path, "status")


def test_not_running_with_stale_daemon_file_no_socket(tmp_path: Path) -> None:
    """daemon.json naming a socket that no longer exists: NotRunningError saying 'stale'."""
    write_daemon_file(tmp_path, pid=1, control=tmp_path / "gone.sock", endpoint="ipc://x")
    with pytest.raises(NotRunningError, match="stale"):
        request(tmp_path, "status", timeout_s=2)


def test_not_running_with_stale_daemon_file_dead_socket(tmp_path: Path) -> None:
    """daemon.json naming a socket file nobody listens on: NotRunningError saying 'stale'."""
    path = tmp_path / "dead.sock"
    dead = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    dead.bind(str(path))
    dead.close()
    write_daemon_file(tmp_path, pid=1, control=path, endpoint="ipc://x")
    with pytest.raises(NotRunningError, match="stale"):
        request(tmp_path, "stop", timeout_s=2)


def test_remove_daemon_file(tmp_path: Path) -> None:
    """remove_daemon_file deletes daemon.json and tolerates its absence."""
    write_daemon_file(tmp_path, pid=1, control=tmp_path / "c.sock", endpoint="ipc://x")
    remove_daemon_file(tmp_path)
    assert not (tmp_path / DAEMON_FILE).exists()
    remove_daemon_file(tmp_path)
    with pytest.raises(NotRunningError):
        request(tmp_path, "status")
