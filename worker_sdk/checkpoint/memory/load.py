"""Resuming from the memory tier: the snapshot the supervisor chose, verified, else storage.

The supervisor names the newest snapshot complete for every rank (``RVSUP_MEMORY_RESUME``).
The ranks load the newest snapshot they can all read among those newer than the newest storage
checkpoint and not newer than the one named: each file is checked against the manifest (sizes)
and its checksums (the CRC-32 of every record of the ``.pt`` files, of every DCP file), and a bad
one is passed over with its reason, exactly as a storage checkpoint is. None left: storage.
A storage checkpoint newer than storage's newest valid one that is damaged is reported skipped
with its reason, as a load from storage reports it, though the ranks resume from memory.

A restore that fails halfway (an object refused its state after others took theirs) is agreed
on by every rank, the snapshot is discarded (so that the next attempt does not choose it again),
and the ranks load storage's newest, which sets every object again. Without one to fall back to,
the ranks cannot undo what the half restore changed: they fail, and the next attempt starts
from what is left.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.checkpoint.collectives import all_gather_ints, group_active
from worker_sdk.checkpoint.grads import GradWatch
from worker_sdk.checkpoint.parallel import Stateful
from worker_sdk.checkpoint.restore import LoadResult, Restorer
from worker_sdk.contract import layout
from worker_sdk.contract import protocol as p

from . import nodes as _nodes
from .tier import MemoryTier, on_one_node

__all__ = ["load"]


def load(
    checkpointer: Checkpointer,
    objects: Sequence[Stateful],
    extra: Any,
    memory: MemoryTier | None = None,
) -> LoadResult:
    """Restore from the memory tier when the supervisor chose a snapshot, else from storage.
    On several nodes, every node's snapshots newer than the step resumed are discarded after.
    From then on both tiers' saves keep the gradients the script holds across steps
    (:class:`~worker_sdk.checkpoint.grads.GradWatch`)."""
    result = _restore(checkpointer, objects, extra, memory)
    watch = GradWatch(objects)
    checkpointer.gradients = watch
    if memory is not None:
        memory.checkpointer.gradients = watch
    return result


def _restore(
    checkpointer: Checkpointer,
    objects: Sequence[Stateful],
    extra: Any,
    memory: MemoryTier | None,
) -> LoadResult:
    nodes = None if memory is None else memory.nodes
    if memory is None or nodes is None:
        return _load(checkpointer, objects, extra, None)
    memory.connect()
    result = _load(checkpointer, objects, extra, memory)
    if nodes.is_leader(checkpointer.rank):
        # a rollback's, or snapshots of a step no longer the newest: another timeline
        with contextlib.suppress(OSError):
            resumed = -1 if result.step is None else result.step
            layout.discard_from(memory.checkpointer.directory, resumed + 1)
    return result


def _load(
    checkpointer: Checkpointer,
    objects: Sequence[Stateful],
    extra: Any,
    memory: MemoryTier | None,
) -> LoadResult:
    directory = os.environ.get(p.ENV_MEMORY_DIR)
    chosen = os.environ.get(p.ENV_MEMORY_RESUME)
    if (
        not directory
        or not chosen
        or not chosen.isdecimal()
        or (memory is None and not on_one_node(checkpointer.world_size))
    ):
        return checkpointer.load_latest(objects, extra)
    floor, damaged = _newest_storage_step(checkpointer.directory)
    lowest = 0 if floor is None else floor + 1
    snapshots, highest, source = Path(directory), int(chosen), "memory"
    nodes = None if memory is None else memory.nodes
    if memory is not None and nodes is not None:  # several nodes: each its own copy
        snapshots = memory.checkpointer.directory
        highest, healed = _nodes.heal(
            nodes,
            snapshots,
            rank=checkpointer.rank,
            lowest=lowest,
            highest=highest,
            attempt=checkpointer.attempt_tag,
        )
        if highest < 0:
            return _with_skipped(checkpointer.load_latest(objects, extra), damaged)
        source = "replica" if healed else "memory"
    restorer = Restorer(
        snapshots,
        rank=checkpointer.rank,
        world_size=checkpointer.world_size,
        plan=checkpointer.plan,
    )
    result: LoadResult | None = None
    error = ""
    try:
        result = restorer.load_latest(objects, extra, steps=(lowest, highest), source=source)
    except Exception as e:  # noqa: BLE001 - any failure of the restore falls back to storage
        error = f"{type(e).__name__}: {e}"
    failed = _failed_ranks(checkpointer, not error)
    if not failed:
        assert result is not None
        if result.step is not None:
            return _with_skipped(result, damaged)
        storage = checkpointer.load_latest(objects, extra)
        return _with_skipped(storage, result.skipped)
    where = snapshots / layout.committed_name(highest)
    reason = f"the restore failed on rank(s) {failed}" + (f": {error}" if error else "")
    if checkpointer.rank == 0 if nodes is None else nodes.is_leader(checkpointer.rank):
        for info in layout.scan(snapshots)[0]:
            if lowest <= info.step <= highest:
                with contextlib.suppress(OSError):
                    layout.discard(info.path)
    if floor is None:
        raise RuntimeError(
            f"rvsup: the restore from the memory snapshot {where} failed halfway ({reason}) "
            "and there is no storage checkpoint to restore instead"
        )
    return _with_skipped(checkpointer.load_latest(objects, extra), ((where, reason),))


def _newest_storage_step(directory: Path) -> tuple[int | None, tuple[tuple[Path, str], ...]]:
    """Storage's newest valid step (None: none), and the damaged ones newer than it."""
    valid, skipped = layout.scan(directory)
    before = os.environ.get(p.ENV_RESUME_BEFORE)
    steps = [info.step for info in valid if not before or info.step < int(before)]
    newest = steps[0] if steps else None
    damaged = tuple(
        (path, why)
        for path, why in skipped
        if (newest is None or _step(path) > newest) and (not before or _step(path) < int(before))
    )
    return newest, damaged


def _step(path: Path) -> int:
    match = layout.COMMITTED_RE.match(path.name)
    return -1 if match is None else int(match.group(1))


def _failed_ranks(checkpointer: Checkpointer, ok: bool) -> list[int]:
    if not group_active(checkpointer.rank, checkpointer.world_size):
        return [] if ok else [checkpointer.rank]
    return [r for r, (flag,) in enumerate(all_gather_ints([int(ok)])) if not flag]


def _with_skipped(result: LoadResult, skipped: Sequence[tuple[Path, str]]) -> LoadResult:
    import dataclasses

    return dataclasses.replace(result, skipped=(*skipped, *result.skipped))
