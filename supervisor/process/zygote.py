"""The node's zygote, seen from the supervisor: start it, hand its name to the ranks, hear it.

The zygote (``worker_sdk/spawn/zygote.py``) runs on the job's interpreter with the job's environment,
imports torch once, and forks every rank of every attempt on request (see that module). The
supervisor starts it at the job's first attempt, forks that attempt's torchrun from it too
(a standby, :mod:`supervisor.process.launcher`, on one node), and keeps it for the whole job:
a restart then costs little more than the process group's set-up and the checkpoint's load.
The ranks' command line names it (``worker_sdk.spawn.bootstrap --zygote NAME``); every rank is
reported by its client when it ends (``RVSUP_REPORT_EXIT``), since the zygote, not torchrun, is
the rank's parent. It says which launcher it forked for which client (``forked``), so that the
teardown spares and stops that torchrun, not only its client.

A multi-node job gets one on every node, as a Slurm step of its own (:class:`Zygote`): the
ranks' clients in each attempt's step find their node's zygote under the same name.

What it says on its standard output (``listening``, ``ready``, ``unsafe``, ``refused``, and a
node's ``gone``) becomes ``cold_start`` events; a zygote that died is started again for the
next attempt. Only the daemon's main thread may start one (the parent-death signal is tied to
the thread that forked).
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import select
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from supervisor.process.launcher import bootstrap, spawn_module_file
from supervisor.record.schema import ColdStart
from supervisor.slurm.commands import Allocation
from supervisor.slurm.srun import srun_argv

__all__ = ["DEFAULT_PRELOAD", "Zygote", "zygote_argv", "zygote_step_argv"]

#: What every rank imports, what DDP imports when it is constructed, and torchrun (30 ms more:
#: the warm standby launcher is forked from the zygote too).
DEFAULT_PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.nn.parallel",
    "torch._dynamo",
    "torch.distributed.run",
)
#: Imported when the job's environment has it: the SDK (and ZeroMQ with it).
OPTIONAL_PRELOAD = ("worker_sdk",)
_LISTEN_WAIT_S = 5.0
_STEP_WAIT_S = 15.0  # srun starts a step on every node first
_CMDLINE_ROOM = 4096

# Runs rvsup's own copy of worker_sdk/spawn/zygote.py on the job's interpreter, by path, under a
# module name of its own: the job's environment need not have worker_sdk. sys.path loses ""
# (the cwd) as a script's would; the first line names the process for people and ps.
_ZYGOTE_CODE = (
    "# worker_sdk.spawn.zygote: rvsup's zygote, forks the ranks\n"
    "import importlib.util, sys\n"
    "if sys.path and not sys.path[0]:\n"
    "    del sys.path[0]\n"
    "spec = importlib.util.spec_from_file_location('_rvsup_zygote', sys.argv[1])\n"
    "zygote = importlib.util.module_from_spec(spec)\n"
    "sys.modules[spec.name] = zygote\n"
    "spec.loader.exec_module(zygote)\n"
    "sys.exit(zygote.main(sys.argv[2:]))\n"
)


def zygote_argv(
    python: str, name: str, preload: Sequence[str], *, path: str | None = None
) -> tuple[str, ...]:
    """The zygote's command line on the job's interpreter ``python``."""
    argv = [python, "-c", _ZYGOTE_CODE, spawn_module_file("zygote")]
    argv += ["--socket", name, "--preload", ",".join(preload)]
    argv += ["--optional", ",".join(OPTIONAL_PRELOAD)]
    if path:
        argv += ["--path", path]
    argv += ["--room", " " * _CMDLINE_ROOM]  # forked ranks write their command lines over it
    return tuple(argv)


class Zygote:
    """The zygote of this node, or of every node of a multi-node job, for one ``rvsup start``.

    On one node it is the supervisor's child. On several it runs as a job step of its own
    (``srun``, one task per node, :func:`zygote_step_argv`) beside the attempts' steps, for as
    long as the nodes stay the same: the ranks it forks live in that step, inside Slurm's
    cgroup, accounting and resource binding, and the attempts' steps hold only torchrun and
    the ranks' clients. A node whose zygote ended says so (``worker_sdk.spawn.zygote_watch``), and
    the step is started again before the next attempt.
    """

    def __init__(
        self,
        python: str,
        preload: Sequence[str],
        *,
        path: str | None = None,
        defaults: Sequence[str] = DEFAULT_PRELOAD,
        step_name: str = "rvsup-zygote",
    ) -> None:
        self.python = python
        self.preload = (*defaults, *(m for m in preload if m not in defaults))
        self.path = path
        self.step_name = step_name
        self.name = ""
        self._proc: subprocess.Popen[bytes] | None = None
        self._nodes: tuple[str, ...] = ()  # the step's nodes; () on one node
        self._buffer = b""
        self._listening: set[str] = set()
        self._lost_nodes: set[str] = set()
        self._said: list[ColdStart] = []
        self._gone_reported = False
        self._unsafe = False  # it said its imports were unsafe: every fork is refused
        self._launchers: dict[int, int] = {}  # a launcher's client's pid -> the launcher's
        self.ready_s: float | None = None
        """Its imports' duration once it said it is ready to fork ranks (the slowest node's)."""

    def ensure(
        self,
        env: Mapping[str, str],
        cwd: Path,
        nproc: int,
        alloc: Allocation | None = None,
        *,
        cgroup: str | None = None,
    ) -> None:
        """Start it unless it runs (on ``alloc``'s nodes when given: a multi-node attempt's);
        ``env`` is the attempt's (torchrun's import-time additions are made here, so that its
        ranks' environment matches the zygote's). ``cgroup``: the group it is placed in (it
        places the ranks it forks into their clients')."""
        nodes = alloc.nodes if alloc is not None else ()
        self._pump()
        if self.alive() and nodes == self._nodes:
            return
        self._said += self._death()
        self._reap()
        self.name = f"rvsup-zygote-{os.getpid()}-{secrets.token_hex(6)}"
        zenv = {k: v for k, v in self.environment(env, nproc).items() if not k.startswith("RVSUP_")}
        argv = zygote_argv(self.python, self.name, self.preload, path=self.path)
        if alloc is not None:
            argv = tuple(zygote_step_argv(alloc, argv, step_name=self.step_name))
        self._proc = bootstrap(
            argv, env=zenv, cwd=cwd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cgroup=cgroup
        )
        assert self._proc.stdout is not None
        os.set_blocking(self._proc.stdout.fileno(), False)
        self._nodes = nodes
        self._buffer = b""
        self._listening.clear()
        self._lost_nodes.clear()
        self._gone_reported = False
        self._unsafe = False
        self._launchers.clear()
        self.ready_s = None
        self._wait_listening(max(1, len(nodes)), _LISTEN_WAIT_S if alloc is None else _STEP_WAIT_S)

    def _wait_listening(self, count: int, wait_s: float) -> None:
        """Until ``count`` nodes said their socket listens (it binds before importing: ~0.1 s
        after its start), so that the first ranks find it; not longer than ``wait_s`` nor past
        its death. Ranks that find none start cold."""
        proc = self._proc
        assert proc is not None
        assert proc.stdout is not None
        deadline = time.monotonic() + wait_s
        while len(self._listening) < count and proc.poll() is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            select.select([proc.stdout], [], [], left)
            self._pump()

    @staticmethod
    def environment(env: Mapping[str, str], nproc: int) -> dict[str, str]:
        """The attempt's environment ``env`` as torchrun gives it to each of ``nproc`` ranks,
        where it matters to imports: what the zygote starts with."""
        out = dict(env)
        if nproc > 1:  # as torchrun sets it for every rank when the user did not
            out.setdefault("OMP_NUM_THREADS", "1")
        return out

    def forks(self, *, importing_too: bool = False) -> bool:
        """It runs on this node alone and forks on request: it imported everything safely, or,
        with ``importing_too``, it may still be importing and has not said it cannot fork (a
        request made then waits until it is ready, or, refused, starts cold)."""
        self._pump()
        if not self.alive() or self._nodes:
            return False
        return not self._unsafe if importing_too else self.ready_s is not None

    def launcher_of(self, client: int) -> int | None:
        """The pid of the launcher (a warm standby) forked for the client ``client``, once
        the zygote said so; None: it forked none for it."""
        self._pump()
        return self._launchers.get(client)

    @property
    def pid(self) -> int | None:
        """The zygote's pid on one node; srun's on several."""
        return None if self._proc is None else self._proc.pid

    def alive(self) -> bool:
        """It runs, on every node of its step."""
        return self._proc is not None and self._proc.poll() is None and not self._lost_nodes

    def cold_starts(self) -> list[ColdStart]:
        """What it said since last asked, as events: ranks refused (and why), an unsafe import,
        its death (a node's, on several)."""
        self._pump()
        out, self._said = [*self._said, *self._death()], []
        return out

    def _death(self) -> list[ColdStart]:
        proc = self._proc
        if proc is None or proc.poll() is None or self._gone_reported:
            return []
        self._gone_reported = True
        rc = proc.returncode
        how = f"killed by signal {-rc}" if rc < 0 else f"exited with code {rc}"
        what = "the zygote" if not self._nodes else "the zygotes' step (srun)"
        return [ColdStart(ranks=(), reason=f"{what} {how}")]

    def _pump(self) -> None:
        """Take in what it said since."""
        for fact in self._read():
            node = str(fact.get("node", ""))
            if "listening" in fact:
                self._listening.add(node)
            elif "refused" in fact:
                rank = fact.get("rank")
                ranks = (rank,) if isinstance(rank, int) else ()
                self._said.append(ColdStart(ranks=ranks, reason=str(fact["refused"])))
            elif "unsafe" in fact:
                self._unsafe = True
                where = f" on {node}" if self._nodes and node else ""
                reason = f"zygote unsafe{where}: {fact['unsafe']}"
                self._said.append(ColdStart(ranks=(), reason=reason))
            elif "gone" in fact and self._nodes:  # a node's zygote, on several
                self._lost_nodes.add(node)
                self._said.append(
                    ColdStart(ranks=(), reason=f"the zygote on {node} {fact['gone']}")
                )
            elif isinstance(forked := fact.get("forked"), int) and isinstance(
                client := fact.get("client"), int
            ):
                self._launchers[client] = forked
            elif isinstance(fact.get("ready"), (int, float)):
                ready = float(fact["ready"])  # type: ignore[arg-type]
                self.ready_s = ready if self.ready_s is None else max(self.ready_s, ready)

    def _read(self) -> list[dict[str, object]]:
        proc = self._proc
        if proc is None or proc.stdout is None:
            return []
        with contextlib.suppress(BlockingIOError, OSError, ValueError):
            while chunk := os.read(proc.stdout.fileno(), 65536):
                self._buffer += chunk
        *lines, self._buffer = self._buffer.split(b"\n")
        facts = []
        for line in lines:
            with contextlib.suppress(ValueError):
                fact = json.loads(line)
                if isinstance(fact, dict):
                    facts.append(fact)
        return facts

    def close(self) -> None:
        """End it (its input closes; SIGKILL if it lingers) and reap it."""
        self._reap()

    def _reap(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            with contextlib.suppress(OSError):
                proc.stdin.close()
        try:
            proc.wait(timeout=0.0 if self._lost_nodes else 2.0)
        except subprocess.TimeoutExpired:
            proc.kill()  # srun: slurmstepd then kills the step's tasks on every node
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


def zygote_step_argv(alloc: Allocation, zygote: Sequence[str], *, step_name: str) -> list[str]:
    """The srun command that runs ``zygote`` (:func:`zygote_argv`) on every node of ``alloc``,
    each watched by ``worker_sdk.spawn.zygote_watch``, as a step of its own. Unlike an attempt's
    step, one node's zygote ending does not end the others."""
    inner = [sys.executable, "-m", "worker_sdk.spawn.zygote_watch", *zygote]
    return srun_argv(alloc, inner, job_name=step_name, kill_on_bad_exit=False)
