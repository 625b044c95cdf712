"""Losing a node of the Slurm test cluster: every process on it killed at once (slurmd too, like a
crashed machine) while a job runs, and the node brought back afterwards."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Callable
from typing import Final

from supervisor.slurm import commands as slurm
from supervisor.slurm import lost
from tests.slurm.cluster import SlurmCluster
from tests.slurm.jobs import TrainerJob, ranks_past, wait_until

__all__ = ["bring_back", "kill_node_during", "node_state", "run_to_end"]

START_S: Final = 90.0  # a 2-node job's start: scheduling, 6 Python processes importing torch
END_S: Final = 120.0  # from the kill to the job leaving the queue


def run_to_end(cluster: SlurmCluster, job: TrainerJob, job_id: str, timeout: float) -> None:
    """Wait for the job to leave the queue; past ``timeout`` cancel it and fail with its output."""
    try:
        cluster.wait_gone(job_id, timeout=timeout)
    except TimeoutError:
        cluster.scancel(job_id)
        cluster.wait_gone(job_id, timeout=60)
        raise AssertionError(f"job {job_id} did not end:\n{job.output_text()[-3000:]}") from None


def node_state(cluster: SlurmCluster, node: str) -> str:
    """The controller's State= of the node ("IDLE", "DOWN+NOT_RESPONDING", ...)."""
    out = cluster.run("scontrol", "show", "node", node, check=False).stdout
    return next((w.partition("=")[2] for w in out.split() if w.startswith("State=")), "")


def bring_back(cluster: SlurmCluster, node: str) -> None:
    """Start the slurmd of a node whose processes were all killed, the way testbed/up.sh does,
    wait until the node is idle (ReturnToService=2 returns a node that was set down) and run a
    step on every node. (sinfo may go on calling it "mixed" for a while: Slurm 22.05 does so
    after a node was set down while a job was completing on it.)"""
    index = cluster.node_names.index(node) + 1
    resolv = cluster.base_dir / "conf" / "resolv.conf.nodes"
    subprocess.run(
        [
            "nsenter",
            f"--net=/run/netns/rvsns{index}",
            "unshare",
            "--uts",
            "--mount",
            "--propagation",
            "private",
            "--",
            "sh",
            "-c",
            (
                f"mount --bind '{resolv}' /etc/resolv.conf && hostname {node} "
                f"&& exec /usr/sbin/slurmd -N {node}"
            ),
        ],
        env=cluster.env,
        check=True,
        timeout=30,
    )
    seen: list[str] = []

    def idle() -> bool:
        seen.append(node_state(cluster, node))
        return seen[-1] == "IDLE"

    try:
        wait_until(idle, timeout=60, what=f"{node} idle")
    except AssertionError as error:
        raise AssertionError(f"{error}; it was {sorted(set(seen))}") from None
    nodes = len(cluster.node_names)
    cluster.run("srun", f"--nodes={nodes}", f"--ntasks={nodes}", "true", timeout=60)


def kill_node_during(
    cluster: SlurmCluster,
    job: TrainerJob,
    job_id: str,
    node: str,
    *,
    probe: slurm.Allocation,
    past: int = 12,
    before_kill: Callable[[], None] | None = None,
) -> tuple[float, dict[str, str], dict[str, str], float]:
    """SIGKILL every process of ``node`` (slurmd, the step, torchrun, the ranks: a crashed node)
    once the job's 4 ranks are past step ``past`` (``before_kill`` called just before), wait
    until rvsup has ended, and bring the node back (also on failure). Returns the seconds from
    the kill to rvsup's end, what lost.lost_nodes(probe) said just before and just after the
    kill, and how long it took to say it after."""
    killed = ended = False
    try:
        wait_until(lambda: ranks_past(job, past), timeout=START_S, what=f"4 ranks at {past}")
        before = lost.lost_nodes(probe)
        if before_kill is not None:
            before_kill()
        for pid in cluster.node_processes(node):
            os.kill(pid, signal.SIGKILL)
        killed = True
        killed_t = time.monotonic()
        probe_t = time.monotonic()
        after = lost.lost_nodes(probe)
        after_s = time.monotonic() - probe_t
        wait_until(
            lambda: job.named("job_gave_up") or job.named("job_succeeded"),
            timeout=END_S,
            what="rvsup to end",
        )
        ended = True
        return time.monotonic() - killed_t, before, after, after_s
    finally:
        if not ended:
            cluster.scancel(job_id)
        if killed:
            # a job without --no-kill ends once the controller has set the node down for not
            # answering (SlurmdTimeout, 30 s); a slurmd back before that would leave it completing
            with contextlib.suppress(TimeoutError):
                cluster.wait_gone(job_id, timeout=90)
            bring_back(cluster, node)
        run_to_end(cluster, job, job_id, timeout=END_S)
