"""``python -m worker_sdk.spawn.sweep_snapshots SNAPSHOT_DIR``: at the end of a job on several
nodes, run on every node (the daemon's last srun step, ``supervisor.process.plan.sweep_nodes``):
this node's copies of the job's memory snapshots go (``SNAPSHOT_DIR/<host name>``,
``worker_sdk.contract.layout.node_folder``), and the job's folder with them once empty.
Standard library only, as every entry point the daemon launches."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import sys
from pathlib import Path

__all__ = ["main"]


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m worker_sdk.spawn.sweep_snapshots SNAPSHOT_DIR", file=sys.stderr)
        return 2
    base = Path(argv[0])
    shutil.rmtree(base / socket.gethostname(), ignore_errors=True)
    with contextlib.suppress(OSError):
        os.rmdir(base)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
