"""The torchrun (or srun + torchrun) command line and environment of one attempt: its
:class:`LaunchPlan` (:mod:`.launcher` starts it).

torchrun never restarts anything itself (``--max-restarts=0``): the supervisor decides. It runs
every rank through ``worker_sdk.spawn.bootstrap`` (rvsup's own interpreter; the bootstrap imports
nothing but the standard library), or forks it from the node's zygote. torchrun comes from the
job's environment, not rvsup's (which may have no torch at all): see
:func:`supervisor.config.torchrun.resolve_torchrun`.
"""

from __future__ import annotations

import glob
import os
import signal
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from supervisor.config.model import JobConfig
from supervisor.config.torchrun import Torchrun
from supervisor.record import rundir
from worker_sdk.contract import protocol as p

if TYPE_CHECKING:
    from supervisor.slurm.commands import Allocation

__all__ = [
    "LOCALHOST",
    "LaunchPlan",
    "as_torchrun",
    "build_plan",
    "nodes_needed",
    "rank_environment",
    "resolve_sizes",
    "visible_gpus",
]


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


LOCALHOST = "localhost"  # MASTER_ADDR of single-node attempts, as torchrun --standalone gives it


def as_torchrun(torchrun: Torchrun | str) -> Torchrun:
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
    (:func:`~supervisor.config.torchrun.resolve_torchrun`). ``zygote``: the name of the zygote
    the ranks are forked from (each node's, on several). ``cgroup``: the directory of the
    attempt's cgroup, not made yet (:func:`.launcher.spawn` makes it). ``withheld_env``:
    variables of ``base_env`` the children must not inherit (the daemon's service manager's:
    torchrun must not talk to systemd in its name)."""
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
        *as_torchrun(torchrun).argv,
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
        # static too: torchrun's c10d rendezvous keeps its state as a pickle in a store that
        # listens on every interface without credentials, and every agent unpickles it (code
        # of whoever writes that key would run in the job: docs/security.md). Each node's
        # rank is its SLURM_NODEID (alloc.nodes' order), set by its node wrapper.
        tr += [
            f"--nnodes={nnodes}",
            "--rdzv-backend=static",
            f"--master-addr={alloc.nodes[0]}",
            f"--master-port={rdzv_port}",
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
        from supervisor.slurm.srun import srun_argv

        # on every node, torchrun and all it starts in a group of their own, ended with it
        node = [
            sys.executable,
            "-m",
            "worker_sdk.spawn.node_group",
            repr(cfg.launch.term_timeout_s),
            "--agent",  # and the node's agent beside them (supervisor/agent/)
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
    checkpoint_dir_id: str | None = None,
) -> dict[str, str]:
    """The RVSUP_* variables every rank sees (the contract in worker_sdk.contract.protocol); after a
    rollback, the step to start at the earliest and the first checkpoint step not to load;
    ``checkpoint_dir_id``: the checkpoint directory's identity when the daemon started."""
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
    if checkpoint_dir_id is not None:
        env[p.ENV_CHECKPOINT_DIR_ID] = checkpoint_dir_id
    return env
