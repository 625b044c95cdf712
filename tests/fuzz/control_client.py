"""A raw client of the control socket, and what a request must be answered with."""

from __future__ import annotations

import contextlib
import json
import random
import socket
from pathlib import Path
from typing import Any

from supervisor.service import control

__all__ = ["ANY_ERROR", "draw_request", "exchange", "expected_error"]

ANY_ERROR = ""
"""What :func:`expected_error` says of a request nested so deeply that whether the server's
parser (or its answer's repr) reaches Python's recursion limit depends on its stack depth."""
_DEEP = 800


def exchange(path: Path, data: bytes, *, timeout_s: float = 5.0) -> list[bytes]:
    """Send ``data``, close the sending side, read until the server closes; the lines read.
    Raises ``TimeoutError`` when the server neither answers nor closes in time."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout_s)
        s.connect(str(path))
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            s.sendall(data)
            s.shutdown(socket.SHUT_WR)
        received = b""
        while chunk := s.recv(65536):
            received += chunk
    return received.splitlines(keepends=True)


def expected_error(data: bytes) -> str | None:
    """The start of the error a request ``data`` must get; None when it is a JSON object (the
    handler answers it)."""
    first = data.split(b"\n", 1)[0] + (b"\n" if b"\n" in data else b"")
    if len(first) > control._MAX_REQUEST:
        return "request too long"
    if _depth(first) >= _DEEP:
        return ANY_ERROR
    try:
        request: Any = json.loads(first or b"{}")
    except (ValueError, RecursionError):
        return "not JSON"
    return None if isinstance(request, dict) else "request must be a JSON object"


def _depth(text: bytes) -> int:
    """How deeply arrays and objects nest in ``text`` (brackets inside strings not counted)."""
    depth = deepest = 0
    in_string = escaped = False
    for byte in text:
        if in_string:
            escaped, in_string = (False, True) if escaped else (byte == 0x5C, byte != 0x22)
        elif byte == 0x22:
            in_string = True
        elif byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        elif byte in b"]}":
            depth -= 1
    return deepest


_VALID = (b'{"op": "status"}', b'{"op": "history"}', b'{"op": "nope"}', b"{}")


def draw_request(rng: random.Random) -> bytes:
    """One request (newline included, or not) drawn by ``rng``: random bytes, a valid request
    mutated, a JSON value that is not an object, nesting, a line longer than the server reads.
    Never ``stop``: the job it is sent to must go on."""
    which = rng.randrange(6)
    if which == 0:
        data = rng.randbytes(rng.randrange(200))
    elif which == 1:
        valid = rng.choice(_VALID)
        at = rng.randrange(len(valid) + 1)
        data = valid[:at] + rng.randbytes(rng.randrange(1, 8)) + valid[at + rng.randrange(3) :]
    elif which == 2:
        data = json.dumps(rng.choice([[1, 2], "status", None, 3.5, True])).encode()
    elif which == 3:
        depth = rng.randrange(1, 1500)
        data = b"[" * depth + b"]" * depth
    elif which == 4:
        data = b'{"op": "' + b"x" * rng.randrange(4000, 20_000) + b'"}'
    else:
        data = rng.choice(_VALID)
    if b'"stop"' in data:
        data = data.replace(b'"stop"', b'"stap"')
    return data + rng.choice([b"\n", b"", b"\r\n"])
