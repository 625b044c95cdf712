"""The control socket under fuzzing: whatever a client sends, the server answers one JSON line
(an error unless it was a JSON object) and closes the connection, nothing escapes into the event
loop, and a real ``rvsup status`` request is served right after."""

from __future__ import annotations

import asyncio
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from supervisor.service import control
from supervisor.service.control import ControlServer, request, write_daemon_file

from .control_client import ANY_ERROR, exchange, expected_error
from .strategies import FUZZ, request_lines


async def daemon_like(req: dict[str, Any]) -> dict[str, Any]:
    """Answers as the daemon's handler does (status, stop, anything else refused)."""
    op = req.get("op")
    if op == "status":
        return {"ok": True, "state": "running"}
    if op == "stop":
        return {"ok": True, "state": "stopping"}
    if op == "crash":
        raise TypeError("a handler defect")
    return {"ok": False, "error": f"unknown op {op!r}; valid: status, stop"}


@dataclass
class Served:
    """A control server running on its own event loop in a thread."""

    path: Path
    run_dir: Path
    server: ControlServer
    loop: asyncio.AbstractEventLoop
    escaped: list[dict[str, Any]] = field(default_factory=list)

    def status_works(self) -> None:
        assert request(self.run_dir, "status", timeout_s=5) == {"ok": True, "state": "running"}

    def no_escapes(self) -> None:
        assert self.escaped == [], "an exception escaped into the event loop"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One server for the module (hypothesis runs many examples against it)."""
    tmp = tmp_path_factory.mktemp("control")
    loop = asyncio.new_event_loop()
    srv = Served(tmp / "c.sock", tmp, ControlServer(tmp / "c.sock", daemon_like), loop)
    loop.set_exception_handler(lambda _loop, context: srv.escaped.append(context))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(srv.server.start(), loop).result(timeout=10)
    write_daemon_file(tmp, pid=os.getpid(), control=srv.path, endpoint="ipc://unused")
    try:
        yield srv
    finally:
        asyncio.run_coroutine_threadsafe(srv.server.close(), loop).result(timeout=10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


def _check_answer(data: bytes, lines: list[bytes]) -> None:
    """One JSON object line, the one ``data`` must get."""
    assert len(lines) == 1 and lines[0].endswith(b"\n"), lines
    answer = json.loads(lines[0])
    assert isinstance(answer, dict) and isinstance(answer["ok"], bool), answer
    error = expected_error(data)
    if error == ANY_ERROR:  # nested too deeply for some parser: any answer will do
        return
    if error is None:  # a JSON object: the handler's answer
        first = json.loads(data.split(b"\n", 1)[0] or b"{}")
        assert answer["ok"] is (first.get("op") in ("status", "stop")), answer
    else:
        assert answer["ok"] is False and answer["error"].startswith(error), answer


@FUZZ
@given(request_lines, st.sampled_from([b"\n", b"", b"\r\n", b"\n" + b"{}" * 3]))
# found by this test: a RecursionError in the parser closed the connection without an answer
@example(b"[" * 1000 + b"]" * 1000, b"\n")
@example(b'{"op":' * 1200 + b"1" + b"}" * 1200, b"\n")
@example(b'{"op": "crash"}', b"\n")  # a defect of the handler: still an answer
@example(b"x" * 70_000, b"")  # past the reader's limit, no newline
@example(b"x" * 4095, b"\n")  # exactly the limit: read, then refused as not JSON
@example(b"", b"")  # connect, send nothing, close
def test_any_request_is_answered_once_and_the_server_goes_on(
    served: Served, data: bytes, ending: bytes
) -> None:
    """Any bytes, however they end, get one answer line (an error unless they were a JSON
    object), the connection is closed by the server, nothing escapes into the event loop, and a
    real status request is served next."""
    sent = data + ending
    _check_answer(sent, exchange(served.path, sent))
    served.no_escapes()
    served.status_works()


def test_a_request_left_incomplete_is_answered_after_the_read_timeout(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends half a line and waits gets an error when the read timeout expires
    (on Python 3.10 asyncio's TimeoutError is not the built-in one: it used to escape)."""
    monkeypatch.setattr(control, "_READ_TIMEOUT_S", 0.3)
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(5)
        s.connect(str(served.path))
        s.sendall(b'{"op": "sta')
        answer = json.loads(s.recv(65536))
        assert s.recv(1) == b"", "the server left the connection open"
    assert answer == {"ok": False, "error": "no complete request line within 0.3s"}
    served.no_escapes()
    served.status_works()


@pytest.mark.serial  # answered within 0.5 s
def test_idle_connections_beyond_the_limit_are_told_busy(
    served: Served, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Connections held open without a request occupy at most _MAX_CLIENTS slots; one more is
    answered busy at once; when they time out, status requests are served again."""
    monkeypatch.setattr(control, "_READ_TIMEOUT_S", 1.0)
    idle = [socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(control._MAX_CLIENTS)]
    try:
        for s in idle:
            s.connect(str(served.path))
        time.sleep(0.2)  # every one of them accepted
        t0 = time.monotonic()
        [line] = exchange(served.path, b'{"op": "status"}\n')
        assert json.loads(line)["error"].startswith("busy"), line
        assert time.monotonic() - t0 < 0.5
        for s in idle:  # each got the timeout's answer, then was closed
            s.settimeout(5)
            assert json.loads(s.recv(65536))["error"].startswith("no complete request line")
    finally:
        for s in idle:
            s.close()
    served.no_escapes()
    served.status_works()
