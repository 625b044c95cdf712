"""A lost node on the Slurm testbed, with the memory tier on: its ranks' state comes back from
the other node's memory (the replicas), not from storage.

One job, awaited once by a module fixture and asserted by several tests: a 3-node allocation
(``--no-kill``) of a 2 x 2 job (node1, node2; node3 the spare) that snapshots every step and
checkpoints to storage only every 1000 steps. Once every rank is past step 20 and node1 holds a
complete snapshot of it, node2 is lost:
its copies of the snapshots are deleted (its memory) and every process on it gets SIGKILL at
once (slurmd, the step, the zygote, torchrun, the ranks, their snapshot writers). rvsup finds
node2 lost (``node_failure``); attempt 2 runs on node1 and node3, which holds no snapshot:
node1 pushes it the newest one before any rank loads, and the job ends bit-identical to the
same job run without interruption.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from supervisor.slurm import commands as slurm
from tests.helpers.jobs import snapshot_dir
from tests.helpers.states import assert_same_state, load_final
from tests.slurm.cluster import SlurmCluster
from tests.slurm.jobs import (
    REFERENCE_STEPS,
    TrainerJob,
    attempt_nodes,
    sbatch_job,
    wait_until,
    write_trainer_job,
)
from tests.slurm.node_loss import kill_node_during
from worker_sdk.contract.layout import COMMITTED_RE

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("needs_venv")]

TOTAL = REFERENCE_STEPS  # the reference's (conftest.py): the final states compare
LOST_AFTER = 20
CHECKPOINT = "every_steps = 1000\nmemory_every_steps = 1"
ENV = {"STEP_SLEEP": "0.05"}


@pytest.fixture(scope="module")
def lost_node(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[TrainerJob, Path]:
    """The job of the module docstring, run to its end; its snapshot folder."""
    job = write_trainer_job(
        tmp_path_factory.mktemp("lost-node"),
        name="lost-node",
        total=TOTAL,
        env=ENV,
        nnodes="2",
        checkpoint=CHECKPOINT,
    )
    job_id = sbatch_job(
        slurm_cluster, job, "--nodes=3", "--nodelist=node1,node2,node3", "--no-kill"
    )
    alloc = slurm.Allocation(job_id, ("node1", "node2"), "node1", None, 1, 0)

    def memory_lost() -> None:  # node2's copies go with it (they share this machine's tmpfs)
        wait_until(lambda: any((snapshots() / "node2").glob("step-*")), timeout=30, what="copies")
        # the snapshots are written in the background: under load node1's newest complete one may
        # lag the step every rank has passed; the kill waits for one past it
        wait_until(
            lambda: newest_committed(snapshots() / "node1") >= LOST_AFTER,
            timeout=30,
            what=f"a snapshot of step {LOST_AFTER} on node1",
        )
        # node2's writer may be filling a snapshot meanwhile: a removal that found a file added
        # under it (ENOTEMPTY) is tried again
        wait_until(lambda: _removed(snapshots() / "node2"), timeout=30, what="node2's copies gone")

    def snapshots() -> Path:  # made by the daemon at its start: recorded in the run directory
        found = snapshot_dir(job.job_toml)
        assert found is not None
        return found

    kill_node_during(
        slurm_cluster, job, job_id, "node2", probe=alloc, past=LOST_AFTER, before_kill=memory_lost
    )
    return job, snapshots()


def test_the_lost_nodes_ranks_resume_from_the_replicas_on_the_spare(
    lost_node: tuple[TrainerJob, Path],
) -> None:
    """node_failure names node2; attempt 2 runs on node1 and node3 and loads a snapshot
    (source "replica": node3 got it from node1) at or after the step every rank had passed,
    where storage has none."""
    job, _ = lost_node
    assert job.named("job_succeeded"), job.output_text()[-3000:]
    failures = [(f["kind"], f["nodes"]) for f in job.named("failure_detected")]
    assert failures == [("node_failure", ["node2"])], failures
    nodes = attempt_nodes(job)
    assert nodes == [["node1", "node2"], ["node1", "node3"]], nodes
    loaded = [e for e in job.named("checkpoint_loaded") if e.get("attempt") == 2]
    assert loaded, job.named("checkpoint_loaded")
    assert loaded[0]["source"] == "replica", loaded
    assert loaded[0]["resume_step"] > LOST_AFTER, loaded
    started: dict[str, Any] = job.named("attempt_started")[1]
    assert started["source"] == "replica", started
    assert not job.named("checkpoint_skipped")


def test_the_job_ends_as_the_uninterrupted_one(
    lost_node: tuple[TrainerJob, Path], reference: TrainerJob
) -> None:
    """Model, optimizer, scheduler and every rank's RNG, bit for bit."""
    job, _ = lost_node
    assert_same_state(load_final(reference.final), load_final(job.final))


def test_no_copy_of_the_snapshots_is_left_on_any_node(lost_node: tuple[TrainerJob, Path]) -> None:
    """The job's end removes every node's folder (the daemon's own, the others' by its last
    srun step)."""
    _, snapshots = lost_node
    deadline = time.monotonic() + 10
    while snapshots.exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not snapshots.exists(), sorted(str(p) for p in snapshots.rglob("*"))[:20]


def newest_committed(folder: Path) -> int:
    """The highest step of the snapshots committed in ``folder``; -1 when none."""
    steps = [COMMITTED_RE.match(p.name) for p in folder.glob("step-*")]
    return max((int(m.group(1)) for m in steps if m), default=-1)


def _removed(folder: Path) -> bool:
    """Remove ``folder`` and what it holds; False when a file appeared under it meanwhile."""
    try:
        shutil.rmtree(folder)
    except FileNotFoundError:
        return not folder.exists()
    except OSError:
        return False
    return True
