"""The memory tier of a job on several nodes: who receives, who commits, and the restore's heal.

Each node keeps a complete copy of every snapshot in its own directory,
``<memory_dir>/rvsup-<uid>-<digest>/<host name>`` (the host name keeps nodes apart where they
share a tmpfs): every rank's writer pushes its files to the writers of the same local rank on
the other nodes, and the writer of each node's first rank commits that node's copy
(:mod:`.replica`, :mod:`worker_sdk.checkpoint.background.writer`). With two nodes each holds
the other's parts, its buddy's; a snapshot counts as complete on a node only once committed
there, every part checked (MAC and CRC-32 on arrival, the manifest at the commit).

At a restore the ranks all-gather the newest complete snapshot each node holds within the
bounds of the one the supervisor named; a node without it (a spare in place of a lost node, a
node whose memory was lost) gets it pushed whole from a node that has it, before anyone loads
(:func:`heal`). Then every node loads its own copy, resharding where the world size changed,
as from storage.
"""

from __future__ import annotations

import ipaddress
import json
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Final

from worker_sdk.checkpoint.collectives import all_gather_ints
from worker_sdk.contract import layout
from worker_sdk.contract import protocol as p
from worker_sdk.contract.layout import MANIFEST

from . import replica as _replica

if TYPE_CHECKING:
    from worker_sdk.checkpoint.background.async_save import AsyncSaver

__all__ = [
    "Nodes",
    "connect",
    "from_environment",
    "heal",
]

_START_S: Final = 120.0  # a writer started cold imports torch first
_PUSH_S: Final = 120.0  # per message


@dataclass
class Nodes:
    """This rank's place among the nodes, and once connected, the other nodes' writers."""

    key: bytes
    address: str
    node: int  # torchrun's GROUP_RANK
    local_rank: int
    failed: str | None = None  # why replication cannot work for this rank
    endpoints: dict[int, str] = field(default_factory=dict)  # every rank's writer
    node_of: dict[int, int] = field(default_factory=dict)
    local_of: dict[int, int] = field(default_factory=dict)
    connected: bool = False

    def leader(self, node: int) -> int:
        """The rank whose writer commits ``node``'s copies (its first)."""
        return min(r for r, n in self.node_of.items() if n == node)

    def is_leader(self, rank: int) -> bool:
        """Whether ``rank`` commits (and discards) this node's copies."""
        return rank == self.leader(self.node) if self.node_of else self.local_rank == 0

    def peers(self) -> tuple[str, ...]:
        """The writers this rank's parts go to: the same local rank on every other node."""
        return tuple(
            self.endpoints[r]
            for r in sorted(self.endpoints)
            if self.node_of[r] != self.node and self.local_of[r] == self.local_rank
        )


def from_environment(env: Mapping[str, str]) -> Nodes:
    """This rank's :class:`Nodes` (``failed`` says why when replication cannot work)."""
    local_rank, node = int(env.get("LOCAL_RANK", "0")), int(env.get("GROUP_RANK", "0"))
    secret_file = env.get(p.ENV_SECRET_FILE)
    if not secret_file:
        return Nodes(b"", "", node, local_rank, failed="no job secret (run under rvsup)")
    try:
        key = p.read_secret(secret_file)
        address = _replica.node_address(
            env.get("MASTER_ADDR", "127.0.0.1"), int(env.get("MASTER_PORT", "29500"))
        )
    except (OSError, ValueError) as e:
        return Nodes(b"", "", node, local_rank, failed=f"{type(e).__name__}: {e}")
    return Nodes(key, address, node, local_rank)


def connect(nodes: Nodes, saver: AsyncSaver) -> str | None:
    """Learn every rank's writer endpoint (collective, once); why not, or None."""
    ok, ip, port = 0, 0, 0
    if nodes.failed is None:
        try:
            endpoint = saver.endpoint(_START_S)
            host, _, number = endpoint.removeprefix("tcp://").rpartition(":")
            ip, port, ok = int(ipaddress.IPv4Address(host)), int(number), 1
        except (OSError, ValueError) as e:
            nodes.failed = f"{type(e).__name__}: {e}"
    rows = all_gather_ints([ok, ip, port, nodes.node, nodes.local_rank])
    nodes.connected = True
    bad = [r for r, row in enumerate(rows) if not row[0]]
    if bad:
        return nodes.failed or f"the snapshot writers of rank(s) {bad} cannot receive"
    for r, (_, ip_r, port_r, node_r, local_r) in enumerate(rows):
        nodes.endpoints[r] = f"tcp://{ipaddress.IPv4Address(ip_r)}:{port_r}"
        nodes.node_of[r], nodes.local_of[r] = node_r, local_r
    return None


def heal(
    nodes: Nodes, directory: Path, *, rank: int, lowest: int, highest: int, attempt: str
) -> tuple[int, bool]:
    """Collective: the newest step in ``[lowest, highest]`` some node holds complete, pushed
    to every node that lacks it; (-1 when none, or when a push failed), and whether a node was
    healed."""
    ok = int(nodes.failed is None and bool(nodes.endpoints))
    have = max(
        (i.step for i in layout.scan(directory)[0] if lowest <= i.step <= highest), default=-1
    )
    rows = all_gather_ints([ok, have])
    target = max(row[1] for row in rows)
    if target < 0 or not all(row[0] for row in rows):
        return -1, False
    holders = {nodes.node_of[r] for r, row in enumerate(rows) if row[1] == target}
    lacking = sorted(set(nodes.node_of.values()) - holders)
    pushed = 1
    if lacking and rank == nodes.leader(min(holders)):
        try:
            for node in lacking:
                endpoint = nodes.endpoints[nodes.leader(node)]
                _push_whole(nodes, directory, target, endpoint, attempt)
        except (OSError, ValueError, _replica.ReplicaError) as e:
            print(f"rvsup: rank {rank}: cannot send snapshot {target}: {e}", file=sys.stderr)
            pushed = 0
    if not all(flag for (flag,) in all_gather_ints([pushed])):
        return -1, False
    return target, bool(lacking)


def _push_whole(nodes: Nodes, directory: Path, step: int, endpoint: str, attempt: str) -> None:
    """A committed snapshot, every file and its manifest last, committed at ``endpoint``."""
    path = directory / layout.committed_name(step)
    manifest = json.loads((path / MANIFEST).read_bytes())
    names = sorted(manifest["files"])
    files: list[tuple[str, Path | bytes]] = [(name, path / name) for name in names]
    files.append((MANIFEST, path / MANIFEST))
    tmp = layout.temp_name(step, f"copy-{os.getpid()}")
    _replica.push(
        endpoint, nodes.key, tmp, files, attempt=attempt, timeout_s=_PUSH_S, commit_step=step
    )
