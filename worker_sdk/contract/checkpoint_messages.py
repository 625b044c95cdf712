"""The messages of checkpoints: the saves the ranks report (begun, committed, failed, skipped at
load, the memory tier's snapshots), what they resumed from, and the coordinated-save handshake
(SYNC from the ranks; SYNC_REQUEST, CONTINUE, SAVE_AT and SYNC_CANCEL from the supervisor).
Read and written by :mod:`.messages`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .protocol import Kind

__all__ = [
    "CheckpointBegin",
    "CheckpointCommitted",
    "CheckpointExternal",
    "CheckpointFailed",
    "CheckpointSkipped",
    "Continue",
    "Loaded",
    "SaveAt",
    "Snapshots",
    "Sync",
    "SyncCancel",
    "SyncRequest",
]


# ---------------------------------------------------------------- rank -> supervisor
@dataclass(frozen=True, slots=True)
class Sync:
    """In a coordinated save: finished ``step``, waiting for CONTINUE or SAVE_AT."""

    KIND: ClassVar = Kind.SYNC
    step: int


@dataclass(frozen=True, slots=True)
class CheckpointBegin:
    """A save of ``step`` started: hang detection allows for it."""

    KIND: ClassVar = Kind.CKPT_BEGIN
    step: int


@dataclass(frozen=True, slots=True)
class CheckpointCommitted:
    """Rank 0 committed the checkpoint of ``step``."""

    KIND: ClassVar = Kind.CKPT_COMMITTED
    step: int
    seconds: float
    path: str
    nbytes: int | None = None
    mode: str | None = None  # "sync" | "async"
    blocked_s: float | None = None  # how long training waited for it


@dataclass(frozen=True, slots=True)
class CheckpointExternal:
    """Rank 0: every rank reported the framework's own checkpoint of ``step`` durable
    (``worker_sdk.checkpointed``), and rvsup's marker of it (``path``) is committed."""

    KIND: ClassVar = Kind.CKPT_EXTERNAL
    step: int
    seconds: float
    path: str  # rvsup's marker (a committed checkpoint of mode "external")
    external: str  # the framework's checkpoint, as the script named it
    nbytes: int | None = None


@dataclass(frozen=True, slots=True)
class CheckpointFailed:
    """The save of ``step`` failed (nothing of it is committed; training goes on)."""

    KIND: ClassVar = Kind.CKPT_FAILED
    step: int
    reason: str


@dataclass(frozen=True, slots=True)
class CheckpointSkipped:
    """A torn or corrupt checkpoint was passed over at load."""

    KIND: ClassVar = Kind.CKPT_SKIPPED
    path: str
    reason: str


@dataclass(frozen=True, slots=True)
class Loaded:
    """What the rank resumed from: ``path`` None on a fresh start."""

    KIND: ClassVar = Kind.LOADED
    step: int  # the resume step
    path: str | None
    world_size: int | None = None  # the ranks that wrote it
    resharded_from: int | None = None  # that number when it differs from this job's
    source: str | None = None  # "memory" | "storage"; None on a fresh start


@dataclass(frozen=True, slots=True)
class Snapshots:
    """Rank 0's summary of the memory tier's snapshots in this attempt (docs/memory-tier.md)."""

    KIND: ClassVar = Kind.SNAPSHOTS
    newest: int  # the newest complete snapshot's step; -1: none yet
    blocked_s: float  # step() blocked by snapshots so far
    count: int | None  # snapshots completed so far
    nbytes: int | None  # of the newest
    interval: int | None  # steps between snapshots (chosen, when "auto")
    failed: str | None = None  # why the tier is off for the rest of the attempt


# ---------------------------------------------------------------- supervisor -> rank
@dataclass(frozen=True, slots=True)
class SyncRequest:
    """Enter sync mode at the next heartbeat (``stop``: exit after the save)."""

    KIND: ClassVar = Kind.SYNC_REQUEST
    stop: bool = False


@dataclass(frozen=True, slots=True)
class Continue:
    """Answer to SYNC: go on with the next step."""

    KIND: ClassVar = Kind.CONTINUE


@dataclass(frozen=True, slots=True)
class SaveAt:
    """Answer to SYNC: save after finishing ``step`` (``stop``: then exit)."""

    KIND: ClassVar = Kind.SAVE_AT
    step: int
    stop: bool = False


@dataclass(frozen=True, slots=True)
class SyncCancel:
    """Answer to SYNC when no coordinated save is pending: leave sync mode."""

    KIND: ClassVar = Kind.SYNC_CANCEL
