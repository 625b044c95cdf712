"""What both callbacks share: whether rvsup is there, the durable write of a framework's files."""

from __future__ import annotations

import os
from pathlib import Path

from worker_sdk.contract import protocol as p

__all__ = ["active", "fsync_tree"]


def active() -> bool:
    """Whether the callbacks do anything: under rvsup, or with a checkpoint directory set for
    the SDK's standalone mode (``RVSUP_CHECKPOINT_DIR``). Otherwise they are no-ops."""
    return bool(os.environ.get(p.ENV_ENDPOINT) or os.environ.get(p.ENV_CHECKPOINT_DIR))


def fsync_tree(path: Path) -> None:
    """Make a framework's checkpoint (a file, or a folder of files) durable: every regular file
    and every folder fsynced, then the folder that holds it."""
    targets = [path] if path.is_file() else [*sorted(path.rglob("*")), path]
    for target in targets:
        if target.is_symlink() or not (target.is_file() or target.is_dir()):
            continue
        fd = os.open(target, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
