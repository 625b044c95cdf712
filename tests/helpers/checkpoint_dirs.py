"""Checkpoint directories on disk without torch: committed checkpoints of dummy files with a
matching manifest, in format 1 and 2, for the tests of the layout and of the supervisor."""

from __future__ import annotations

import json
from pathlib import Path

from worker_sdk.contract.layout import DCP_METADATA, MANIFEST, SHARED, committed_name, rank_file

__all__ = ["make_checkpoint", "make_checkpoint_v2"]


def make_checkpoint(
    directory: Path, step: int, world_size: int = 2, name: str | None = None
) -> Path:
    """A committed checkpoint with dummy files of distinct sizes and a matching manifest."""
    path = directory / (name or committed_name(step))
    path.mkdir(parents=True)
    files = {SHARED: 100 + step} | {rank_file(r): 10 + r for r in range(world_size)}
    for fname, size in files.items():
        (path / fname).write_bytes(b"x" * size)
    manifest = {"format": 1, "step": step, "world_size": world_size, "created": 1.5, "files": files}
    (path / MANIFEST).write_text(json.dumps(manifest))
    return path


def make_checkpoint_v2(directory: Path, step: int, world_size: int = 2) -> Path:
    """A committed format-2 checkpoint: a model and its optimizer sharded in dcp/, a schedule
    replicated in shared.pt."""
    path = make_checkpoint(directory, step, world_size)
    (path / "dcp").mkdir()
    dcp_files = {DCP_METADATA: 50} | {f"dcp/__{r}_0.distcp": 70 + r for r in range(world_size)}
    for fname, size in dcp_files.items():
        (path / fname).write_bytes(b"d" * size)
    manifest = json.loads((path / MANIFEST).read_text())
    manifest |= {
        "format": 2,
        "files": manifest["files"] | dcp_files,
        "checksums": {name: 1000 + size for name, size in dcp_files.items()},
        "objects": [
            {"class": "Transformer", "state": "dcp"},
            {"class": "AdamW", "state": "dcp"},
            {"class": "LambdaLR", "state": "shared"},
        ],
    }
    (path / MANIFEST).write_text(json.dumps(manifest))
    return path
