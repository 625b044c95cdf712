"""One node of the heal tests (worker_sdk.checkpoint.memory.nodes.heal): a process that stands
for a node, its own snapshot folder and replica receiver, joined to the others by gloo.

Usage::

    python heal_worker.py STORE_FILE RANK WORLD_SIZE BASE KEY LOWEST HIGHEST

The node's folder is ``BASE/node<RANK>``; ``KEY`` signs and checks its copies (give one node
another key to make its receiver refuse). Prints one JSON line: the step healed to (-1: none),
whether a node was healed, and the complete snapshots in the node's folder afterwards.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from worker_sdk.checkpoint.memory import nodes as _nodes
from worker_sdk.checkpoint.memory.replica import Receiver
from worker_sdk.contract import layout


class _Writer:
    """Stands for the rank's snapshot writer: where its receiver listens."""

    def __init__(self, receiver: Receiver) -> None:
        self.receiver = receiver

    def endpoint(self, timeout_s: float) -> str:
        return self.receiver.endpoint


def main(argv: list[str]) -> int:
    store, rank, world, base, key, lowest, highest = argv
    dist.init_process_group(
        "gloo",
        init_method=f"file://{store}",
        rank=int(rank),
        world_size=int(world),
        timeout=timedelta(seconds=60),
    )
    folder = Path(base) / f"node{rank}"
    folder.mkdir(parents=True, exist_ok=True)
    receiver = Receiver(folder, key.encode(), "127.0.0.1", "a1")
    try:
        nodes = _nodes.Nodes(key.encode(), "127.0.0.1", int(rank), 0)
        failed = _nodes.connect(nodes, _Writer(receiver))  # type: ignore[arg-type]
        assert failed is None, failed
        step, healed = _nodes.heal(
            nodes, folder, rank=int(rank), lowest=int(lowest), highest=int(highest), attempt="a1"
        )
        steps = [info.step for info in layout.scan(folder)[0]]
        print(json.dumps({"step": step, "healed": healed, "steps": steps}), flush=True)
    finally:
        receiver.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
