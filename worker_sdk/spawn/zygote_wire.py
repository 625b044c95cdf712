"""What a rank's client and the zygote say to each other, and the rules both sides apply.

Standard library only: the client side runs on rvsup's interpreter inside the bootstrap, the
zygote on the job's (which loads this file by path, see ``worker_sdk.spawn.zygote``).

The conversation, over one connection to the zygote's abstract Unix socket:

1. client -> zygote: a :func:`send` of the request (argv, env, cwd, umask, rlimits, CPU
   affinity, signal mask) carrying the client's fds 0, 1 and 2 (``SCM_RIGHTS``);
2. zygote -> client: ``{"pid": N}`` (rank N runs) or ``{"refused": "why"}`` (start cold);
   the forked rank waits for this answer to be sent before it runs, so a zygote that dies
   first leaves no rank behind and the client's cold start is the rank's only run;
3. zygote -> client: ``{"status": W}``, the rank's wait status, when it ended.

The zygote kills the rank when the connection closes before it ended (the client died).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

__all__ = [
    "IMPORT_ENV_PREFIXES",
    "RLIMITS",
    "Program",
    "WireError",
    "import_env_differences",
    "parse_command",
    "recv",
    "same_interpreter",
    "send",
]

_LENGTH: Final = struct.Struct("<I")
MAX_BYTES: Final = 4 * 1024 * 1024  # a request is argv + env: far below this
MAX_FDS: Final = 3

#: Resource limits a cold exec inherits from the client and the zygote applies to the rank.
RLIMITS: Final = tuple(
    name
    for name in (
        "RLIMIT_AS",
        "RLIMIT_CORE",
        "RLIMIT_CPU",
        "RLIMIT_DATA",
        "RLIMIT_FSIZE",
        "RLIMIT_MEMLOCK",
        "RLIMIT_MSGQUEUE",
        "RLIMIT_NICE",
        "RLIMIT_NOFILE",
        "RLIMIT_NPROC",
        "RLIMIT_RSS",
        "RLIMIT_RTPRIO",
        "RLIMIT_SIGPENDING",
        "RLIMIT_STACK",
    )
    if hasattr(resource, name)
)

#: Variables read while Python starts or while torch and its libraries are imported: a rank
#: whose value of one of them differs from the zygote's would not get what a cold start gives.
IMPORT_ENV_PREFIXES: Final = (
    "PYTHON",
    "LD_",
    "OMP_",
    "KMP_",
    "MKL_",
    "OPENBLAS_",
    "GOMP_",
    "CUDA_",
    "NVIDIA_",
    "TORCH",
    "PYTORCH_",
    "VIRTUAL_ENV",
    "LANG",
    "LC_",
)
#: Read by torch at run time (torchrun sets them for every rank), not while importing.
_RUNTIME_ONLY: Final = ("TORCHELASTIC_", "TORCH_NCCL_", "TORCH_DISTRIBUTED_", "TORCH_FR_")


class WireError(Exception):
    """A message that is not one: closed early, too long, not JSON."""


def send(sock: socket.socket, message: Mapping[str, Any], fds: Sequence[int] = ()) -> None:
    """One length-prefixed JSON message, with ``fds`` attached to its first byte."""
    body = json.dumps(message, separators=(",", ":")).encode()
    data = _LENGTH.pack(len(body)) + body
    sent = socket.send_fds(sock, [data], list(fds)) if fds else sock.send(data)
    if sent < len(data):
        sock.sendall(data[sent:])


def recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]]:
    """One message and the fds that came with it; :class:`WireError` when there is none."""
    head, fds, _flags, _addr = socket.recv_fds(sock, _LENGTH.size, MAX_FDS)
    try:
        while len(head) < _LENGTH.size:
            more = sock.recv(_LENGTH.size - len(head))
            if not more:
                raise WireError("connection closed")
            head += more
        (size,) = _LENGTH.unpack(head)
        if size > MAX_BYTES:
            raise WireError(f"message of {size} bytes")
        body = bytearray()
        while len(body) < size:
            chunk = sock.recv(min(size - len(body), 1 << 20))
            if not chunk:
                raise WireError("connection closed")
            body += chunk
        message = json.loads(body)
        if not isinstance(message, dict):
            raise WireError("not a JSON object")
    except (WireError, ValueError, OSError) as exc:
        for fd in fds:
            os.close(fd)
        raise WireError(str(exc)) from exc
    return message, fds


@dataclass(frozen=True, slots=True)
class Program:
    """What ``python [-u] SCRIPT ARGS`` or ``python [-u] -m MODULE ARGS`` runs."""

    target: str  # the script's path, or the module's name
    is_module: bool
    args: tuple[str, ...]  # sys.argv[1:]
    unbuffered: bool


def parse_command(
    argv: Sequence[str], cwd: str, path_env: str | None, python: str
) -> Program | str:
    """The program of a rank's command line when the zygote of interpreter ``python`` can run
    it, else why not (a sentence).

    ``argv[0]`` must name that interpreter: the same file in the same directory, symlinks
    resolved (another virtual environment's ``python`` links to the same binary, but its
    directory differs). Interpreter options other than ``-u`` are refused: they change how the
    interpreter starts, which a fork of an interpreter already started cannot.
    """
    if not argv:
        return "empty command"
    exe = _which(argv[0], cwd, path_env)
    if exe is None:
        return f"{argv[0]!r} not found"
    if not same_interpreter(exe, python):
        return f"{argv[0]!r} is not the zygote's interpreter {python}"
    unbuffered = False
    i = 1
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        opt = argv[i]
        if opt == "-u":
            unbuffered = True
            i += 1
            continue
        if opt == "-m":
            if i + 1 >= len(argv):
                return "-m without a module"
            return Program(argv[i + 1], True, tuple(argv[i + 2 :]), unbuffered)
        if opt.startswith("-m") and len(opt) > 2:
            return Program(opt[2:], True, tuple(argv[i + 1 :]), unbuffered)
        return f"interpreter option {opt} (only -u and -m are served by the zygote)"
    if i >= len(argv) or argv[i] == "-":
        return "no script (standard input or an interactive interpreter)"
    script = os.path.join(cwd, argv[i])
    if not os.path.isfile(script):
        return f"script {argv[i]!r} not found"
    return Program(argv[i], False, tuple(argv[i + 1 :]), unbuffered)


def import_env_differences(rank_env: Mapping[str, str], zygote_env: Mapping[str, str]) -> list[str]:
    """Names of the import-time variables (:data:`IMPORT_ENV_PREFIXES`) whose values differ."""
    names = {n for n in (*rank_env, *zygote_env) if _import_time(n)}
    return sorted(n for n in names if rank_env.get(n) != zygote_env.get(n))


def _import_time(name: str) -> bool:
    return name.startswith(IMPORT_ENV_PREFIXES) and not name.startswith(_RUNTIME_ONLY)


def _which(name: str, cwd: str, path_env: str | None) -> str | None:
    if os.sep in name:
        path = os.path.join(cwd, name)
        return path if os.access(path, os.X_OK) else None
    for folder in (path_env or os.defpath).split(os.pathsep):
        path = os.path.join(cwd, folder or ".", name)
        if os.path.isfile(path) and os.access(path, os.X_OK):
            return path
    return None


def same_interpreter(a: str, b: str) -> bool:
    """``a`` and ``b`` name one interpreter: the same file in the same directory, symlinks
    resolved (another virtual environment's ``python`` links to the same binary, but its
    directory differs)."""

    def key(path: str) -> tuple[str, str]:
        return os.path.realpath(os.path.dirname(os.path.abspath(path))), os.path.realpath(path)

    try:
        return key(a) == key(b)
    except OSError:
        return False
