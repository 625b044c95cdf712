"""The Slurm allocation this process runs in, and the Slurm commands the supervisor uses.

- :func:`detect` reads the allocation from the environment Slurm gives a batch script (or a
  ``salloc`` shell, or an ``srun`` task): job id, node list, this node, tasks, GPUs and CPUs
  per node, how often the job was requeued.
- :func:`time_left_s`, :func:`job_info`, :func:`is_requeueable` and :func:`requeue` ask the
  controller (``squeue``, ``scontrol``). Every command runs as a subprocess with a timeout;
  failures that are transient (the controller is busy, restarting or unreachable, a socket
  timed out, or the command ran past its timeout) are retried with exponential back-off by
  tenacity, a few times; any other failure raises :class:`SlurmError` at once, with the
  command's stderr.
- :mod:`.srun` builds the one ``srun`` step that runs torchrun once on every node; see its
  docstring for each flag and for how to tear the step down. :func:`step_ids`,
  :func:`signal_step` and :func:`cancel_step` act on that step by its name.
- :mod:`.lost` says which nodes of the allocation are lost, and how that was established.
- The parsers of Slurm's notations and messages are in :mod:`supervisor.slurm.text`.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from tenacity import Retrying, retry_if_exception, stop_after_attempt, wait_exponential

from supervisor.slurm.text import expand_hostlist, parse_job_record, parse_time_left
from worker_sdk.contract import protocol as p

__all__ = [
    "Allocation",
    "SlurmError",
    "cancel_step",
    "detect",
    "is_requeueable",
    "job_info",
    "requeue",
    "run_once",
    "signal_step",
    "step_ids",
    "time_left_s",
]

#: Seconds one Slurm command may take before it counts as a (transient) failure.
COMMAND_TIMEOUT_S: Final = 30.0
#: How many times a command that fails transiently is tried in all.
COMMAND_ATTEMPTS: Final = 4
#: Back-off between tries: RETRY_WAIT_S, doubling, at most RETRY_WAIT_MAX_S.
RETRY_WAIT_S: Final = 0.5
RETRY_WAIT_MAX_S: Final = 8.0
#: The step id Slurm uses for the batch script (``SLURM_BATCH_SCRIPT``, 0xfffffffe).
# stderr fragments of failures that go away when the command is tried again a little later.
_TRANSIENT_ERRORS: Final = (
    "socket timed out",
    "unable to contact slurm controller",
    "connection refused",
    "connection reset",
    "zero bytes were transmitted or received",
    "resource temporarily unavailable",
    "communication connection failure",
    "slurm_receive_msg",
    "in standby mode",
)


class SlurmError(RuntimeError):
    """A Slurm command failed; ``stderr`` says why, ``transient`` whether a retry may help."""

    def __init__(
        self,
        argv: Sequence[str],
        detail: str,
        *,
        transient: bool = False,
        killed_by: int | None = None,
    ) -> None:
        super().__init__(f"{' '.join(argv)}: {detail.strip() or 'failed without a message'}")
        self.argv = tuple(argv)
        self.stderr = detail.strip()
        self.transient = transient
        self.killed_by = killed_by  #: the signal that ended the command, if one did


@dataclass(frozen=True, slots=True)
class Allocation:
    """The Slurm job this process belongs to, as seen from this node."""

    job_id: str  #: SLURM_JOB_ID (for an array task: its own id, which scontrol accepts)
    nodes: tuple[str, ...]  #: every node of the job, in Slurm's order (node rank order)
    this_node: str  #: SLURMD_NODENAME, else the short host name (a salloc shell)
    gpus_per_node: int | None  #: GPUs of the job on this node, if any were requested
    cpus_on_node: int | None  #: CPUs of the job (or step) on this node
    restart_count: int  #: times the job was requeued (SLURM_RESTART_COUNT), 0 at first


def run_once(argv: Sequence[str], *, timeout_s: float | None = None) -> str:
    """Run one Slurm command once and return its stdout; raise :class:`SlurmError` if it fails."""
    timeout_s = COMMAND_TIMEOUT_S if timeout_s is None else timeout_s
    try:
        done = subprocess.run(
            list(argv), capture_output=True, text=True, timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        raise SlurmError(argv, f"no answer within {timeout_s:g} s", transient=True) from None
    except OSError as error:
        raise SlurmError(argv, str(error)) from error
    if done.returncode < 0:
        raise SlurmError(argv, f"killed by signal {-done.returncode}", killed_by=-done.returncode)
    if done.returncode != 0:
        lowered = done.stderr.lower()
        transient = any(fragment in lowered for fragment in _TRANSIENT_ERRORS)
        raise SlurmError(argv, done.stderr or f"exit status {done.returncode}", transient=transient)
    return done.stdout


def _run_retrying(argv: Sequence[str]) -> str:
    """:func:`run_once`, retried with exponential back-off while the failure is transient."""
    retrying = Retrying(
        retry=retry_if_exception(lambda error: isinstance(error, SlurmError) and error.transient),
        stop=stop_after_attempt(COMMAND_ATTEMPTS),
        wait=wait_exponential(multiplier=RETRY_WAIT_S, max=RETRY_WAIT_MAX_S),
        reraise=True,
    )
    return retrying(run_once, argv)


def _int_or_none(text: str | None) -> int | None:
    try:
        return None if text is None else int(text)
    except ValueError:
        return None


def detect(env: Mapping[str, str] | None = None) -> Allocation | None:
    """The allocation described by ``env`` (default: this process's environment).

    Returns None outside Slurm (no SLURM_JOB_ID). The node list is expanded by
    ``scontrol show hostnames`` (Slurm's own parser) and by :func:`expand_hostlist` when scontrol
    is missing or fails.
    """
    env = os.environ if env is None else env
    job_id = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    if not job_id:
        return None
    this_node = p.node_name(env.get("SLURMD_NODENAME"), socket.gethostname())
    nodelist = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST") or ""
    nodes = _hostnames(nodelist) if nodelist else (this_node,)
    return Allocation(
        job_id=job_id,
        nodes=nodes,
        this_node=this_node,
        gpus_per_node=_gpus_on_node(env),
        cpus_on_node=_int_or_none(env.get("SLURM_CPUS_ON_NODE")),
        restart_count=_int_or_none(env.get("SLURM_RESTART_COUNT")) or 0,
    )


def _hostnames(nodelist: str) -> tuple[str, ...]:
    try:
        names = tuple(run_once(["scontrol", "show", "hostnames", nodelist], timeout_s=10.0).split())
    except SlurmError:
        names = ()
    return names or expand_hostlist(nodelist)


def _gpus_on_node(env: Mapping[str, str]) -> int | None:
    on_node = _int_or_none(env.get("SLURM_GPUS_ON_NODE"))
    if on_node is not None:
        return on_node
    # --gpus-per-node=[type:]count[,[type:]count...]
    per_node = env.get("SLURM_GPUS_PER_NODE")
    if not per_node:
        return None
    counts = [_int_or_none(part.rpartition(":")[2]) for part in per_node.split(",")]
    return None if None in counts else sum(count or 0 for count in counts)


def time_left_s(job_id: str) -> float | None:
    """Seconds until the job's time limit (squeue %L); None without a limit or once it ended."""
    return parse_time_left(_run_retrying(["squeue", "-h", "-j", job_id, "-o", "%L"]))


def job_info(job_id: str) -> dict[str, str]:
    """``scontrol show job -o ID`` as a dict: JobState, Requeue, Restarts, TimeLimit, EndTime..."""
    return parse_job_record(_run_retrying(["scontrol", "show", "job", "-o", job_id]), job_id)


def is_requeueable(job_id: str) -> bool:
    """Whether Slurm may requeue the job (``Requeue=1``: sbatch --requeue or JobRequeue=1)."""
    return job_info(job_id).get("Requeue") == "1"


def requeue(job_id: str) -> None:
    """``scontrol requeue ID``: Slurm ends the job (SIGTERM, KillWait, SIGKILL to everything,
    the batch script included) and queues it again; it restarts with SLURM_RESTART_COUNT + 1.
    Raises :class:`SlurmError` with scontrol's message if Slurm refuses.

    Run inside the job, scontrol is one of the processes Slurm sends SIGTERM to once it has
    accepted the requeue, and on a loaded node that comes before scontrol exits: a command
    ended by SIGTERM is an accepted requeue when the job's restart count has gone past this
    allocation's (``scontrol show job``); otherwise the error stands."""
    try:
        _run_retrying(["scontrol", "requeue", job_id])
    except SlurmError as error:
        if error.killed_by != signal.SIGTERM or not _requeued_since(job_id):
            raise


def _requeued_since(job_id: str) -> bool:
    """Whether Slurm counts more restarts of ``job_id`` than this allocation's
    SLURM_RESTART_COUNT (False when that cannot be told)."""
    try:
        restarts = _int_or_none(job_info(job_id).get("Restarts"))
    except SlurmError:
        return False
    this = _int_or_none(os.environ.get("SLURM_RESTART_COUNT")) or 0
    return restarts is not None and restarts > this


def requeue_excluding(job_id: str, nodes: Sequence[str]) -> str:
    """Requeue the job so that its next allocation holds none of ``nodes`` (added to the
    job's ExcNodeList): ``scontrol requeuehold``, ``update ExcNodeList``, ``release``.

    Slurm takes a new ExcNodeList only from a pending job, and requeuing ends this process's job
    (SIGTERM to every process of it, SIGKILL after KillWait): the three commands run in one
    shell that ignores SIGTERM and SIGHUP (the scontrols inherit that), so that the job is
    released even while this process is being stopped. Returns "" or, when the update was
    refused (the job was requeued and released all the same), scontrol's message. Raises
    :class:`SlurmError` when the requeue itself is refused (nothing else ran then)."""
    current = job_info(job_id).get("ExcNodeList", "")
    known = expand_hostlist(current) if current and current != "(null)" else ()
    excluded = ",".join(dict.fromkeys([*known, *nodes]))
    script = (
        'trap "" TERM HUP; scontrol requeuehold "$0" || exit 3; '
        'scontrol update JobId="$0" ExcNodeList="$1"; updated=$?; scontrol release "$0"; '
        "exit $((updated ? 4 : 0))"
    )
    argv = ["sh", "-c", script, job_id, excluded]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60.0, check=False)
    said = (done.stderr or done.stdout).strip() or f"status {done.returncode}"
    if done.returncode == 4:
        return said
    if done.returncode != 0:
        raise SlurmError(argv, said)
    return ""


def step_ids(job_id: str, job_name: str) -> tuple[str, ...]:
    """Ids ("JOB.STEP") of the job's live steps named ``job_name``."""
    out = _run_retrying(["squeue", "-h", "-s", "-j", job_id, "-o", "%i %j"])
    pairs = (line.split(maxsplit=1) for line in out.splitlines())
    return tuple(pair[0] for pair in pairs if len(pair) == 2 and pair[1].strip() == job_name)


def signal_step(step_id: str, signal_name: str) -> None:
    """Send a signal ("TERM", "USR1", ...) to every task of the step; the step is not ended."""
    _run_retrying(["scancel", f"--signal={signal_name}", step_id])


def cancel_step(step_id: str) -> None:
    """End the step on every node (SIGTERM, then SIGKILL)."""
    _run_retrying(["scancel", step_id])
