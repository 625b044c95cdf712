"""The rank's side of the zygote: what the bootstrap runs when ``RVSUP_ZYGOTE`` names one.

torchrun starts ``python -m worker_sdk.spawn.bootstrap CMD...`` for every rank. With a zygote, that
process becomes a small client instead of exec'ing ``CMD``: it hands the zygote its command line,
environment, working directory, umask, resource limits, CPU affinity, signal mask, ignored
signals, standard streams and cgroup (v2), and the zygote forks the rank from an interpreter that imported
torch already. Then the client stands in for the rank toward torchrun, as the multi-node waiter does
(``worker_sdk.spawn.exit_report``):

- every signal torchrun, srun or a user sends it is passed on to the rank;
- when the rank ends, the client reports ``RANK_EXIT`` to the supervisor and ends the same way
  (the exit code, or death by the same signal);
- if the client dies, the zygote kills the rank.

When the zygote cannot serve the request (none listening, another interpreter, a different
import-time environment, an unsafe import) :func:`run` returns the reason and the bootstrap
starts the rank cold. Standard library only, plus ZeroMQ for the report once the rank runs.
"""

from __future__ import annotations

import contextlib
import os
import resource
import select
import signal
import socket
from collections.abc import Sequence
from typing import Any, NoReturn

from . import zygote_wire as wire
from .cgroup import own_group_dir, own_memory_v1_dir
from .exit_report import FORWARDED, ReportTo, connect, end_like, send_report
from .zygote_child import SHIELDED

__all__ = ["request_of", "run"]

_CONNECT_TIMEOUT_S = 2.0  # the zygote accepts at once, even while it still imports
_READY_TIMEOUT_S = 600.0  # the zygote's imports, on a machine busy starting every rank


def request_of(argv: Sequence[str]) -> dict[str, object]:
    """What this process would give ``argv`` if it exec'd it: the request to the zygote."""
    rlimits = {name: list(resource.getrlimit(getattr(resource, name))) for name in wire.RLIMITS}
    umask = os.umask(0)
    os.umask(umask)
    return {
        "argv": list(argv),
        "env": dict(os.environ),
        "cwd": os.getcwd(),
        "umask": umask,
        "rlimits": rlimits,
        "affinity": sorted(os.sched_getaffinity(0)),
        "sigmask": sorted(int(s) for s in signal.pthread_sigmask(signal.SIG_BLOCK, [])),
        "ignored": sorted(int(s) for s in SHIELDED if signal.getsignal(s) == signal.SIG_IGN),
        "cgroup": own_group_dir(),  # the forked rank is placed in it before it runs (the attempt's)
        # and in this v1 memory group (a node wrapper's, where the node's OOM kills are counted)
        "memory_cgroup": own_memory_v1_dir(),
    }


def run(argv: Sequence[str], name: str, to: ReportTo | None) -> str:
    """Have the zygote ``name`` run ``argv`` and end like it; returns only when it refused,
    with the reason."""
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(_CONNECT_TIMEOUT_S)
    try:
        sock.connect("\0" + name)
    except OSError as exc:
        sock.close()
        return f"no zygote ({exc.strerror or exc})"
    request = request_of(argv)  # before the forwarding handlers replace the dispositions
    read_w, wake_w, before = _signals_to_pipe()
    try:
        wire.send(sock, request, fds=(0, 1, 2))
        sock.settimeout(_READY_TIMEOUT_S)
        answer, _ = wire.recv(sock)
    except (OSError, wire.WireError) as exc:
        _signals_restored(read_w, wake_w, before)
        sock.close()
        return f"the zygote did not answer ({exc})"
    if "pid" not in answer:
        _signals_restored(read_w, wake_w, before)
        sock.close()
        return str(answer.get("refused", "the zygote refused"))
    rank = int(answer["pid"])
    return _stand_in(sock, rank, read_w, to)


def _stand_in(sock: socket.socket, rank: int, signals: int, to: ReportTo | None) -> NoReturn:
    """Pass signals on to the rank until the zygote says how it ended; then report it (on a
    channel opened while the rank runs: a peer on another node may fail of the broken
    connection at once, and the report must not come after its own) and end like it."""
    channel = connect(to) if to is not None else None
    status = _wait_for_end(sock, rank, signals)
    if to is not None:
        send_report(channel, to, rank, status)
    end_like(status)


Handlers = dict[signal.Signals, Any]  # the handlers signal.signal returns


def _signals_to_pipe() -> tuple[int, int, Handlers]:
    """From now on, the signals to forward wake a pipe instead of acting (their handlers do
    nothing but let the interpreter write the signal's number there); the old handlers."""
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    before = {sig: signal.signal(sig, _noop) for sig in FORWARDED}
    return r, w, before


def _signals_restored(r: int, w: int, before: Handlers) -> None:
    """The handlers a cold start inherits again; signals taken meanwhile act now."""
    signal.set_wakeup_fd(-1)
    pending = b""
    with contextlib.suppress(BlockingIOError):
        pending = os.read(r, 512)
    for sig, handler in before.items():
        signal.signal(sig, handler)
    os.close(r)
    os.close(w)
    for number in pending:
        os.kill(os.getpid(), number)


def _noop(_sig: int, _frame: object) -> None:
    return None


def _wait_for_end(sock: socket.socket, rank: int, signals: int) -> int:
    """Pass signals on to the rank until the zygote says how it ended: its wait status."""
    status: int | None = None
    while status is None:
        try:
            ready, _, _ = select.select([sock.fileno(), signals], [], [])
        except InterruptedError:
            continue
        if signals in ready:
            with contextlib.suppress(BlockingIOError):
                for number in os.read(signals, 512):
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(rank, number)
        if sock.fileno() in ready:
            try:
                message, _ = wire.recv(sock)
                status = int(message["status"])
            except (OSError, wire.WireError, KeyError, TypeError, ValueError):
                status = _lost(rank)
    return status


def _lost(rank: int) -> int:
    """The zygote went away before the rank ended (the rank dies with it): SIGKILL as status."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(rank, signal.SIGKILL)
    return int(signal.SIGKILL)  # a wait status: killed by SIGKILL
