"""The last step of every save, synchronous or not: the manifest, one rename, the parent fsynced.

Shared by :class:`worker_sdk.checkpoint.checkpointer.Checkpointer` (the rank commits) and the
writer process of an asynchronous save (:mod:`worker_sdk.checkpoint.background.writer`, which
commits for rank 0).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, BinaryIO, Final, cast

import torch

from worker_sdk.contract import layout
from worker_sdk.contract.layout import MANIFEST, SHARED, CheckpointInfo, rank_file

__all__ = ["commit", "save_into", "write_bytes_durable", "write_durable"]

_CREATE: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW  # files are 0600


def commit(
    *,
    directory: Path,
    step: int,
    tmp: Path,
    world_size: int,
    objects: Sequence[tuple[str, str]],
    checksums: Mapping[str, int],
    keep_last: int,
    attempt_tag: str,
    replace: bool,
    mode: str,
    blocked_s: float,
    before_rename: Callable[[], None] | None = None,
    external: str | None = None,
) -> CheckpointInfo:
    """Commit the complete temporary directory ``tmp`` as the checkpoint of ``step``.

    ``objects``: (class, where its state lives) per object; ``checksums``: the CRC-32 of every
    file in ``dcp/``. An existing valid checkpoint of the same step is kept (``tmp`` is
    dropped) unless ``replace`` (it turned out unloadable).
    """
    final = directory / layout.committed_name(step)
    names = [SHARED, *(rank_file(r) for r in range(world_size)), *sorted(checksums)]
    files: dict[str, int] = {}
    for name in names:
        try:
            files[name] = os.stat(tmp / name).st_size
        except FileNotFoundError:
            raise RuntimeError(f"{tmp / name} is missing; step {step} not committed") from None
    created = time.time()
    manifest = {
        "format": layout.FORMAT,
        "step": step,
        "world_size": world_size,
        "created": created,
        "mode": mode,
        "blocked_s": round(blocked_s, 6),
        "files": files,
        "checksums": dict(checksums),
        "objects": [{"class": cls, "state": where} for cls, where in objects],
        **({} if external is None else {"external": external}),
    }
    write_bytes_durable(tmp / MANIFEST, json.dumps(manifest, indent=1).encode())
    layout.fsync_dir(tmp)
    if os.path.lexists(final):
        try:
            existing: CheckpointInfo | None = layout.validate(final)
        except layout.CorruptCheckpointError:
            existing = None
        if existing is not None and not replace:
            shutil.rmtree(tmp, ignore_errors=True)  # the same step is already committed
            return existing
        layout.discard(final)
    if before_rename is not None:
        before_rename()
    os.rename(tmp, final)
    layout.fsync_dir(directory)
    with contextlib.suppress(OSError):
        layout.prune(directory, keep_last, current_attempt_tag=attempt_tag)
    return CheckpointInfo(
        step,
        final,
        world_size,
        sum(files.values()),
        created,
        layout.FORMAT,
        tuple(objects),
        mode=mode,
        blocked_s=blocked_s,
        external=external,
    )


def write_durable(path: Path, payload: Any) -> None:
    """torch.save to ``path`` via a partial name: the final name appears complete and durable."""
    partial = path.with_name(path.name + ".partial")
    with contextlib.suppress(FileNotFoundError):
        partial.unlink()
    with os.fdopen(os.open(partial, _CREATE, 0o600), "wb") as f:
        save_into(f, payload)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def save_into(f: BinaryIO, payload: Any) -> None:
    """``torch.save(payload, f)``, raising the ``OSError`` a write into ``f`` met (a full disk:
    ENOSPC, with its errno) where torch would raise its own error for it, which names neither
    the cause nor the errno (``[enforce fail at inline_container.cc] unexpected pos ...``): the
    failed save's reason says the disk is full, and the memory tier pauses on it."""
    writes = _Writes(f)
    try:
        torch.save(payload, cast(BinaryIO, writes))  # torch calls its write and flush only
    except RuntimeError as e:
        if writes.error is not None:
            raise writes.error from e
        raise


class _Writes:
    """The file torch.save writes through: ``f``, keeping the first OSError of its writes."""

    def __init__(self, f: BinaryIO) -> None:
        self._f = f
        self.error: OSError | None = None

    def write(self, data: bytes) -> int:
        try:
            return self._f.write(data)
        except OSError as e:
            self.error = self.error or e
            raise

    def flush(self) -> None:
        self._f.flush()


def write_bytes_durable(path: Path, data: bytes) -> None:
    with os.fdopen(os.open(path, _CREATE, 0o600), "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
