"""The session's Slurm test cluster; tests/slurm/cluster.py says what it is and how to use it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.slurm.cluster import SlurmCluster
from tests.slurm.jobs import (
    REFERENCE_STEPS,
    TrainerJob,
    submit,
    venv_problem,
    write_trainer_job,
)
from tests.slurm.node_loss import END_S, START_S, run_to_end


def _skip_reason() -> str | None:
    if os.environ.get("RVSUP_SKIP_SLURM") == "1":
        return "RVSUP_SKIP_SLURM=1 switches the Slurm cluster tests off"
    if os.geteuid() != 0:
        return "the Slurm test cluster needs root (network namespaces, slurmd); run as root"
    return None


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """One running cluster for the whole session, torn down at its end, also after failures."""
    reason = _skip_reason()
    if reason is not None:
        pytest.skip(reason)
    cluster = SlurmCluster()
    try:
        cluster.up()
        # supervisor.slurm runs the Slurm commands with this process's environment
        with pytest.MonkeyPatch.context() as patch:
            patch.setenv("SLURM_CONF", str(cluster.slurm_conf))
            yield cluster
    finally:
        cluster.down()
    leftovers = cluster.leftovers()
    if leftovers:
        pytest.fail(f"the Slurm test cluster left behind: {', '.join(leftovers)}")


@pytest.fixture(scope="module")
def needs_venv() -> None:
    """The example batch script activates a virtualenv: this Python's."""
    problem = venv_problem()
    if problem is not None:
        pytest.skip(problem)


@pytest.fixture(scope="session")
def reference(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> TrainerJob:
    """The 2 x 2 job (node1, node2) run without interruption: one attempt, no failure, its
    final state, which every job of the trainer over ``REFERENCE_STEPS`` steps must end with
    however it was interrupted (its checkpoint settings and step times aside)."""
    problem = venv_problem()
    if problem is not None:
        pytest.skip(problem)
    job = write_trainer_job(tmp_path_factory.mktemp("reference"), total=REFERENCE_STEPS)
    job_id = submit(slurm_cluster, job)
    run_to_end(slurm_cluster, job, job_id, timeout=START_S + END_S)
    assert job.named("failure_detected") == [], job.output_text()[-3000:]
    assert len(job.named("attempt_started")) == 1
    assert job.named("job_succeeded") and job.final.exists()
    return job
