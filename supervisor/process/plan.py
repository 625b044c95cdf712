"""Where and how each attempt is launched: the nodes it runs on, its plan, its process tree.

:class:`Launches` is the supervisor's one source of launch plans. It knows the allocation (or that
there is none), how many nodes the job runs on, which nodes a node failure took away, which
torchrun to run and whether a warm standby launcher is kept ready, and it builds, for attempt
``n``, the :class:`~supervisor.process.launch_plan.LaunchPlan` and the
:class:`~supervisor.process.tree.AttemptTree` that starts it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Collection, Iterable, Mapping
from pathlib import Path

from supervisor.config.model import JobConfig
from supervisor.config.torchrun import Torchrun, job_python
from supervisor.process import launch_plan, launcher
from supervisor.process.cgroup import JobGroups, end_group
from supervisor.process.launch_plan import LaunchPlan
from supervisor.process.oom_count import OomCounter
from supervisor.process.proctree import TeardownReport
from supervisor.process.tree import AttemptTree
from supervisor.process.zygote import Zygote
from supervisor.record.schema import ColdStart
from supervisor.rules.policy import nodes_for_restart
from supervisor.slurm.commands import Allocation
from supervisor.slurm.srun import srun_argv
from worker_sdk.spawn.zygote_wire import same_interpreter

__all__ = ["Launches", "PortHold", "sweep_nodes"]


class Launches:
    """Launch planning for one ``rvsup start`` (see the module docstring)."""

    def __init__(
        self,
        cfg: JobConfig,
        alloc: Allocation | None,
        torchrun: Torchrun,
        groups: JobGroups | None = None,
        sweep: Callable[[Allocation, str], None] | None = None,
        withheld_env: Collection[str] = (),
        snapshots: Path | None = None,
        oom: OomCounter | None = None,
    ) -> None:
        self.cfg = cfg
        self.oom = oom or OomCounter.of_job(None, None, "")
        """Where the job's OOM kills are counted (cgroup.job_memory)."""
        self.withheld_env = tuple(withheld_env)
        """The daemon's environment variables no child inherits (:func:`launch_plan.build_plan`)."""
        self.groups = groups
        """The job's cgroups; None: the teardown walks the process tree instead."""
        # snapshots: the job's folder of memory snapshots (supervisor.ranks.snapshots), whose
        # copies on every node the sweep removes; None when the tier is off
        self._sweep = (
            functools.partial(sweep_nodes, snapshots=snapshots) if sweep is None else sweep
        )
        self.alloc = alloc
        self.torchrun = torchrun
        self.nodes_needed = launch_plan.nodes_needed(cfg, alloc)
        self.nodes_minimum = min(cfg.launch.min_nnodes or self.nodes_needed, self.nodes_needed)
        """After a node failure, the job goes on with as few as this many nodes."""
        self.lost_nodes: set[str] = set()
        self.standby = launcher.Standby(torchrun) if cfg.launch.warm_standby else None
        self.zygote: Zygote | None = None
        self._port: PortHold | None = None
        self._cold: list[ColdStart] = []
        self._planned = 0  # the last attempt planned
        if cfg.launch.zygote:
            python = job_python(cfg)
            if python is None:
                why = f"job.command[0] ({cfg.job.command[0]!r}) is not a Python interpreter"
                self._cold.append(ColdStart(ranks=(), reason=why))
            else:
                self.zygote = Zygote(
                    python,
                    cfg.launch.preload,
                    path=_script_folder(cfg),
                    step_name=f"{cfg.job.name}-zygote",
                )

    @property
    def multi_node(self) -> bool:
        return self.nodes_needed > 1

    def nodes_left(self) -> tuple[str, ...]:
        """The allocation's first nodes that no failure took away, as many as the job needs
        (fewer when fewer are left)."""
        assert self.alloc is not None
        return nodes_for_restart(self.alloc.nodes, self.lost_nodes, self.nodes_needed)

    def usable_nodes(self) -> tuple[str, ...] | None:
        """Every node of the allocation that is neither lost nor excluded, spares included, in
        allocation order; None outside an allocation."""
        if self.alloc is None:
            return None
        return tuple(node for node in self.alloc.nodes if node not in self.lost_nodes)

    def lose(self, nodes: Iterable[str]) -> tuple[int, int] | None:
        """Nodes a node failure named, or excluded ones, are gone for this allocation; returns
        (left, minimum) for the policy, or None when the job does not run in an allocation."""
        if self.alloc is None:
            return None
        self.lost_nodes.update(nodes)
        return len(self.nodes_left()), self.nodes_minimum

    def plan(self, attempt: int, rank_env: Mapping[str, str]) -> LaunchPlan:
        """Attempt ``attempt``'s command line and environment (with the zygote started, on
        every node of the attempt, if it is not running there)."""
        self._planned = attempt
        alloc = None
        if self.alloc is not None:
            alloc = dataclasses.replace(self.alloc, nodes=self.nodes_left())
        if self._port is not None:
            self._port.close()
        self._port = PortHold()  # the attempt's rendezvous port, kept from others until it ends
        groups = self.groups
        plan = launch_plan.build_plan(
            self.cfg,
            attempt=attempt,
            torchrun=self.torchrun,
            rank_env=rank_env,
            alloc=alloc,
            rdzv_port=self._port.port,
            cgroup=None if groups is None else groups.attempt(attempt),
            withheld_env=self.withheld_env,
        )
        if self.zygote is None:
            return plan
        self._cold += self.zygote.cold_starts()  # its death, before it is started again
        zygote_group = None if groups is None else groups.zygote()
        self.zygote.ensure(plan.env, plan.cwd, plan.nproc_per_node, plan.alloc, cgroup=zygote_group)
        return launch_plan.build_plan(
            self.cfg,
            attempt=attempt,
            torchrun=self.torchrun,
            rank_env=rank_env,
            alloc=alloc,
            rdzv_port=self._port.port,
            zygote=self.zygote.name,
            cgroup=plan.cgroup,
            withheld_env=self.withheld_env,
        )

    def cold_starts(self) -> list[ColdStart]:
        """Ranks that started cold since last asked, and why."""
        out, self._cold = self._cold, []
        if self.zygote is not None:
            out += self.zygote.cold_starts()
        return out

    def tree(self, plan: LaunchPlan) -> AttemptTree:
        """The process tree that will run ``plan``: through the warm standby when there is one,
        else, on one node, through a launcher forked from the zygote now (see :meth:`_forked`)."""
        spawn = launcher.spawn
        if self.standby is not None:
            self._forked(plan)
            spawn = self.standby.spawn
        return AttemptTree(
            plan,
            spawn,
            term_timeout_s=self.cfg.launch.term_timeout_s,
            oom=self.oom,
            forked_launcher=None if self.zygote is None else self.zygote.launcher_of,
        )

    def _forked(self, plan: LaunchPlan) -> None:
        """Where no standby waits (the job's first attempt, or an attempt that failed before
        every rank ran), make ``plan``'s launcher a standby forked from the zygote, in the
        attempt's own group, when the zygote may fork on this node: the launcher waits for the
        zygote's imports, which the ranks wait for anyway, instead of importing torch itself
        (seconds of a core per start, and that much memory). A zygote that refuses leaves the
        launcher cold, as without it."""
        assert self.standby is not None
        zygote = self._forking_zygote(importing_too=True)
        if self.standby.waiting() or zygote is None:
            return
        env = zygote.environment(plan.env, plan.nproc_per_node)
        self.standby.prepare(plan, zygote=zygote.name, env=env, cgroup=plan.cgroup)

    def warm_up(self, plan: LaunchPlan) -> None:
        """Every rank of ``plan`` runs: prepare the next attempt's launcher meanwhile (forked
        from the zygote, which imported torchrun already, when torchrun runs on the zygote's
        interpreter)."""
        if self.standby is None:
            return
        zygote = self._forking_zygote()
        if zygote is not None:
            env = zygote.environment(plan.env, plan.nproc_per_node)
            self.standby.prepare(plan, zygote=zygote.name, env=env, cgroup=self._next_group)
        else:
            self.standby.prepare(plan, cgroup=self._next_group)

    def _forking_zygote(self, *, importing_too: bool = False) -> Zygote | None:
        """The zygote a launcher may be forked from: it runs torchrun's interpreter and forks
        (:meth:`Zygote.forks`); None otherwise."""
        zygote, python = self.zygote, self.torchrun.python
        if zygote is None or python is None or not same_interpreter(python, zygote.python):
            return None
        return zygote if zygote.forks(importing_too=importing_too) else None

    @property
    def _next_group(self) -> str | None:
        """The group of the attempt after the last one planned (a standby is for it)."""
        return None if self.groups is None else self.groups.attempt(self._planned + 1)

    def close(self) -> TeardownReport | None:
        """End what the job keeps between attempts (the standby, the zygote), then, with
        cgroups, everything still in the job's groups; what that teardown found (None: there
        was nothing to look in)."""
        if self._port is not None:
            self._port.close()
        if self.standby is not None:
            self.standby.close()
        if self.zygote is not None:
            self.zygote.close()
        if self.alloc is not None and self.multi_node:
            nodes = tuple(n for n in self.alloc.nodes if n not in self.lost_nodes)
            self._sweep(dataclasses.replace(self.alloc, nodes=nodes), self.cfg.job.name)
            self.alloc = None  # swept once
        groups, self.groups = self.groups, None
        if groups is None:
            return None
        return end_group(groups.group())


def sweep_nodes(
    alloc: Allocation, job_name: str, *, snapshots: Path | None = None, timeout_s: float = 30.0
) -> None:
    """At the end of a multi-node job, on every node: what the attempts' node wrappers
    (``worker_sdk.spawn.node_group``) could not end, because srun's teardown SIGKILLed them with
    their torchrun, is ended (one short step of a wrapper: it ends the groups of wrappers that
    are gone before it runs its command), and the node's copies of the job's memory snapshots
    under ``snapshots`` go (``worker_sdk.spawn.sweep_snapshots``)."""
    command = ["true"]
    if snapshots is not None:
        command = [sys.executable, "-m", "worker_sdk.spawn.sweep_snapshots", str(snapshots)]
    inner = [sys.executable, "-m", "worker_sdk.spawn.node_group", "0", *command]
    argv = srun_argv(alloc, inner, job_name=f"{job_name}-sweep")
    with contextlib.suppress(OSError, subprocess.TimeoutExpired):
        subprocess.run(
            argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout_s, check=False
        )


def _script_folder(cfg: JobConfig) -> str | None:
    """The folder of the job's script (``python [-u] script.py``): where ``preload`` modules
    are imported from, as the script itself would."""
    args = [a for a in cfg.job.command[1:] if a != "-u"]
    if not args or args[0].startswith("-"):
        return None
    return os.path.dirname(os.path.realpath(os.path.join(cfg.job.workdir, args[0])))


class PortHold:
    """A TCP port kept free for torchrun's rendezvous store until :meth:`close`.

    A socket bound to a port the kernel picks, with ``SO_REUSEADDR`` and never listening: no
    other process gets that port (as its ephemeral port, or by a bind without
    ``SO_REUSEADDR``), while the attempt's TCPStore, which sets ``SO_REUSEADDR`` (both of its
    backends do), binds and listens on it. Picking a free port and closing it at once would
    leave a moment in which another process could take it and fail the attempt."""

    def __init__(self) -> None:
        self._socket = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._socket.bind(("", 0))
        self.port = int(self._socket.getsockname()[1])

    def close(self) -> None:
        self._socket.close()
