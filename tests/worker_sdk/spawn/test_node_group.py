"""What a node's wrapper (worker_sdk/spawn/node_group.py) hands torchrun: the node's rank in
the attempt's static rendezvous is its SLURM_NODEID, through the variable torchrun reads for
``--node-rank``; an explicit one is kept; on a cgroup v1 host, a memory group of the node's."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from worker_sdk.spawn.cgroup import own_group_dir, own_memory_v1_dir

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


def test_the_nodes_processes_are_in_a_memory_group_of_its_own_removed_at_the_end() -> None:
    """On a cgroup v1 host the wrapper's command runs in a v1 memory group ``rvsup-node-PID``
    (the wrapper's pid) under the wrapper's own, where the node's agent counts OOM kills; the
    group is gone once the wrapper has ended."""
    own = own_memory_v1_dir()
    if own is None or not os.access(own, os.W_OK):
        pytest.skip("no writable cgroup v1 memory controller here")
    v2 = own_group_dir()
    with contextlib.suppress(OSError):
        if v2 is not None and "memory" in (Path(v2) / "cgroup.subtree_control").read_text():
            pytest.skip("the node's cgroup v2 group counts its OOM kills here")
    show = "from worker_sdk.spawn.cgroup import own_group_dir, own_memory_v1_dir as d; print(d())"
    wrapper = subprocess.Popen(
        [sys.executable, "-m", "worker_sdk.spawn.node_group", "1", sys.executable, "-c", show],
        stdout=subprocess.PIPE,
        text=True,
    )
    out, _ = wrapper.communicate(timeout=60)
    assert wrapper.returncode == 0
    group = Path(out.strip())
    assert (group.parent, group.name) == (Path(own), f"rvsup-node-{wrapper.pid}")
    assert not group.exists()
