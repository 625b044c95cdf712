"""The memory tier on several nodes, its pure parts (worker_sdk.checkpoint.memory.nodes): who
receives whose parts, who commits each node's copy; what a rank without the job's secret does;
and the sweep that removes a node's copies at the job's end."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from worker_sdk.checkpoint.memory import nodes as _nodes
from worker_sdk.contract import layout
from worker_sdk.contract import protocol as p
from worker_sdk.spawn import sweep_snapshots as sweep

# 3 nodes x 2 ranks, torchrun's numbering: rank = node * 2 + local rank
NODE_OF = {r: r // 2 for r in range(6)}
LOCAL_OF = {r: r % 2 for r in range(6)}


def _connected(rank: int) -> _nodes.Nodes:
    got = _nodes.Nodes(b"k", "10.0.0.1", NODE_OF[rank], LOCAL_OF[rank], connected=True)
    got.endpoints = {r: f"tcp://10.0.0.{NODE_OF[r] + 1}:{5000 + r}" for r in range(6)}
    got.node_of, got.local_of = dict(NODE_OF), dict(LOCAL_OF)
    return got


@pytest.mark.parametrize(
    ("rank", "peers", "leader"),
    [
        (0, ("tcp://10.0.0.2:5002", "tcp://10.0.0.3:5004"), 0),
        (1, ("tcp://10.0.0.2:5003", "tcp://10.0.0.3:5005"), 0),
        (2, ("tcp://10.0.0.1:5000", "tcp://10.0.0.3:5004"), 2),
        (5, ("tcp://10.0.0.1:5001", "tcp://10.0.0.2:5003"), 4),
    ],
)
def test_a_rank_pushes_to_its_local_rank_on_every_other_node(
    rank: int, peers: tuple[str, ...], leader: int
) -> None:
    """Each part reaches every other node once (through the same local rank's writer); the
    node's first rank commits its copy."""
    got = _connected(rank)
    assert got.peers() == peers
    assert got.leader(got.node) == leader
    assert got.is_leader(rank) == (rank == leader)


def test_a_rank_not_connected_judges_the_leader_by_its_local_rank() -> None:
    """Before (or without) the exchange of endpoints, local rank 0 discards the node's copies."""
    assert _nodes.Nodes(b"", "", 1, 0).is_leader(2)
    assert not _nodes.Nodes(b"", "", 1, 1).is_leader(3)


def test_without_the_jobs_secret_replication_is_refused() -> None:
    """A script run on several nodes without rvsup has no secret to sign the copies with: the
    tier says why and stays off (storage only)."""
    got = _nodes.from_environment({"LOCAL_RANK": "1", "GROUP_RANK": "1"})
    assert got.failed == "no job secret (run under rvsup)"
    assert (got.node, got.local_rank) == (1, 1)


def test_the_secret_and_the_address_come_from_the_environment(tmp_path: Path) -> None:
    """The job's secret file; the address this node reaches the rendezvous host from."""
    secret = tmp_path / "secret"
    p.write_secret(str(secret), b"s" * 32)
    env = {p.ENV_SECRET_FILE: str(secret), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
    got = _nodes.from_environment({**env, "LOCAL_RANK": "0", "GROUP_RANK": "2"})
    assert got.failed is None
    assert (got.key, got.address, got.node) == (b"s" * 32, "127.0.0.1", 2)


def test_the_sweep_takes_this_nodes_copies_only(tmp_path: Path) -> None:
    """At the job's end each node removes its own folder (the one the ranks wrote:
    layout.node_folder), and the job's once it is empty."""
    base = tmp_path / "rvsup-0-abc"
    here = layout.node_folder(base)
    (here / layout.committed_name(3)).mkdir(parents=True)
    (base / "other-host").mkdir()
    assert sweep.main([str(base)]) == 0
    assert not here.exists()
    assert os.listdir(base) == ["other-host"]
    (base / "other-host").rmdir()
    assert sweep.main([str(base)]) == 0
    assert not base.exists()
    assert sweep.main([]) == 2
