"""What both callbacks share: whether rvsup is there, the durable write of a framework's files."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

import worker_sdk
from worker_sdk.contract import protocol as p

__all__ = ["active", "fsync_tree", "resume_external"]


def active() -> bool:
    """Whether the callbacks do anything: under rvsup, or with a checkpoint directory set for
    the SDK's standalone mode (``RVSUP_CHECKPOINT_DIR``). Otherwise they are no-ops."""
    return bool(os.environ.get(p.ENV_ENDPOINT) or os.environ.get(p.ENV_CHECKPOINT_DIR))


def resume_external(total_steps: int | None, model: Any) -> str | None:
    """``worker_sdk.resume(external=True)`` for a framework that restores its own RNG states and
    data position from its checkpoint: the path of the newest marked one (None: a fresh start).
    ``model``'s parameters are the resume check's fingerprint (a module; else only losses)."""
    watched = [model] if isinstance(model, torch.nn.Module) else []
    _, path = worker_sdk.resume(external=True, total_steps=total_steps, fingerprint=watched)
    runtime = worker_sdk._current
    if runtime is not None:
        runtime.end_loader_window()
    return None if path is None else str(path)


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
