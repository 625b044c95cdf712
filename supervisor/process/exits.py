"""How the ranks of one attempt ended, each counted once, whoever tells first.

Two sources: a pidfd for every process of this node the supervisor watches (the launcher and the
local ranks; the exit status is read from the zombie), and ``RANK_EXIT`` reports from the ranks'
waiting parents on multi-node attempts (the only news of a rank on another node, and of a local
one its parent reaped before the zombie was read).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable

from supervisor.process import proctree
from supervisor.rules.observation import RankExit

__all__ = ["ExitLedger"]


class ExitLedger:
    """The attempt's pidfds and the rank exits seen so far."""

    def __init__(self, on_exit: Callable[[int], None], *, reports_expected: bool) -> None:
        self.host = os.uname().nodename
        self.exits: list[RankExit] = []
        self.rank_of_pid: dict[int, int | None] = {}  # every pid ever watched
        self.sigkilled = False  # a rank of this host died of SIGKILL: maybe the OOM killer
        self._pidfds: dict[int, int] = {}  # pid -> pidfd, while watched
        self._on_exit = on_exit
        self._reports_expected = reports_expected

    def watch(self, pid: int, *, rank: int | None) -> None:
        """Call ``on_exit(pid)`` once ``pid`` has exited (no-op for a pid already watched,
        except that a rank learnt later is remembered)."""
        if pid in self._pidfds:
            if rank is not None:
                self.rank_of_pid[pid] = rank
            return
        fd = proctree.open_pidfd(pid)
        if fd is None:
            return
        self._pidfds[pid] = fd
        self.rank_of_pid[pid] = rank
        asyncio.get_running_loop().add_reader(fd, self._on_exit, pid)

    def is_watched(self, pid: int) -> bool:
        return pid in self._pidfds

    def unwatch(self, pid: int) -> None:
        fd = self._pidfds.pop(pid, None)
        if fd is not None:
            asyncio.get_running_loop().remove_reader(fd)
            os.close(fd)

    def close(self) -> None:
        for pid in list(self._pidfds):
            self.unwatch(pid)

    def from_zombie(self, pid: int) -> RankExit | None:
        """The exit of watched rank process ``pid`` (after its pidfd fired), or None when its
        status is gone and a report will tell instead."""
        self.unwatch(pid)
        status = proctree.ExitStatus.from_wait_status(proctree.zombie_wait_status(pid))
        if status.code is None and status.signal is None and self._reports_expected:
            return None  # its waiting parent reaped it first
        return RankExit(self.rank_of_pid.get(pid), pid, status.code, status.signal, self.host)

    def record(self, ended: RankExit) -> bool:
        """Add one exit; False if it was already known (the same pid on the same node)."""
        if any((e.pid, e.node) == (ended.pid, ended.node) for e in self.exits):
            return False
        self.exits.append(ended)
        if ended.signal == signal.SIGKILL and ended.node == self.host:
            self.sigkilled = True
        return True

    def any_left_cleanly(self) -> bool:
        return any(e.exit_code == 0 for e in self.exits)

    def known_ranks(self) -> dict[int, int]:
        """pid -> rank of every watched process that said which rank it is."""
        return {pid: rank for pid, rank in self.rank_of_pid.items() if rank is not None}
