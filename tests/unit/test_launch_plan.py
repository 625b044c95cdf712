"""Where each attempt runs after a node failure: spares first, then fewer nodes down to
launch.min_nnodes (pure planning: no process is started)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.config.torchrun import Torchrun
from supervisor.process.plan import Launches
from supervisor.slurm.commands import Allocation
from tests.unit.core_fakes import job_config

TORCHRUN = Torchrun(("/venv/bin/torchrun",), None, "test")


def _launches(tmp: Path, nodes: tuple[str, ...], launch: str) -> Launches:
    cfg = job_config(tmp, f"[launch]\nnproc_per_node = 2\nwarm_standby = false\n{launch}\n")
    alloc = Allocation("7", nodes, nodes[0], 2, None, 2, 0, True)
    return Launches(cfg, alloc, TORCHRUN)


@pytest.mark.parametrize(
    ("nodes", "launch", "lost", "verdict", "nnodes"),
    [
        (("n1", "n2"), "nnodes = 2", ("n2",), (1, 2), 1),  # no spare, no minimum: give up
        (("n1", "n2", "n3"), "nnodes = 2", ("n2",), (2, 2), 2),  # the spare takes n2's place
        (("n1", "n2"), "nnodes = 2\nmin_nnodes = 1", ("n2",), (1, 1), 1),  # go on with n1
        (("n1", "n2", "n3"), "nnodes = 3\nmin_nnodes = 2", ("n3",), (2, 2), 2),
        (("n1", "n2", "n3"), "nnodes = 3\nmin_nnodes = 2", ("n2", "n3"), (1, 2), 1),
    ],
)
def test_nodes_after_a_loss(
    tmp_path: Path,
    nodes: tuple[str, ...],
    launch: str,
    lost: tuple[str, ...],
    verdict: tuple[int, int],
    nnodes: int,
) -> None:
    """lose() answers (nodes left, the job's minimum) for the policy, and the next plan runs on
    the nodes left, as many as the job wants."""
    launches = _launches(tmp_path, nodes, launch)
    assert launches.lose(lost) == verdict
    plan = launches.plan(2, {})
    assert plan.nnodes == nnodes
    assert plan.nproc_per_node == 2
    if nnodes == 1:
        assert "--standalone" in plan.argv and plan.alloc is None
    else:
        assert f"--nnodes={nnodes}" in plan.argv
        assert plan.alloc is not None and not set(plan.alloc.nodes) & set(lost)


def test_min_nnodes_above_nnodes_is_refused(tmp_path: Path) -> None:
    """launch.min_nnodes larger than launch.nnodes is a configuration error naming the key."""
    from supervisor.config import ConfigError

    with pytest.raises(ConfigError, match="min_nnodes"):
        job_config(tmp_path, "[launch]\nnnodes = 2\nmin_nnodes = 3\n")


@pytest.mark.parametrize(("zygote", "said"), [("", 1), ("zygote = false", 0)])
def test_multi_node_ranks_start_cold_and_say_so(tmp_path: Path, zygote: str, said: int) -> None:
    """A multi-node job with the zygote on (the default) gets a cold_start event naming the
    reason once, and no zygote; with the zygote turned off nothing is said."""
    launches = _launches(tmp_path, ("n1", "n2"), f"nnodes = 2\n{zygote}")
    assert launches.zygote is None
    cold = launches.cold_starts()
    assert len(cold) == said
    assert all("multi-node" in c.reason and c.ranks == () for c in cold)
    assert launches.cold_starts() == []
