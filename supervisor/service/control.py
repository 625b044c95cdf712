"""The control socket: ``rvsup status`` and ``rvsup stop`` talk to the running daemon through it.

A Unix stream socket in the job's 0700 socket directory (mode 0600), one JSON request line, one
JSON answer line. Only the user who runs the job can connect. ``<run_dir>/daemon.json`` (0600) says
where the socket is and which process serves it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from supervisor.record import rundir

__all__ = [
    "ControlServer",
    "Handler",
    "NotRunningError",
    "remove_daemon_file",
    "request",
    "write_daemon_file",
]

_MAX_REQUEST = 4096  # bytes of one request line, its newline included
_MAX_CLIENTS = 32  # connections served at once; more are answered "busy" and closed
_READ_TIMEOUT_S = 5.0
_BUSY_READ_S = 0.1  # how long the request of a connection beyond _MAX_CLIENTS is waited for

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ControlServer:
    """Serves requests with ``handler`` until closed.

    Whatever a client sends (garbage, a partial line, an endless one, nothing at all) it gets one
    answer line, ``{"ok": false, "error": ...}`` when the request was not a small JSON object,
    and its connection is closed; at most ``_MAX_CLIENTS`` connections are held at once, each
    for at most ``_READ_TIMEOUT_S`` before its request line is complete.
    """

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None
        self._clients = 0

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(
            self._serve, path=str(self.path), limit=_MAX_REQUEST
        )
        os.chmod(self.path, 0o600)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        busy = self._clients >= _MAX_CLIENTS
        self._clients += 1
        try:
            try:
                if busy:  # its request is read (briefly), or closing would reset the connection
                    with contextlib.suppress(_RefusedError):
                        await _read_line(reader, timeout_s=_BUSY_READ_S)
                    raise _RefusedError(f"busy: {_MAX_CLIENTS} requests already open")
                answer = await self._answer(await _read_line(reader, timeout_s=_READ_TIMEOUT_S))
            except _RefusedError as exc:
                answer = _error(str(exc))
            writer.write(json.dumps(answer, default=str).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            self._clients -= 1
            writer.close()

    async def _answer(self, line: bytes) -> dict[str, Any]:
        """The answer to one request line; raises :class:`_RefusedError` for a bad one."""
        try:
            request = json.loads(line or b"{}")
        except (ValueError, RecursionError) as exc:  # RecursionError: "[[[[..." nested deeply
            raise _RefusedError(f"not JSON: {exc}") from None
        if not isinstance(request, dict):
            raise _RefusedError("request must be a JSON object")
        try:
            return await self._handler(request)
        except ValueError as exc:
            raise _RefusedError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - a client gets an answer whatever went wrong
            raise _RefusedError(f"internal error: {type(exc).__name__}: {exc}") from None

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


class _RefusedError(Exception):
    """A request answered with an error; the message says why."""


async def _read_line(reader: asyncio.StreamReader, *, timeout_s: float) -> bytes:
    """One request line (its newline included, if it came); raises :class:`_RefusedError`."""
    line: bytes | None
    try:
        line = await asyncio.wait_for(reader.readline(), timeout=timeout_s)
    except asyncio.TimeoutError:  # on Python 3.10 not the built-in TimeoutError
        raise _RefusedError(f"no complete request line within {timeout_s:g}s") from None
    except ValueError:  # longer than the reader's limit, without a newline in it
        line = None
    if line is None or len(line) > _MAX_REQUEST:
        raise _RefusedError(f"request too long (at most {_MAX_REQUEST} bytes)")
    return line


def _error(message: str) -> dict[str, Any]:
    return {"ok": False, "error": message}


def write_daemon_file(run_dir: Path, *, pid: int, control: Path, endpoint: str) -> None:
    path = run_dir / rundir.DAEMON_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump({"pid": pid, "control": str(control), "endpoint": endpoint}, f)
    os.replace(tmp, path)


def remove_daemon_file(run_dir: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        (run_dir / rundir.DAEMON_FILE).unlink()


class NotRunningError(RuntimeError):
    """No daemon serves this job."""


def request(run_dir: Path, op: str, *, timeout_s: float = 10.0) -> dict[str, Any]:
    """Send one request to the job's daemon and return its answer."""
    try:
        info = json.loads((run_dir / rundir.DAEMON_FILE).read_text())
    except PermissionError:
        raise  # another user's job: not "not running" (the command line says whose)
    except (OSError, ValueError):
        raise NotRunningError(f"no rvsup daemon is running for {run_dir}") from None
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        try:
            s.connect(str(info["control"]))
            s.sendall(json.dumps({"op": op}).encode() + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (FileNotFoundError, ConnectionRefusedError):
            raise NotRunningError(
                f"no rvsup daemon is running for {run_dir} (stale {rundir.DAEMON_FILE})"
            ) from None
    answer = json.loads(data)
    if not isinstance(answer, dict):
        raise ValueError("bad answer from the daemon")
    return answer
