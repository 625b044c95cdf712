"""Running a health round: the probe on every node, its lines judged by the pure rules.

:class:`HealthChecks` runs :mod:`supervisor.process.health_probe` on the nodes given: as one
Slurm step of one task per node (``srun``, as the launcher starts torchrun) when the job runs
on several nodes, else in this process (a thread: no interpreter to start). What the job needs
(:class:`supervisor.rules.health.Needs`) is derived here from ``[health]``, the allocation and
the newest checkpoint's size on disk; :func:`supervisor.rules.health.judge_round` decides.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from supervisor.config.model import JobConfig
from supervisor.process import health_probe
from supervisor.rules.health import Needs, Probe, Verdict, judge_round, parse_probe
from supervisor.slurm.commands import Allocation
from supervisor.slurm.srun import srun_argv
from worker_sdk.contract.protocol import node_name

__all__ = ["HealthChecks", "directory_size", "needs_of"]

#: How much longer than the command's timeout a round may take (srun's start, the other
#: checks, nvidia-smi) before it is abandoned and its silent nodes count as unhealthy.
ROUND_MARGIN_S = 60.0


def directory_size(path: Path | None) -> int:
    """Bytes of the files under ``path`` (0 for None or what cannot be read)."""
    if path is None:
        return 0
    total = 0
    for folder, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(folder, name)).st_size
            except OSError:
                continue
    return total


def needs_of(cfg: JobConfig, alloc: Allocation | None, nnodes: int, newest_bytes: int) -> Needs:
    """What every node must offer, ``"auto"`` resolved (see ``[health]``'s keys)."""
    health = cfg.health
    why: dict[str, str] = {}
    shm = health.shm_free
    if shm is None:
        if cfg.checkpoint.async_save:
            shm = newest_bytes // max(nnodes, 1)
        elif cfg.checkpoint.memory_every_steps == 0:
            why["shm"] = (
                "checkpoint.async and the memory tier are off: nothing is staged in /dev/shm"
            )
        else:
            why["shm"] = (
                "checkpoint.async is off; the memory tier checks its own room in "
                f"{cfg.checkpoint.memory_dir} (it turns itself off where there is none)"
            )
    gpus = health.gpus
    if gpus is None:
        gpus = alloc.gpus_per_node if alloc is not None and alloc.gpus_per_node else None
        if gpus is None:
            why["gpus"] = "the job asked Slurm for no GPUs (set health.gpus to check a count)"
    elif gpus == 0:
        gpus = None
        why["gpus"] = "health.gpus = 0"
    checkpoint = newest_bytes if health.checkpoint_free is None else health.checkpoint_free
    return Needs(checkpoint, shm, health.memory_free, gpus, why)


class HealthChecks:
    """Health rounds of one ``rvsup start`` (see the module docstring)."""

    def __init__(self, cfg: JobConfig, alloc: Allocation | None) -> None:
        self.cfg = cfg
        self.alloc = alloc

    def this_node(self) -> str:
        """The name a probe in this process reports."""
        if self.alloc is not None:
            return self.alloc.this_node
        return node_name(os.environ.get("SLURMD_NODENAME"), socket.gethostname())

    async def check(self, nodes: tuple[str, ...], newest: Path | None) -> list[Verdict]:
        """Every node's verdict, in ``nodes`` order (``nodes``: where the job may run next)."""
        needs = needs_of(self.cfg, self.alloc, len(nodes), directory_size(newest))
        spec = {
            "checkpoint_dir": str(self.cfg.job.checkpoint_dir),
            "command": list(self.cfg.health.command),
            "timeout_s": self.cfg.health.timeout_s,
            "cwd": str(self.cfg.job.workdir),
        }
        if self.alloc is None or nodes == (self.alloc.this_node,):
            probe = await asyncio.to_thread(health_probe.measure, spec)
            parsed = parse_probe(json.dumps(probe))
            probes = [] if parsed is None else [parsed]
            return judge_round(nodes or (self.this_node(),), probes, needs)
        probes, trouble = await asyncio.to_thread(self._on_nodes, nodes, spec)
        return judge_round(nodes, probes, needs, trouble)

    def _on_nodes(self, nodes: tuple[str, ...], spec: dict[str, object]) -> tuple[list[Probe], str]:
        assert self.alloc is not None
        inner = [sys.executable, "-m", "supervisor.process.health_probe", json.dumps(spec)]
        alloc = dataclasses.replace(self.alloc, nodes=nodes)
        argv = srun_argv(
            alloc, inner, job_name=f"{self.cfg.job.name}-health", kill_on_bad_exit=False
        )
        try:
            done = subprocess.run(
                argv,
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                timeout=self.cfg.health.timeout_s + ROUND_MARGIN_S,
                check=False,
            )
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else ""
            return _parsed(out), "the round did not end in time"
        except OSError as exc:
            return [], f"srun could not be started: {exc}"
        return _parsed(done.stdout), done.stderr


def _parsed(stdout: str) -> list[Probe]:
    probes = (parse_probe(line) for line in stdout.splitlines() if line.strip())
    return [probe for probe in probes if probe is not None]
