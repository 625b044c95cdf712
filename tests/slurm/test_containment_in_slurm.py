"""Nothing outlives its attempt on several nodes: 2 x 2 jobs under Slurm whose ranks start
processes that try to (``tests/helpers/spawning_worker.py``)."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import pytest

from tests.helpers.harness import TRAINER
from tests.helpers.spawning_worker import marked, still_running
from tests.slurm.cluster import SlurmCluster
from tests.slurm.jobs import TrainerJob, submit, write_trainer_job

pytestmark = pytest.mark.slurm
WORKER = Path(__file__).resolve().parents[1] / "helpers" / "spawning_worker.py"
RUN_S = 300.0  # two 2-node attempts, 6 processes importing torch on 2 cores


def _spawning_job(root: Path, mark: str, out: Path, **kwargs: str) -> TrainerJob:
    job = write_trainer_job(
        root, total=20, env={"SPAWN_MARK": mark, "SPAWN_DIR": str(out), "KILL_AT": "5"}, **kwargs
    )
    text = job.job_toml.read_text().replace(json.dumps(str(TRAINER)), json.dumps(str(WORKER)))
    job.job_toml.write_text(text)
    return job


def _left(mark: str, out: Path) -> tuple[dict[int, str], list[str]]:
    """The helpers and DataLoader workers of any attempt still running."""
    workers = [line for path in out.glob("workers-a*") for line in still_running(path)]
    return marked(mark), workers


def test_nothing_a_rank_starts_outlives_its_attempt_on_two_nodes(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Every rank of a 2-node job (forked from its node's zygote) starts a child, a setsid
    grandchild, a double-forked daemon and DataLoader workers; rank 1 is killed with SIGKILL at
    step 5 of attempt 1 and attempt 2 finishes: none of attempt 1's processes, on either node,
    exists at attempt 2's first step, and none of any attempt's once the job has ended."""
    mark = f"spawn-{uuid.uuid4().hex}"
    out = tmp_path / "spawned"
    out.mkdir()
    job = _spawning_job(tmp_path / "job", mark, out)
    job_id = submit(slurm_cluster, job)
    slurm_cluster.wait_gone(job_id, timeout=RUN_S)
    assert job.named("job_succeeded"), job.output_text()[-3000:]
    assert [e["kind"] for e in job.named("failure_detected")] == ["crash"]
    alive_before = json.loads((out / "alive-before-a2.json").read_text())
    assert (alive_before, *_left(mark, out)) == ([], {}, [])


def test_what_a_failed_multi_node_job_left_ends_with_it(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """A 2-node job that gives up after its only attempt (rank 1 killed, no restart left): the
    helpers its ranks started on both nodes are gone once the job has ended, though srun's
    teardown SIGKILLs every node's torchrun and its wrapper at once."""
    mark = f"spawn-{uuid.uuid4().hex}"
    out = tmp_path / "spawned"
    out.mkdir()
    job = _spawning_job(tmp_path / "job", mark, out, restart="max_restarts = 0")
    job_id = submit(slurm_cluster, job)
    slurm_cluster.wait_gone(job_id, timeout=RUN_S)
    assert job.named("job_gave_up"), job.output_text()[-3000:]
    assert _left(mark, out) == ({}, [])
