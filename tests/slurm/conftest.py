"""The session's Slurm test cluster; tests/slurm/cluster.py says what it is and how to use it."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

from tests.slurm.cluster import SlurmCluster


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
