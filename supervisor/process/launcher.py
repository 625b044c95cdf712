"""Builds the torchrun (or srun + torchrun) command line and environment of one attempt, and starts it.

torchrun is started in a session of its own with the parent-death signal armed (SIGKILL when the
supervisor dies), and it runs every rank through ``worker_sdk.spawn.bootstrap``, which arms the same
signal before exec'ing the user's command: killing the supervisor with SIGKILL takes the whole tree
with it. torchrun never restarts anything itself (``--max-restarts=0``): the supervisor decides.

torchrun comes from the job's environment, not rvsup's (which may have no torch at all): see
:func:`resolve_torchrun`. The bootstrap runs on rvsup's own interpreter (it imports nothing but the
standard library); the warm standby, which imports torchrun ahead of time, on the job's.
"""

from __future__ import annotations

import contextlib
import glob
import importlib.util
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.config.load import JobConfig
from supervisor.config.torchrun import Torchrun, resolve_torchrun
from supervisor.process.cgroup import Group
from supervisor.record import rundir
from worker_sdk.contract import protocol as p

if TYPE_CHECKING:
    from supervisor.slurm.commands import Allocation


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything needed to start one attempt."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    cwd: Path
    log_dir: Path
    nnodes: int
    nproc_per_node: int
    alloc: Allocation | None = None  # the Slurm allocation a multi-node attempt runs on
    forked: bool = False  # the ranks are forked from the node's zygote (their clients report)
    cgroup: str | None = None  # the attempt's cgroup (v2) directory; None: no cgroup is used


__all__ = [
    "LOCALHOST",
    "LaunchPlan",
    "Standby",
    "Torchrun",
    "build_plan",
    "nodes_needed",
    "rank_environment",
    "resolve_sizes",
    "resolve_torchrun",
    "spawn",
    "standby_argv",
    "stderr_tail",
    "visible_gpus",
]


LOCALHOST = "localhost"  # MASTER_ADDR of single-node attempts, as torchrun --standalone gives it


def _as_torchrun(torchrun: Torchrun | str) -> Torchrun:
    """A :class:`Torchrun`; a bare path is the old form (one program, standby on rvsup's Python)."""
    if isinstance(torchrun, Torchrun):
        return torchrun
    return Torchrun((torchrun,), sys.executable, "given")


def visible_gpus(env: Mapping[str, str]) -> int:
    """GPUs this node exposes, without importing torch (0 when none)."""
    cvd = env.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        return len([d for d in cvd.split(",") if d.strip() and d.strip() != "-1"])
    return len(glob.glob("/proc/driver/nvidia/gpus/*"))


def nodes_needed(cfg: JobConfig, alloc: Allocation | None) -> int:
    """Nodes every attempt runs on: ``launch.nnodes``, else all of the allocation's, else 1."""
    return cfg.launch.nnodes or (len(alloc.nodes) if alloc is not None else 1)


def resolve_sizes(
    cfg: JobConfig, alloc: Allocation | None, env: Mapping[str, str]
) -> tuple[int, int]:
    """(nnodes, nproc_per_node) with "auto" resolved from the allocation and the GPUs visible."""
    nnodes = nodes_needed(cfg, alloc)
    if alloc is not None:  # after a node failure the allocation may have fewer nodes left
        nnodes = min(nnodes, len(alloc.nodes))
    nproc = cfg.launch.nproc_per_node
    if nproc is None:
        gpus = visible_gpus(env) or (alloc.gpus_per_node or 0 if alloc is not None else 0)
        nproc = gpus or 1
    return nnodes, nproc


def build_plan(
    cfg: JobConfig,
    *,
    attempt: int,
    torchrun: Torchrun | str,
    rank_env: Mapping[str, str],
    alloc: Allocation | None = None,
    rdzv_port: int = 29400,
    base_env: Mapping[str, str] | None = None,
    zygote: str | None = None,
    cgroup: str | None = None,
    withheld_env: Collection[str] = (),
) -> LaunchPlan:
    """The command line and environment of attempt ``attempt``; ``torchrun`` is the job's
    (:func:`resolve_torchrun`). ``zygote``: the name of the zygote the ranks are forked from
    (each node's, on several). ``cgroup``: the directory of the attempt's cgroup, not made
    yet (:func:`spawn` makes it). ``withheld_env``: variables of ``base_env`` the children must
    not inherit (the daemon's service manager's: torchrun must not talk to systemd in its name)."""
    env = dict(os.environ if base_env is None else base_env)
    for name in withheld_env:
        env.pop(name, None)
    env.update(cfg.job.env)
    env.update(rank_env)
    env.setdefault("PYTHONUNBUFFERED", "1")
    if not any(name in env for name in p.FLIGHT_RECORDER_ENV):
        # c10d records collectives (gloo too): a hang's diagnostics get the flight recorders
        env[p.FLIGHT_RECORDER_ENV[0]] = str(p.FLIGHT_RECORDER_ENTRIES)
    nnodes, nproc = resolve_sizes(cfg, alloc, env)
    log_dir = rundir.logs_dir(cfg.job.run_dir, attempt)
    tr = [
        *_as_torchrun(torchrun).argv,
        f"--nproc-per-node={nproc}",
        "--max-restarts=0",
        "--monitor-interval=0.5",
    ]
    if nnodes == 1:
        # a static rendezvous on a port the supervisor holds for the attempt: --standalone's c10d
        # rendezvous waits a random 0-0.3 s before it joins and costs ~0.2 s more in all
        tr += [
            "--rdzv-backend=static",
            f"--master-addr={LOCALHOST}",
            f"--master-port={rdzv_port}",
            f"--rdzv-id={cfg.job.name}-{attempt}",
        ]
    else:
        assert alloc is not None, "several nodes need a Slurm allocation"
        env[p.ENV_REPORT_EXIT] = "1"  # ranks on other nodes: their exits come as messages
        tr += [
            f"--nnodes={nnodes}",
            "--rdzv-backend=c10d",
            f"--rdzv-endpoint={alloc.nodes[0]}:{rdzv_port}",
            f"--rdzv-id={cfg.job.name}-{attempt}",
        ]
    tr += [f"--log-dir={log_dir}", "--redirects=3", "--tee=3", *cfg.launch.torchrun_args]
    forked = zygote is not None
    if forked:
        env[p.ENV_REPORT_EXIT] = "1"  # the zygote is the rank's parent: its client reports
    via = ["--zygote", zygote] if zygote is not None else []
    tr += [
        "--no-python",
        sys.executable,
        "-m",
        "worker_sdk.spawn.bootstrap",
        *via,
        *cfg.job.command,
    ]
    argv = tr
    if nnodes > 1 and alloc is not None:
        from supervisor.slurm.commands import srun_argv

        # on every node, torchrun and all it starts in a group of their own, ended with it
        node = [
            sys.executable,
            "-m",
            "worker_sdk.spawn.node_group",
            repr(cfg.launch.term_timeout_s),
        ]
        argv = srun_argv(alloc, [*node, *tr], job_name=cfg.job.name)
    multi = alloc if nnodes > 1 else None
    return LaunchPlan(
        tuple(argv), env, cfg.job.workdir, log_dir, nnodes, nproc, multi, forked, cgroup
    )


def rank_environment(
    cfg: JobConfig,
    *,
    attempt: int,
    endpoint: str,
    secret_file: Path,
    diagnostics_dir: Path,
    last_failure: str | None,
    oom_count: int,
    restarts_used: int,
    resume_at: int | None = None,
    resume_before: int | None = None,
) -> dict[str, str]:
    """The RVSUP_* variables every rank sees (the contract in worker_sdk.contract.protocol); after a
    rollback, the step to start at the earliest and the first checkpoint step not to load."""
    ck = cfg.checkpoint
    env = {
        p.ENV_ENDPOINT: endpoint,
        p.ENV_SECRET_FILE: str(secret_file),
        p.ENV_JOB: cfg.job.name,
        p.ENV_ATTEMPT: str(attempt),
        p.ENV_RUN_DIR: str(cfg.job.run_dir),
        p.ENV_CHECKPOINT_DIR: str(cfg.job.checkpoint_dir),
        p.ENV_CKPT_EVERY_STEPS: str(ck.every_steps),
        p.ENV_KEEP_LAST: str(ck.keep_last),
        p.ENV_CKPT_ASYNC: "1" if ck.async_save else "0",
        p.ENV_HEARTBEAT_INTERVAL: repr(cfg.heartbeat.interval_s),
        p.ENV_DIAGNOSTICS_DIR: str(diagnostics_dir),
        p.ENV_DUMP_SIGNAL: str(int(signal.SIGUSR2)),
        p.ENV_OOM_COUNT: str(oom_count),
        p.ENV_RESTART_COUNT: str(restarts_used),
        p.ENV_VERIFY_EVERY: str(cfg.anomaly.verify_every_steps),
    }
    if last_failure:
        env[p.ENV_LAST_FAILURE] = last_failure
    if resume_at is not None:
        env[p.ENV_RESUME_AT] = str(resume_at)
    if resume_before is not None:
        env[p.ENV_RESUME_BEFORE] = str(resume_before)
    return env


def spawn(plan: LaunchPlan) -> subprocess.Popen[bytes]:
    """Start the attempt in a new session (in its own cgroup, where it has one), through the
    bootstrap so that it dies with us.

    Call it from the supervisor's main thread: the parent-death signal fires when the thread that
    forked the child exits.
    """
    plan.log_dir.mkdir(parents=True, exist_ok=True)
    if plan.cgroup is not None:
        os.makedirs(plan.cgroup, exist_ok=True)
    return _bootstrapped(plan.argv, plan, stdin=subprocess.DEVNULL, cgroup=plan.cgroup)


def _bootstrapped(
    argv: Sequence[str],
    plan: LaunchPlan,
    *,
    stdin: int,
    env: Mapping[str, str] | None = None,
    cgroup: str | None = None,
) -> subprocess.Popen[bytes]:
    """``argv`` run through the bootstrap in a session of its own (and the cgroup ``cgroup``,
    which it joins before anything else), with ``plan``'s cwd and env (or ``env``)."""
    into = ["--cgroup", cgroup] if cgroup is not None else []
    return subprocess.Popen(
        [sys.executable, "-m", "worker_sdk.spawn.bootstrap", *into, *argv],
        env=dict(plan.env if env is None else env),
        cwd=plan.cwd,
        stdin=stdin,
        start_new_session=True,
        close_fds=True,
    )


def spawn_module_file(name: str) -> str:
    """The file of ``worker_sdk.spawn.<name>``, found without importing (executing) it."""
    spec = importlib.util.find_spec(f"worker_sdk.spawn.{name}")
    if spec is None or spec.origin is None:  # pragma: no cover - installed with the daemon
        raise ImportError(f"worker_sdk.spawn.{name} is missing from rvsup's installation")
    return str(Path(spec.origin).resolve())


# Runs rvsup's own copy of worker_sdk/spawn/standby.py on the job's interpreter, by path: the job's
# environment need not have worker_sdk, nor the same version of it. sys.path loses "" (the cwd),
# as when the torchrun script runs. The first line names the module for people and tools (ps).
_STANDBY_CODE = (
    "# worker_sdk.spawn.standby: rvsup's warm standby launcher\n"
    "import runpy, sys\n"
    "if sys.path and not sys.path[0]:\n"
    "    del sys.path[0]\n"
    "runpy.run_path(sys.argv.pop(1), run_name='__main__')\n"
)


def _standby_script() -> str:
    return spawn_module_file("standby")


def standby_argv(python: str) -> tuple[str, ...]:
    """The command line of a warm standby started cold on the job's interpreter ``python``."""
    return (python, "-c", _STANDBY_CODE, _standby_script())


class Standby:
    """A warm torchrun for the next single-node attempt (``worker_sdk.spawn.standby``).

    :meth:`prepare` starts one in the background while an attempt runs, on the job's interpreter
    (``torchrun.python``; none when that is unknown); :meth:`spawn` hands the next attempt's
    command line to it when it is alive and the attempt is a plain single-node torchrun, and
    otherwise starts a fresh launcher like :func:`spawn`. Only the daemon's main thread may call
    these (the parent-death signal is tied to the thread that forked).

    With cgroups the standby waits in a group of its own (``cgroup`` of :meth:`prepare`), and
    its processes are moved into the attempt's group before it is given the attempt's command
    line: it and everything it starts are the attempt's, and nothing of the attempt ran before.
    """

    def __init__(self, torchrun: Torchrun | str) -> None:
        self.torchrun = _as_torchrun(torchrun)
        self._proc: subprocess.Popen[bytes] | None = None
        self._cgroup: str | None = None

    def prepare(
        self,
        plan: LaunchPlan,
        *,
        zygote: str | None = None,
        env: Mapping[str, str] | None = None,
        cgroup: Callable[[], str] | None = None,
    ) -> None:
        """Start a standby for attempts like ``plan`` unless one is waiting already: forked
        from the zygote ``zygote`` (ready in milliseconds, and no import competes with the
        training for the CPU) with ``env`` as its environment (the zygote's, where imports
        care; its torchrun gets the next attempt's), else started cold. A zygote that refuses
        leaves it cold too. ``cgroup`` makes the group it waits in."""
        python = self.torchrun.python
        if python is None or plan.alloc is not None:
            return
        if self._proc is not None and self._proc.poll() is None:
            return
        argv = standby_argv(python)
        if zygote is not None:
            argv = ("--zygote", zygote, python, _standby_script())
        self._cgroup = cgroup() if cgroup is not None and plan.cgroup is not None else None
        self._proc = _bootstrapped(argv, plan, stdin=subprocess.PIPE, env=env, cgroup=self._cgroup)

    def spawn(self, plan: LaunchPlan) -> subprocess.Popen[bytes]:
        """The attempt's launcher: the standby given ``plan``'s command line, or a fresh one."""
        proc, self._proc = self._proc, None
        group, self._cgroup = self._cgroup, None
        prefix = self.torchrun.argv
        usable = plan.alloc is None and plan.argv[: len(prefix)] == prefix
        if (plan.cgroup is None) != (group is None):
            usable = False
        elif plan.cgroup is not None and group is not None and usable:
            try:
                Group(Path(plan.cgroup)).take_from(Group(Path(group)))
            except OSError:
                usable = False
            else:
                group = None
        if proc is not None and usable and proc.poll() is None and proc.stdin is not None:
            plan.log_dir.mkdir(parents=True, exist_ok=True)
            args = list(plan.argv[len(prefix) :])
            order = {"args": args, "env": dict(plan.env), "cwd": str(plan.cwd)}
            try:
                proc.stdin.write(json.dumps(order).encode() + b"\n")
                proc.stdin.close()
            except OSError:  # it died meanwhile
                pass
            else:
                return proc
        if proc is not None:
            _dismiss(proc, group)
        return spawn(plan)

    def close(self) -> None:
        """Dismiss a waiting standby (it exits at the end of its input) and reap it."""
        proc, self._proc = self._proc, None
        group, self._cgroup = self._cgroup, None
        if proc is not None:
            _dismiss(proc, group)


def _dismiss(proc: subprocess.Popen[bytes], group: str | None) -> None:
    """Kill and reap an unused standby (it holds nothing but its imports), and its group's
    members (a standby forked from the zygote is not our child)."""
    proc.kill()
    proc.wait()
    if proc.stdin is not None:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    if group is not None:
        Group(Path(group)).end()


def stderr_tail(log_dir: Path, *, max_bytes: int = 8192, local_rank: int | None = None) -> str:
    """The end of every rank's stderr log of an attempt (OOM evidence when the SDK could not say),
    or of one local rank's."""
    pattern = "**/stderr.log" if local_rank is None else f"**/attempt_*/{local_rank}/stderr.log"
    parts: list[str] = []
    for path in sorted(log_dir.glob(pattern)):
        try:
            with open(path, "rb") as f:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                f.seek(max(0, size - max_bytes))
                parts.append(f.read().decode(errors="replace"))
        except OSError:
            continue
    return "\n".join(parts)
