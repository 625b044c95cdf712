"""The on-disk layout of a checkpoint directory: discovery, removal and pruning, and (re-exported
here, the one place to import them from) its names (:mod:`.checkpoint_names`) and the manifest
reader (:mod:`.manifest`).

This module never imports torch: the supervisor uses it to find the newest committed
checkpoint and the configuration preflight uses it to recognise a checkpoint directory.

Layout::

    <checkpoint_dir>/
      .rvsup                           marker: this directory is managed by rvsup
      .rvsup-protect                   a step, written by the supervisor: pruning keeps the
                                       newest checkpoint older than it (a rollback's target)
      step-0000000123/                 committed: 123 is the last finished step
        MANIFEST.json                  the only proof that the checkpoint is complete
                                       (:mod:`.manifest`)
        shared.pt                      replicated state (plain modules, DDP, schedulers, ...),
                                       written once, by rank 0
        rank-00000.pt ...              per-rank state (RNG states, ``extra``, objects whose
                                       state differs between ranks), one per rank
        dcp/                           format 2, when some state is sharded (FSDP1, FSDP2,
          .metadata                    DTensor): a torch.distributed.checkpoint directory,
          __0_0.distcp ...             each rank's shards in its own files
      .tmp-step-0000000123-<tag>/      being written (or being removed); never loaded

A directory only ever gets a committed name by an atomic rename once it is complete, and
it loses that name (renamed to a temporary one) before it is deleted, so a committed name
never refers to a half-written or half-removed checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
from pathlib import Path
from typing import Final

from .checkpoint_names import (
    ARENA_DCP,
    ARENA_LOCAL,
    COMMITTED_RE,
    DCP_DIR,
    DCP_METADATA,
    FORMAT,
    FORMATS,
    MANIFEST,
    MARKER,
    PROTECT,
    SAVE_MODES,
    SHARED,
    STATE_DCP,
    STATE_RANK,
    STATE_SHARED,
    TEMP_RE,
    committed_name,
    is_rvsup_entry,
    rank_file,
    temp_name,
)
from .manifest import CheckpointInfo, CorruptCheckpointError, validate

__all__ = [
    "ARENA_DCP",
    "ARENA_LOCAL",
    "COMMITTED_RE",
    "DCP_DIR",
    "DCP_METADATA",
    "FORMAT",
    "FORMATS",
    "MANIFEST",
    "MARKER",
    "PROTECT",
    "SAVE_MODES",
    "SHARED",
    "STATE_DCP",
    "STATE_RANK",
    "STATE_SHARED",
    "TEMP_RE",
    "CheckpointInfo",
    "CorruptCheckpointError",
    "committed_name",
    "discard",
    "discard_from",
    "fsync_dir",
    "is_rvsup_entry",
    "latest",
    "node_folder",
    "prune",
    "rank_file",
    "read_protect",
    "scan",
    "temp_name",
    "validate",
    "write_protect",
]

_REMOVAL_TAG_PREFIX: Final = "rm-"


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


def node_folder(directory: Path) -> Path:
    """This node's folder of a job's snapshots when the job runs on several nodes: each node
    keeps its own copy of every snapshot, in a folder named for its host (which keeps nodes
    that share a tmpfs apart)."""
    return directory / socket.gethostname()


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


def discard_from(directory: Path, step: int) -> tuple[tuple[int, ...], list[CheckpointInfo]]:
    """Discard the valid committed checkpoints of ``step`` or later (a rollback: they may hold
    the damage): the steps discarded (newest first; one that could not be removed is not
    among them) and the valid ones before ``step``, newest first."""
    valid, _ = scan(directory)
    gone = []
    for info in valid:
        if info.step >= step:
            with contextlib.suppress(OSError):
                discard(info.path)
                gone.append(info.step)
    return tuple(gone), [info for info in valid if info.step < step]


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
