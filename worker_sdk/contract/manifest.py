"""A checkpoint's manifest: read, checked, and what it says (:class:`CheckpointInfo`).

The manifest (JSON)::

    {"format": 2, "step": 123, "world_size": 2, "created": <unix time>,
     "files": {name: bytes, ...},            every file of the checkpoint ("dcp/..." included)
     "checksums": {name: crc32, ...},        format 2: the files inside dcp/ (shared.pt and
                                             the rank files carry zip CRCs of their own)
     "objects": [{"class": "Linear", "state": "shared" | "dcp" | "rank"}, ...]}   format 2

Format 1 (written by earlier releases) has no ``checksums`` and ``objects`` and no ``dcp/``;
it still loads. A torch.distributed.checkpoint directory alone proves nothing here: DCP
writes its data files under their final names and its ``.metadata`` last, without fsyncing
the directory. Only the manifest, written after every rank's files are durable, does.
"""

from __future__ import annotations

import json
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeGuard

from .checkpoint_names import (
    COMMITTED_RE,
    DCP_DIR,
    DCP_METADATA,
    FORMATS,
    MANIFEST,
    SAVE_MODES,
    SHARED,
    STATE_DCP,
    STATE_RANK,
    STATE_SHARED,
    rank_file,
)

__all__ = ["CheckpointInfo", "CorruptCheckpointError", "validate"]

_MAX_MANIFEST_BYTES: Final = 64 * 1024 * 1024


@dataclass(frozen=True, slots=True)
class CheckpointInfo:
    """A committed checkpoint whose manifest checked out."""

    step: int  # the last finished step; a resume runs step + 1 next
    path: Path
    world_size: int
    nbytes: int  # total size of the files listed in the manifest
    created: float  # unix time, for people
    format: int = 1
    # format 2: (class, where its state lives) of each object, in the order given to resume()
    objects: tuple[tuple[str, str], ...] = ()
    checksums: tuple[tuple[str, int], ...] = ()  # format 2: CRC-32 of the files in dcp/
    mode: str | None = None  # "sync" | "async": how it was saved (None: before this was recorded)
    blocked_s: float | None = None  # how long the training loop was blocked by the save
    external: str | None = None  # mode "external": the framework's checkpoint it marks durable


class CorruptCheckpointError(Exception):
    """A committed checkpoint that must not be loaded; ``reason`` (and ``str()``) says why."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def _is_int(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> TypeGuard[float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value >= 0


def _read_manifest(path: Path) -> dict[str, Any]:
    try:
        with open(path / MANIFEST, "rb") as f:
            raw = f.read(_MAX_MANIFEST_BYTES + 1)
    except FileNotFoundError:
        raise CorruptCheckpointError(f"missing {MANIFEST}") from None
    except OSError as e:
        raise CorruptCheckpointError(f"cannot read {MANIFEST}: {e.strerror}") from None
    if len(raw) > _MAX_MANIFEST_BYTES:
        raise CorruptCheckpointError(f"{MANIFEST} is too large")
    try:
        manifest = json.loads(raw)
    except (UnicodeDecodeError, ValueError):
        raise CorruptCheckpointError(f"{MANIFEST} is not valid JSON") from None
    if not isinstance(manifest, dict):
        raise CorruptCheckpointError(f"{MANIFEST} is not a JSON object")
    return manifest


def _good_name(name: str) -> bool:
    return bool(name) and name not in (".", "..") and "/" not in name and "\0" not in name


def _good_file_name(name: object, fmt: int) -> bool:
    """A file directly in the checkpoint directory, or (format 2) one inside ``dcp/``."""
    if not isinstance(name, str) or name == MANIFEST:
        return False
    if fmt >= 2 and name.startswith(DCP_DIR + "/"):
        return _good_name(name[len(DCP_DIR) + 1 :])
    return _good_name(name)


def _checked_files(manifest: dict[str, Any], world_size: int, fmt: int) -> dict[str, int]:
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise CorruptCheckpointError(f"{MANIFEST} has no 'files' object")
    for name, size in files.items():
        if not _good_file_name(name, fmt):
            raise CorruptCheckpointError(f"{MANIFEST} lists a bad file name {name!r}")
        if not _is_int(size) or size < 0:
            raise CorruptCheckpointError(f"{MANIFEST} has a bad size for {name}: {size!r}")
    if len(files) < world_size + 1:
        raise CorruptCheckpointError(
            f"{MANIFEST} lists {len(files)} files, fewer than world_size {world_size} needs"
        )
    for required in [SHARED, *(rank_file(r) for r in range(world_size))]:
        if required not in files:
            raise CorruptCheckpointError(f"{MANIFEST} does not list {required}")
    return files


def _checked_objects(
    manifest: dict[str, Any], files: dict[str, int]
) -> tuple[tuple[str, str], ...]:
    objects = manifest.get("objects")
    if not isinstance(objects, list):
        raise CorruptCheckpointError(f"{MANIFEST} has no 'objects' list")
    out = []
    for entry in objects:
        cls = entry.get("class") if isinstance(entry, dict) else None
        where = entry.get("state") if isinstance(entry, dict) else None
        if not isinstance(cls, str) or where not in (STATE_SHARED, STATE_DCP, STATE_RANK):
            raise CorruptCheckpointError(f"{MANIFEST} has a bad object entry {entry!r}")
        out.append((cls, str(where)))
    if any(where == STATE_DCP for _, where in out) and DCP_METADATA not in files:
        raise CorruptCheckpointError(f"{MANIFEST} does not list {DCP_METADATA}")
    return tuple(out)


def _checked_checksums(
    manifest: dict[str, Any], files: dict[str, int]
) -> tuple[tuple[str, int], ...]:
    sums = manifest.get("checksums")
    if not isinstance(sums, dict):
        raise CorruptCheckpointError(f"{MANIFEST} has no 'checksums' object")
    for name, crc in sums.items():
        if name not in files or not _is_int(crc) or not 0 <= crc < 2**32:
            raise CorruptCheckpointError(f"{MANIFEST} has a bad checksum for {name!r}: {crc!r}")
    unsummed = sorted(n for n in files if n.startswith(DCP_DIR + "/") and n not in sums)
    if unsummed:
        raise CorruptCheckpointError(f"{MANIFEST} has no checksum for {unsummed[0]}")
    return tuple(sorted(sums.items()))


def validate(path: Path) -> CheckpointInfo:
    """Check a committed checkpoint directory; raise :class:`CorruptCheckpointError` if bad.

    The manifest must parse, have a known format, name the step the directory is named
    for, list ``shared.pt`` and a rank file for every rank (format 2: also its objects, and
    a checksum for every file in ``dcp/``), and every listed file must exist with exactly
    the listed size. File contents are not read here.
    """
    path = Path(path)
    m = COMMITTED_RE.match(path.name)
    if not m:
        raise CorruptCheckpointError(f"{path.name!r} is not a committed checkpoint name")
    if path.is_symlink():
        raise CorruptCheckpointError("a symbolic link (rvsup never loads through one)")
    if not path.is_dir():
        raise CorruptCheckpointError("not a directory")
    manifest = _read_manifest(path)
    fmt = manifest.get("format")
    if not _is_int(fmt) or fmt not in FORMATS:
        raise CorruptCheckpointError(f"unknown format {fmt!r}")
    step = manifest.get("step")
    if not _is_int(step) or step != int(m.group(1)):
        raise CorruptCheckpointError(f"step {step!r} in {MANIFEST} does not match {path.name}")
    world_size = manifest.get("world_size")
    if not _is_int(world_size) or world_size < 1:
        raise CorruptCheckpointError(f"bad world_size {world_size!r}")
    created = manifest.get("created")
    if isinstance(created, bool) or not isinstance(created, (int, float)):
        raise CorruptCheckpointError(f"bad created time {created!r}")
    files = _checked_files(manifest, world_size, fmt)
    objects: tuple[tuple[str, str], ...] = ()
    checksums: tuple[tuple[str, int], ...] = ()
    if fmt >= 2:
        objects = _checked_objects(manifest, files)
        checksums = _checked_checksums(manifest, files)
    for name, size in files.items():
        try:
            st = os.stat(path / name)
        except FileNotFoundError:
            raise CorruptCheckpointError(f"missing file {name}") from None
        except OSError as e:
            raise CorruptCheckpointError(f"cannot stat {name}: {e.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise CorruptCheckpointError(f"{name} is not a regular file")
        if st.st_size != size:
            raise CorruptCheckpointError(f"{name} is {st.st_size} bytes, {MANIFEST} says {size}")
    mode = manifest.get("mode")
    blocked = manifest.get("blocked_s")
    external = manifest.get("external")
    return CheckpointInfo(
        step,
        path,
        world_size,
        sum(files.values()),
        float(created),
        fmt,
        objects,
        checksums,
        mode=mode if mode in SAVE_MODES else None,
        blocked_s=float(blocked) if _is_number(blocked) else None,
        external=external if mode == "external" and isinstance(external, str) else None,
    )
