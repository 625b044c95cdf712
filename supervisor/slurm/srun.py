"""The one ``srun`` step that runs a command once on every node of the allocation: its command
line (:func:`srun_argv`), every flag with why, and how such a step is torn down."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

__all__ = ["StepNodes", "srun_argv"]


class StepNodes(Protocol):
    """What a step needs of the allocation (``supervisor.slurm.commands.Allocation``)."""

    @property
    def nodes(self) -> tuple[str, ...]: ...
    @property
    def cpus_on_node(self) -> int | None: ...
    @property
    def gpus_per_node(self) -> int | None: ...


def srun_argv(
    alloc: StepNodes, inner: Sequence[str], *, job_name: str, kill_on_bad_exit: bool = True
) -> list[str]:
    """The srun command that runs ``inner`` once on every node of ``alloc``, as one job step.

    Each task learns its node rank from SLURM_NODEID (0..N-1, in :attr:`Allocation.nodes`
    order; SLURM_PROCID is the same here). The flags, and why:

    - ``--nodes=N --ntasks=N --ntasks-per-node=1 --nodelist=...``: one task per node, on the
      nodes of ``alloc`` (all of the job's, or those left after a node failure); torchrun
      starts the ranks of its node itself.
    - ``--cpus-per-task=C`` (C = the job's CPUs on this node): torchrun's ranks need every CPU
      of the node. srun alone would give the step all of them, but an inherited
      SRUN_CPUS_PER_TASK (22.05) or SLURM_CPUS_PER_TASK (23.11+) shrinks the step to that many
      CPUs; a command-line value wins. Assumes every node has the same CPUs, as torchrun does.
    - ``--gpus-per-node=G`` (G = the job's GPUs on this node): otherwise a job submitted with
      ``--gpus-per-task=1 --ntasks-per-node=8`` hands this one-task step one GPU per node.
    - ``--overlap``: share CPUs, memory and GPUs with other steps of the job. Without it the
      step waits, maybe forever, while any other step holds them: the previous attempt's step
      still completing, or a step the user started (say ``srun rvsup start ...``).
    - ``--kill-on-bad-exit=1``: one task ending non-zero kills the step on every node, so the
      other nodes do not sit in a collective until the hang timeout (whatever the cluster's
      KillOnBadExit). ``kill_on_bad_exit=False`` (the zygotes' step) says 0 instead: one
      node's task ending leaves the others be.
    - ``--export=ALL``: the tasks get this environment even when the job was submitted with
      ``--export=NONE`` (which leaves SLURM_EXPORT_ENV=NONE behind for srun to obey).
    - ``--mpi=none``: torchrun does its own rendezvous; skip the cluster's MpiDefault (PMIx)
      set-up and its failure modes.
    - ``--job-name``: names the step, to find it again
      (:func:`~supervisor.slurm.commands.step_ids`) and in accounting.

    Tearing the step down (measured on Slurm 22.05):

    - SIGTERM, SIGHUP or SIGQUIT to srun is not forwarded: srun answers it by SIGKILLing every
      task on every node at once ("forcing job termination") and exits (status 137). Use it
      for the hard stop. SIGKILL to srun also ends the step: slurmstepd kills the tasks once
      srun's connection is gone.
    - For a graceful stop, signal the tasks, not srun: ``commands.signal_step(step, "TERM")``
      (scancel --signal) delivers SIGTERM to the task on every node and nothing else; srun
      forwards other signals (USR1, USR2, ...) to every task as they are.
    - ``commands.cancel_step(step)`` (scancel STEP) ends a step whose srun is gone; the tasks
      get SIGTERM and soon SIGKILL.
    """
    count = len(alloc.nodes)
    argv = [
        "srun",
        f"--nodes={count}",
        f"--ntasks={count}",
        "--ntasks-per-node=1",
        f"--nodelist={','.join(alloc.nodes)}",
    ]
    if alloc.cpus_on_node:
        argv.append(f"--cpus-per-task={alloc.cpus_on_node}")
    if alloc.gpus_per_node:
        argv.append(f"--gpus-per-node={alloc.gpus_per_node}")
    argv += [
        "--overlap",
        f"--kill-on-bad-exit={int(kill_on_bad_exit)}",
        "--export=ALL",
        "--mpi=none",
        f"--job-name={job_name}",
        "--",
        *inner,
    ]
    return argv
