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

_MAX_REQUEST = 4096

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]


class ControlServer:
    """Serves requests with ``handler`` until closed."""

    def __init__(self, path: Path, handler: Handler) -> None:
        self.path = path
        self._handler = handler
        self._server: asyncio.AbstractServer | None = None

    async def start(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        self._server = await asyncio.start_unix_server(self._serve, path=str(self.path))
        os.chmod(self.path, 0o600)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), timeout=5)
            if len(line) > _MAX_REQUEST:
                raise ValueError("request too long")
            request = json.loads(line or b"{}")
            if not isinstance(request, dict):
                raise ValueError("request must be a JSON object")
            answer = await self._handler(request)
        except (ValueError, TimeoutError) as exc:
            answer = {"ok": False, "error": str(exc)}
        try:
            writer.write(json.dumps(answer, default=str).encode() + b"\n")
            await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


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
