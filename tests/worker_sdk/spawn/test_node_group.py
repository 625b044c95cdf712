"""What a node's wrapper (worker_sdk/spawn/node_group.py) hands torchrun: the node's rank in
the attempt's static rendezvous is its SLURM_NODEID, through the variable torchrun reads for
``--node-rank``; an explicit one is kept."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.process


@pytest.mark.parametrize(
    ("given", "node_rank"),
    [({"SLURM_NODEID": "2"}, "2"), ({"SLURM_NODEID": "2", "PET_NODE_RANK": "0"}, "0")],
)
def test_the_node_rank_is_the_nodes_slurm_id(given: dict[str, str], node_rank: str) -> None:
    """The wrapper's command sees PET_NODE_RANK = SLURM_NODEID (unless already set)."""
    env = {k: v for k, v in os.environ.items() if k not in ("SLURM_NODEID", "PET_NODE_RANK")}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "worker_sdk.spawn.node_group",
            "1",
            sys.executable,
            "-c",
            "import os; print(os.environ['PET_NODE_RANK'])",
        ],
        env={**env, **given},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert done.stdout.strip() == node_rank
