"""The sharded part of an asynchronous save: DCP's planning in the rank, its writing in the writer.

DCP's save is a collective: the ranks agree on a plan (who writes which shard; a value every rank
holds identically is written once) and the coordinator builds the global metadata. That part
runs in the rank, at the save's step, like a synchronous save, through :class:`StagingWriter`: a
``StorageWriter`` whose ``write_data`` copies each item this rank must write into a shared-memory
arena instead of writing it. The writer process then writes the items into ``__<rank>_0.distcp``
the way DCP's ``FileSystemWriter`` does (each tensor a ``torch.save`` record, its offset and
length recorded), and the commit's process (rank 0's writer) completes the metadata with every
rank's offsets and writes ``.metadata``. The files load with DCP's ``FileSystemReader``.
"""

from __future__ import annotations

import os
import pickle
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.distributed.checkpoint.filesystem import _StorageInfo
from torch.distributed.checkpoint.metadata import Metadata, MetadataIndex, StorageMeta
from torch.distributed.checkpoint.planner import (
    SavePlan,
    SavePlanner,
    WriteItemType,
)
from torch.distributed.checkpoint.storage import StorageWriter, WriteResult
from torch.futures import Future

from worker_sdk.checkpoint import dcp as _dcp
from worker_sdk.checkpoint.commit import save_into
from worker_sdk.contract import layout

from . import arena as _arena
from .arena import Arena, StagedTensor
from .dcp_json import decode_metadata, encode_metadata

__all__ = ["Item", "StagingWriter", "finish_metadata", "stage", "write_items"]

_VERSION = "1.0.0"  # DCP's CURRENT_DCP_VERSION in the torch releases rvsup supports


@dataclass(frozen=True, slots=True)
class Item:
    """One write item of this rank: a staged tensor or bytes (DCP's BYTE_IO items)."""

    index: MetadataIndex
    tensor: StagedTensor | None
    data: bytes | None


class StagingWriter(StorageWriter):
    """A DCP storage writer that stages this rank's items instead of writing them."""

    def __init__(self, arena_for: Callable[[int], Arena]) -> None:
        super().__init__()
        self._arena_for = arena_for  # an arena of at least this many bytes
        self.items: list[Item] = []
        self.metadata: Metadata | None = None  # the coordinator's global metadata

    def reset(self, checkpoint_id: str | os.PathLike[str] | None = None) -> None:  # noqa: ARG002
        self.items, self.metadata = [], None

    def set_up_storage_writer(self, is_coordinator: bool, *args: Any, **kwargs: Any) -> None:
        pass

    def prepare_local_plan(self, plan: SavePlan) -> SavePlan:
        return plan

    def prepare_global_plan(self, plans: list[SavePlan]) -> list[SavePlan]:
        return plans

    def write_data(self, plan: SavePlan, planner: SavePlanner) -> Future[list[WriteResult]]:
        tensors: list[torch.Tensor] = []
        for item in plan.items:
            if item.type != WriteItemType.BYTE_IO:
                data = planner.resolve_data(item)
                assert isinstance(data, torch.Tensor)
                tensors.append(data.detach())
        arena = self._arena_for(_arena.needed_bytes(tensors))
        staged, _ = _arena.stage(tensors, arena)
        staged_iter = iter(staged)
        results = []
        for item in plan.items:
            if item.type == WriteItemType.BYTE_IO:
                blob = planner.resolve_data(item)
                assert not isinstance(blob, torch.Tensor)
                self.items.append(Item(item.index, None, blob.getvalue()))
            else:
                self.items.append(Item(item.index, next(staged_iter), None))
            results.append(WriteResult(index=item.index, size_in_bytes=0, storage_data=None))
        done: Future[list[WriteResult]] = Future()
        done.set_result(results)
        return done

    def finish(self, metadata: Metadata, results: list[list[WriteResult]]) -> None:  # noqa: ARG002
        self.metadata = metadata

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id: str | os.PathLike[str]) -> bool:  # noqa: ARG003
        return True


def stage(
    state: dict[str, Any], arena_for: Callable[[int], Arena], rank: int
) -> tuple[list[Item], dict[str, Any] | None]:
    """Plan (collectively) and stage this rank's part of ``state``; return its items and, on
    rank 0, the global metadata still lacking the files' offsets (as JSON values,
    :mod:`.dcp_json`: it travels to the other nodes in rank 0's marker, never as a pickle)."""
    from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
    from torch.distributed.checkpoint.state_dict_saver import save

    writer = StagingWriter(arena_for)
    # the plan of the same state is the same every save: DCP then skips sending it around
    save(state, storage_writer=writer, planner=DefaultSavePlanner(enable_plan_caching=True))
    metadata = None
    if rank == 0:
        assert writer.metadata is not None
        metadata = encode_metadata(writer.metadata)
    return writer.items, metadata


def write_items(
    items: Sequence[Item], arena: Arena, directory: Path, rank: int
) -> tuple[list[tuple[MetadataIndex, _StorageInfo]], int]:
    """Write this rank's items into ``directory/__<rank>_0.distcp`` durably; return where each
    item is in it and the file's CRC-32."""
    name = f"__{rank}_0.distcp"
    directory.mkdir(mode=0o700, exist_ok=True)
    where = []
    with open(directory / name, "wb") as f:
        for item in items:
            offset = f.tell()
            if item.data is not None:
                f.write(item.data)
            else:
                assert item.tensor is not None
                save_into(f, arena.view(item.tensor))
            where.append((item.index, _StorageInfo(name, offset, f.tell() - offset)))
        f.flush()
        os.fsync(f.fileno())
    crc = _dcp.seal(directory / name)
    layout.fsync_dir(directory)
    return where, crc


def finish_metadata(
    metadata: dict[str, Any], where: Sequence[tuple[MetadataIndex, _StorageInfo]], directory: Path
) -> int:
    """Write ``.metadata`` (the global plan with every rank's offsets, in DCP's own format: a
    pickle, which DCP reads only from a trusted directory), durably; its CRC-32."""
    md = decode_metadata(metadata)
    md.version = _VERSION
    md.storage_data = dict(where)
    md.storage_meta = StorageMeta(checkpoint_id=str(directory), save_id=str(uuid.uuid4()))
    path = directory / ".metadata"
    with open(path, "wb") as f:
        pickle.dump(md, f)
        f.flush()
        os.fsync(f.fileno())
    crc = _dcp.seal(path)
    layout.fsync_dir(directory)
    return crc
