"""Checkpoints committed, failed, skipped and loaded, and ranks started cold instead of forked.

Part of :mod:`supervisor.record.schema` (its docstring: what an event is). Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

from supervisor.record.schema.base import Event

__all__ = [
    "CheckpointCommitted",
    "CheckpointFailed",
    "CheckpointLoaded",
    "CheckpointSkipped",
    "ColdStart",
]


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointCommitted(Event):
    """A checkpoint was committed (renamed into place) during the attempt."""

    NAME = "checkpoint_committed"
    LEVEL = "info"
    DIGITS: ClassVar[Mapping[str, int]] = {"seconds": 4, "blocked_s": 4}
    step: int
    """The checkpoint's step."""
    path: str
    """Its directory."""
    seconds: float | None
    """From the start of the save to the commit; None when not measured."""
    bytes: int
    """Its size on disk."""
    source: str
    """Who saw the commit first: ``"sdk"`` (a rank's report), ``"watchdog"`` (the directory) or
    ``"found"`` (on disk at the next start: the attempt's supervisor was lost before it saw it)."""
    world_size: int | None = None
    """The number of ranks that wrote it."""
    format: int | None = None
    """Its manifest's format: 1 replicated state only, 2 with sharded state (``dcp/``)."""
    mode: str | None = None
    """``"sync"`` (training waited for the commit) or ``"async"`` (written in the background)."""
    blocked_s: float | None = None
    """How long the training loop was blocked by the save (async: while the state was staged)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointFailed(Event):
    """A save failed (on storage, or its background writer); nothing of it was committed,
    training went on."""

    NAME = "checkpoint_failed"
    LEVEL = "warning"
    step: int
    """The step whose checkpoint failed."""
    rank: int
    """The rank whose part failed."""
    reason: str
    """What went wrong (an exception, ENOSPC, the writer process killed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSkipped(Event):
    """A torn or corrupt checkpoint was passed over on resume (the previous one was loaded)."""

    NAME = "checkpoint_skipped"
    LEVEL = "warning"
    path: str
    """The checkpoint skipped."""
    reason: str
    """What was wrong with it."""
    rank: int | None
    """The rank that found out; None if unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointLoaded(Event):
    """What the ranks loaded, as they report it; differs from attempt_started's when that one
    proved corrupt on reading."""

    NAME = "checkpoint_loaded"
    LEVEL = "info"
    resume_step: int
    """The first step the ranks run: the loaded checkpoint's step + 1, or 0."""
    checkpoint: str | None
    """The checkpoint loaded; None when the ranks start from scratch."""
    world_size: int | None = None
    """The number of ranks that wrote it; None when unknown or from scratch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ColdStart(Event):
    """Ranks started cold instead of forked from the node's zygote, and why (another interpreter,
    an import-time variable that differs, an unsafe import, the zygote's death)."""

    NAME = "cold_start"
    LEVEL = "warning"
    ranks: tuple[int, ...]
    """The ranks concerned; empty: every rank of the node."""
    reason: str
    """One human sentence."""
