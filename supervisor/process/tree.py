"""The processes of one attempt on this node: its launcher, the local ranks, how each ended.

:class:`AttemptTree` is what an :class:`~supervisor.attempt.Attempt` does to processes: start the
launcher, watch it and every local rank through pidfds, find ranks that have not said hello yet,
collect stacks before a hung attempt is killed, ask Slurm which nodes are lost, and tear the tree
down (SIGTERM, monotonic deadline, SIGKILL, reap). The attempt talks to it through the
:class:`ProcessTree` protocol, so that its unit tests use a fake.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Mapping
from pathlib import Path
from typing import Protocol

import psutil

from supervisor.loops import shielded
from supervisor.process import diagnostics, launcher, native, proctree
from supervisor.process.cgroup import TREE_WALK
from supervisor.process.exits import ExitLedger
from supervisor.process.launch_plan import LaunchPlan
from supervisor.process.oom_count import OomCounter
from supervisor.rules.observation import RankExit
from supervisor.slurm import lost
from worker_sdk.spawn.cgroup import Group

__all__ = ["AttemptTree", "ProcessTree", "Spawn"]

Spawn = Callable[[LaunchPlan], "subprocess.Popen[bytes]"]


class ProcessTree(Protocol):
    """What an attempt does to its processes: :class:`AttemptTree`, or a fake in unit tests."""

    @property
    def host(self) -> str: ...
    @property
    def launcher_rc(self) -> int | None: ...
    def start(
        self, on_launcher_exit: Callable[[int], None], on_rank_exit: Callable[[RankExit], None]
    ) -> None: ...
    def watch_rank(self, pid: int, rank: int, host: str) -> None: ...
    def record(self, ended: RankExit) -> bool: ...
    @property
    def exits(self) -> tuple[RankExit, ...]: ...
    def any_left_cleanly(self) -> bool: ...
    def scan(self) -> None: ...
    def rank_pids(self) -> Mapping[int, int]: ...
    def foresee_hang(self, directory: Path) -> None: ...
    def hold_launcher(self) -> None: ...
    def hang_averted(self) -> None: ...
    async def collect_stacks(self, directory: Path, *, native_stacks: bool) -> str | None: ...
    async def lost_nodes(self) -> dict[str, str]: ...
    def oom_kills(self) -> tuple[int, str]: ...
    def stderr_tail(self, rank: int | None = None) -> str: ...
    @property
    def mechanism(self) -> str: ...
    async def teardown(
        self, *, lost_nodes: Collection[str] = ()
    ) -> proctree.TeardownReport | None: ...


class AttemptTree:
    """One attempt's process tree on this node (see the module docstring)."""

    def __init__(
        self,
        plan: LaunchPlan,
        spawn: Spawn,
        *,
        term_timeout_s: float,
        oom: OomCounter,
        forked_launcher: Callable[[int], int | None] | None = None,
    ) -> None:
        self.plan = plan
        self._spawn = spawn
        # the launcher's client's pid -> the torchrun forked for it (a warm standby forked from
        # the zygote), which teardown and hold_launcher act on beside the client
        self._forked_launcher = forked_launcher
        self._term_timeout_s = term_timeout_s
        self._popen: subprocess.Popen[bytes] | None = None
        self._on_launcher_exit: Callable[[int], None] = _ignore
        self._on_rank_exit: Callable[[RankExit], None] = _ignore
        self._ledger = ExitLedger(
            self._on_pid_exit, reports_expected=plan.alloc is not None or plan.forked
        )
        self._oom = oom
        self._oom_baseline = self._oom.read()
        self._early: native.EarlyNative | None = None  # native stacks of a foreseen hang
        self.launcher_rc: int | None = None
        """The launcher's exit status once it ended (negative: killed by that signal)."""

    @property
    def host(self) -> str:
        return self._ledger.host

    def start(
        self, on_launcher_exit: Callable[[int], None], on_rank_exit: Callable[[RankExit], None]
    ) -> None:
        """Launch; the callbacks tell of the launcher's end and of every rank's end seen here."""
        self._on_launcher_exit = on_launcher_exit
        self._on_rank_exit = on_rank_exit
        self._popen = self._spawn(self.plan)
        self._ledger.watch(self._popen.pid, rank=None)

    def watch_rank(self, pid: int, rank: int, host: str) -> None:
        """A rank said hello: watch its process if it runs on this node."""
        if host == self._ledger.host or self.plan.nnodes == 1:
            self._ledger.watch(pid, rank=rank)

    def record(self, ended: RankExit) -> bool:
        """A rank's end told by a report; False when it was known already."""
        return self._ledger.record(ended)

    @property
    def exits(self) -> tuple[RankExit, ...]:
        return tuple(self._ledger.exits)

    def any_left_cleanly(self) -> bool:
        return self._ledger.any_left_cleanly()

    def scan(self) -> None:
        """Watch the launcher's children that have not said hello yet (single node only; forked
        ranks are not the launcher's children: their clients report how they end)."""
        if self._popen is None or self.plan.nnodes > 1 or self.plan.forked:
            return
        try:
            children = psutil.Process(self._popen.pid).children()
        except psutil.Error:
            return
        for child in children:
            if self._ledger.is_watched(child.pid):
                continue
            try:
                rank = int(child.environ().get("RANK", "-1"))
            except (psutil.Error, ValueError):
                rank = -1
            self._ledger.watch(child.pid, rank=None if rank < 0 else rank)

    def rank_pids(self) -> Mapping[int, int]:
        """pid -> rank of every rank watched on this node (for the hang rule's evidence)."""
        return self._ledger.known_ranks()

    def hold_launcher(self) -> None:
        """A rank was killed by a signal, so the attempt ends: on a single node, stop torchrun
        (SIGSTOP) until :meth:`teardown` SIGKILLs it. Left running, it notices the dead rank
        within its monitor interval and races the teardown, sending the other ranks SIGTERM
        with a warning of its own; a killed rank has no last words for it to relay. (After an
        exit with an error code torchrun runs on: it relays the rank's traceback.)"""
        popen = self._popen
        if popen is None or self.plan.nnodes > 1 or popen.returncode is not None:
            return
        for pid in self._launcher_pids(popen):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)

    def _launcher_pids(self, popen: subprocess.Popen[bytes]) -> set[int]:
        """The launcher we started and, where it is the client of a torchrun forked from the
        zygote, that torchrun."""
        forked = None if self._forked_launcher is None else self._forked_launcher(popen.pid)
        return {popen.pid} if forked is None else {popen.pid, forked}

    def foresee_hang(self, directory: Path) -> None:
        """The ranks are close to their hang timeout: where py-spy is installed, take their
        native stacks now, so that a hang declared soon need not wait for them (see
        :class:`~supervisor.process.native.EarlyNative`)."""
        if self._early is None:
            py_spy = native.find_py_spy()
            if py_spy is None:
                return
            self._early = native.EarlyNative(py_spy, directory)
        self._early.start(self._ledger.known_ranks(), time.monotonic())

    def hang_averted(self) -> None:
        """The ranks went on: native stacks taken early are discarded."""
        if self._early is not None and self._early.pending:
            self._early.drop(time.monotonic())

    async def collect_stacks(self, directory: Path, *, native_stacks: bool) -> str | None:
        """Every known rank's Python stacks and flight recorder into ``directory`` (at most a
        second), and with ``native_stacks`` its native stacks where py-spy is installed (a few
        seconds at most; none for ranks :meth:`foresee_hang` took them of)."""
        taken: frozenset[int] = frozenset()
        if self._early is not None:
            directory.mkdir(parents=True, exist_ok=True)
            taken = await self._early.take(directory, time.monotonic())
        py_spy = native.find_py_spy() if native_stacks else None
        return await diagnostics.collect_stacks(
            self._ledger.known_ranks(), directory, py_spy, native_taken=taken
        )

    async def lost_nodes(self) -> dict[str, str]:
        """The allocation's nodes that are gone, each with how that was established (at most a
        few seconds: :mod:`supervisor.slurm.lost`); none off Slurm."""
        alloc = self.plan.alloc
        if alloc is None:
            return {}
        return await asyncio.to_thread(lost.lost_nodes, alloc)

    def oom_kills(self) -> tuple[int, str]:
        """OOM kills of the job's processes during the attempt, and ``""``; where only the
        host's counter can be read, the host's (counted only if a rank died of SIGKILL) and why
        (:mod:`.oom_count`)."""
        host_wide = self._oom.host_wide
        if self._oom_baseline is None or (host_wide and not self._ledger.sigkilled):
            return 0, host_wide
        return max(0, (self._oom.read() or 0) - self._oom_baseline), host_wide

    def stderr_tail(self, rank: int | None = None) -> str:
        """The end of the ranks' stderr on this node; with ``rank``, of that rank's alone."""
        if rank is None:
            return launcher.stderr_tail(self.plan.log_dir)
        local = rank % self.plan.nproc_per_node  # static rendezvous: node after node
        return launcher.stderr_tail(self.plan.log_dir, max_bytes=2048, local_rank=local)

    @property
    def mechanism(self) -> str:
        """How the teardown finds the attempt's processes: its cgroup, or the process tree."""
        return f"cgroup v2 ({self.plan.cgroup})" if self.plan.cgroup else TREE_WALK

    async def teardown(self, *, lost_nodes: Collection[str] = ()) -> proctree.TeardownReport | None:
        """Kill and reap the whole tree (with a cgroup: every member of the attempt's group, then
        remove the group); runs to its end even if the caller is cancelled. What it did (None:
        nothing was started). ``lost_nodes``: nodes known lost, whose ranks srun would wait for
        until its own time-outs: srun is then SIGKILLed as soon as this node's ranks are gone."""
        self._ledger.close()
        self.hang_averted()  # early native stacks that no declared hang took
        popen = self._popen
        if popen is None:
            return None
        group = Group(Path(self.plan.cgroup)) if self.plan.cgroup else None
        launchers = self._launcher_pids(popen)
        pids = set(self._ledger.rank_of_pid) | launchers
        # single node: the ranks get SIGTERM, and once they are gone torchrun is SIGKILLed (it
        # takes seconds to shut down after SIGTERM, logging warnings, and has nothing to save;
        # it stays stopped if hold_launcher stopped it);
        # srun is sent SIGTERM and awaited, so that Slurm gives the other nodes' ranks the same
        # SIGTERM grace; with a node known lost, only until this node's ranks are gone (srun
        # would wait for the lost node's ranks until its own time-outs)
        ranks = {pid for pid, rank in self._ledger.rank_of_pid.items() if rank is not None}
        one_node = self.plan.nnodes == 1
        report = await shielded(
            asyncio.to_thread(
                proctree.teardown,
                pids,
                term_timeout_s=self._term_timeout_s,
                popens=[popen],
                workers=ranks - launchers if one_node or lost_nodes else None,
                spared=tuple(launchers) if one_node else (),
                members=None if group is None else group.pids,
                kill_all=None if group is None else group.kill,
            )
        )
        if group is not None:
            group.remove()  # fails, and is retried at the job's end, while a process is left
        if self.launcher_rc is None:
            self.launcher_rc = popen.returncode
        return report

    def _on_pid_exit(self, pid: int) -> None:
        if self._popen is not None and pid == self._popen.pid:
            self._ledger.unwatch(pid)
            self.launcher_rc = self._popen.wait()
            self._on_launcher_exit(self.launcher_rc)
            return
        ended = self._ledger.from_zombie(pid)
        if ended is not None and self._ledger.record(ended):
            self._on_rank_exit(ended)


def _ignore(_: object) -> None:
    return None
