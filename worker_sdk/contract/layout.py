"""The on-disk layout of a checkpoint directory: names, validation, discovery and pruning.

This module never imports torch: the supervisor uses it to find the newest committed
checkpoint and the configuration preflight uses it to recognise a checkpoint directory.

Layout::

    <checkpoint_dir>/
      .rvsup                           marker: this directory is managed by rvsup
      .rvsup-protect                   a step, written by the supervisor: pruning keeps the
                                       newest checkpoint older than it (a rollback's target)
      step-0000000123/                 committed: 123 is the last finished step
        MANIFEST.json                  the only proof that the checkpoint is complete (below)
        shared.pt                      replicated state (plain modules, DDP, schedulers, ...),
                                       written once, by rank 0
        rank-00000.pt ...              per-rank state (RNG states, ``extra``, objects whose
                                       state differs between ranks), one per rank
        dcp/                           format 2, when some state is sharded (FSDP1, FSDP2,
          .metadata                    DTensor): a torch.distributed.checkpoint directory,
          __0_0.distcp ...             each rank's shards in its own files
      .tmp-step-0000000123-<tag>/      being written (or being removed); never loaded

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

A directory only ever gets a committed name by an atomic rename once it is complete, and
it loses that name (renamed to a temporary one) before it is deleted, so a committed name
never refers to a half-written or half-removed checkpoint.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, TypeGuard

COMMITTED_RE: Final[re.Pattern[str]] = re.compile(r"^step-(\d{10})$")
TEMP_RE: Final[re.Pattern[str]] = re.compile(r"^\.tmp-step-(\d{10})-(.+)$")
MARKER: Final = ".rvsup"
PROTECT: Final = ".rvsup-protect"
MANIFEST: Final = "MANIFEST.json"
SHARED: Final = "shared.pt"
DCP_DIR: Final = "dcp"
DCP_METADATA: Final = "dcp/.metadata"
FORMAT: Final = 2  # what this release writes
FORMATS: Final = frozenset({1, 2})  # what it loads
SAVE_MODES: Final = ("sync", "async", "external")  # a manifest's "mode"
# "external": a marker of the framework's own checkpoint (bring your own checkpoint): the rank
# files hold only RNG states and the path the script reported; the manifest's "external" names it
STATE_SHARED: Final = "shared"  # an object's state lives in shared.pt
STATE_DCP: Final = "dcp"  # an object's state lives in dcp/ (torch.distributed.checkpoint)
STATE_RANK: Final = "rank"  # each rank's own state of the object lives in its rank file

_MAX_STEP: Final = 10**10 - 1
_MAX_MANIFEST_BYTES: Final = 64 * 1024 * 1024
_REMOVAL_TAG_PREFIX: Final = "rm-"


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


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _MAX_STEP:
        raise ValueError(f"step must be an int in [0, {_MAX_STEP}], got {step!r}")


def committed_name(step: int) -> str:
    """``step-0000000123`` for step 123."""
    _check_step(step)
    return f"step-{step:010d}"


def temp_name(step: int, attempt_tag: str) -> str:
    """``.tmp-step-0000000123-<attempt_tag>``: where a checkpoint of ``step`` is written."""
    _check_step(step)
    if not attempt_tag or "/" in attempt_tag or "\0" in attempt_tag or "\n" in attempt_tag:
        raise ValueError(f"bad attempt tag {attempt_tag!r}")
    return f".tmp-step-{step:010d}-{attempt_tag}"


def rank_file(rank: int) -> str:
    """``rank-00000.pt``: the per-rank part of a checkpoint."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= 99999:
        raise ValueError(f"rank must be an int in [0, 99999], got {rank!r}")
    return f"rank-{rank:05d}.pt"


def is_rvsup_entry(name: str) -> bool:
    """True for names this layout owns: committed and temporary checkpoints, the marker, the
    pruning protection (and its partial file, left by a supervisor killed while writing it)."""
    if name in (MARKER, PROTECT, PROTECT + ".partial"):
        return True
    return bool(COMMITTED_RE.match(name)) or bool(TEMP_RE.match(name))


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


def scan(directory: Path) -> tuple[list[CheckpointInfo], list[tuple[Path, str]]]:
    """Valid committed checkpoints (newest first) and the committed ones skipped, with why.

    Temporary directories are neither listed nor reported: they are never loaded. A
    missing directory is an empty one.
    """
    directory = Path(directory)
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return [], []
    committed = sorted(
        ((int(m.group(1)), name) for name in names if (m := COMMITTED_RE.match(name))),
        reverse=True,
    )
    valid: list[CheckpointInfo] = []
    skipped: list[tuple[Path, str]] = []
    for _, name in committed:
        try:
            valid.append(validate(directory / name))
        except CorruptCheckpointError as e:
            skipped.append((directory / name, e.reason))
    return valid, skipped


def latest(directory: Path) -> CheckpointInfo | None:
    """The newest valid committed checkpoint, or None."""
    valid, _ = scan(directory)
    return valid[0] if valid else None


def fsync_dir(path: Path) -> None:
    """Make the entries of a directory (creations, renames) durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _remove_tree(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def discard(path: Path) -> None:
    """Remove a committed checkpoint: rename it to a temporary name first, then delete it.

    A crash part-way leaves a temporary directory (removed by a later prune), never a
    half-deleted directory under a committed name.
    """
    path = Path(path)
    m = COMMITTED_RE.match(path.name)
    if not m:
        raise ValueError(f"{path} is not a committed checkpoint")
    aside = path.with_name(temp_name(int(m.group(1)), _REMOVAL_TAG_PREFIX + os.urandom(6).hex()))
    os.rename(path, aside)
    fsync_dir(path.parent)
    _remove_tree(aside)


def read_protect(directory: Path) -> int | None:
    """The step in ``PROTECT`` (the earliest step an anomaly not yet confirmed may start at),
    or None when there is none or it is unreadable."""
    try:
        text = (Path(directory) / PROTECT).read_text()
    except (OSError, UnicodeDecodeError):
        return None
    return int(text) if text.strip().isdigit() else None


def write_protect(directory: Path, step: int | None) -> None:
    """Replace ``PROTECT`` atomically with ``step`` (None: remove it). Not fsynced: after a
    crash the supervisor writes it anew when the ranks report again."""
    path = Path(directory) / PROTECT
    if step is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return
    partial = path.with_name(PROTECT + ".partial")
    partial.write_text(str(step))
    os.replace(partial, path)


def prune(directory: Path, keep_last: int, *, current_attempt_tag: str | None = None) -> list[Path]:
    """Remove what can never be loaded or is no longer wanted; return the removed paths.

    - valid committed checkpoints beyond the newest ``keep_last`` (at least the newest
      valid one is always kept, whatever ``keep_last`` says), except the newest one older
      than the step in ``PROTECT``: the one a rollback for an anomaly not yet confirmed
      would go back to;
    - invalid committed directories older than the newest valid one;
    - temporary directories of other attempts, and those of ``current_attempt_tag`` older
      than the newest commit (a failed save); the others may be being written right now.

    Names that are not rvsup entries are never touched. Removal is best-effort: an entry
    that cannot be removed is left for the next prune.
    """
    directory = Path(directory)
    valid, skipped = scan(directory)
    protect = read_protect(directory)
    kept = next((info.step for info in valid if protect is not None and info.step < protect), None)
    doomed = [info.path for info in valid[max(1, keep_last) :] if info.step != kept]
    if valid:
        newest = valid[0].step
        for path, _ in skipped:
            m = COMMITTED_RE.match(path.name)
            if m and int(m.group(1)) < newest:
                doomed.append(path)
    removed: list[Path] = []
    for path in doomed:
        try:
            discard(path)
        except OSError:
            continue
        removed.append(path)
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return removed
    for name in names:
        m = TEMP_RE.match(name)
        if not m:
            continue
        # this attempt's: being written, unless older than the newest commit (saves end in
        # step order, so such a one failed and was abandoned)
        if m.group(2) == current_attempt_tag and (not valid or int(m.group(1)) >= valid[0].step):
            continue
        try:
            _remove_tree(directory / name)
        except OSError:
            continue
        removed.append(directory / name)
    return removed
