"""The zygote's forked ranks, each held with its client's connection: the client is told how its
rank ended, and the zombie is reaped once the client hangs up (a rank whose client went first is
killed). Loaded by :mod:`.zygote` by path, as its other siblings are; standard library only.
"""

from __future__ import annotations

import contextlib
import os
import selectors
import signal
import socket
from dataclasses import dataclass

from . import zygote_wire as wire

__all__ = ["Rank", "on_client", "on_exits", "reap", "wait_status"]


@dataclass(slots=True)
class Rank:
    """A forked rank and its client's connection.

    When the rank ends, the zygote tells the client but leaves the zombie unreaped until the
    client hangs up: meanwhile the supervisor, which watches the rank's pid, reads how it ended
    from the zombie, as it would read a cold rank's.
    """

    conn: socket.socket
    ended: bool = False  # its wait status was sent to the client
    orphan: bool = False  # its client went away first (and the rank was killed)


def on_exits(ranks: dict[int, Rank], sel: selectors.BaseSelector) -> None:
    """Tell the client of every rank that ended (the zombie stays until the client hangs up)."""
    for pid, rank in list(ranks.items()):
        if rank.ended:
            continue
        try:
            info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:  # reaped already: nothing to wait for
            reap(pid, ranks, sel)
            continue
        if info is None:  # still running
            continue
        if rank.orphan:
            reap(pid, ranks, sel)
            continue
        rank.ended = True
        try:
            wire.send(rank.conn, {"status": wait_status(info)})
        except OSError:
            reap(pid, ranks, sel)


def wait_status(info: os.waitid_result) -> int:
    """The ``waitpid`` status that ``waitid`` describes."""
    if info.si_code == os.CLD_EXITED:
        return (info.si_status & 0xFF) << 8
    return info.si_status | (0x80 if info.si_code == os.CLD_DUMPED else 0)


def on_client(pid: int, ranks: dict[int, Rank], sel: selectors.BaseSelector) -> None:
    """The client hung up: after its rank's end (reap it), or before (the rank must not outlive
    it: killed, and reaped once it ended)."""
    rank = ranks.get(pid)
    if rank is None:
        return
    if rank.ended:
        reap(pid, ranks, sel)
        return
    sel.unregister(rank.conn)
    rank.conn.close()
    rank.orphan = True
    for sig in (signal.SIGKILL, signal.SIGCONT):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)


def reap(pid: int, ranks: dict[int, Rank], sel: selectors.BaseSelector) -> None:
    rank = ranks.pop(pid)
    if rank.conn.fileno() >= 0:
        if rank.conn.fileno() in sel.get_map():
            sel.unregister(rank.conn)
        rank.conn.close()
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
