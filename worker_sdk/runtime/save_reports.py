"""What a rank tells the supervisor (and its stderr) of how a save ended: committed, with its
timings, or failed; for synchronous saves (made here, each reported as it ends: :func:`save_sync`,
:func:`save_external`) and for the background writer's (off the per-step path: only the
runtime's slow path and its exit call these)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from worker_sdk.checkpoint.checkpointer import Checkpointer, SaveError
from worker_sdk.checkpoint.parallel import Stateful
from worker_sdk.contract import messages as m

from .channel import Channel

if TYPE_CHECKING:
    from worker_sdk.checkpoint.background.async_save import Outcome

__all__ = ["committed", "external", "outcome", "save_external", "save_failed", "save_sync"]


def save_sync(
    ck: Checkpointer,
    channel: Channel | None,
    rank: int,
    step: int,
    objects: Sequence[Stateful],
    extra: Any,
    *,
    stopping: bool,
) -> None:
    """A synchronous save of ``step``, reported as it ended. A failed save is reported and
    training goes on, unless ``stopping``: the stop has no checkpoint to leave on, and the
    error is raised (a failure)."""
    try:
        result = ck.save(step, objects, extra)
    except SaveError as e:
        if stopping:
            raise
        save_failed(channel, rank, step, str(e))
    else:
        if result.committed:
            committed(channel, step, result.seconds, result.path, result.nbytes, "sync")


def save_external(
    ck: Checkpointer, channel: Channel | None, rank: int, step: int, path: str
) -> None:
    """rvsup's marker of the framework's own checkpoint of ``step`` (``path``), committed and
    reported (a failed one is reported; training goes on)."""
    try:
        result = ck.save(step, (), path, external=path)
    except SaveError as e:
        save_failed(channel, rank, step, str(e))
    else:
        if result.committed:
            external(channel, step, result.seconds, result.path, path, result.nbytes)


def save_failed(channel: Channel | None, rank: int, step: int, reason: str) -> None:
    """The checkpoint of ``step`` failed: say so on stderr and to the supervisor."""
    print(
        f"rvsup: rank {rank}: the checkpoint of step {step} failed and is not "
        f"committed (training goes on): {reason}",
        file=sys.stderr,
    )
    if channel is not None:
        channel.send(m.CheckpointFailed(step, reason))


def outcome(channel: Channel | None, rank: int, ended: Outcome) -> None:
    """Tell the supervisor how an asynchronous save ended."""
    if ended.failed is not None:
        save_failed(channel, rank, ended.step, ended.failed)
    elif ended.committed:
        committed(
            channel,
            ended.step,
            ended.seconds,
            ended.path,
            ended.nbytes,
            "async",
            blocked_s=ended.blocked_s,
        )


def committed(
    channel: Channel | None,
    step: int,
    seconds: float,
    path: Path,
    nbytes: int,
    mode: str,
    *,
    blocked_s: float | None = None,
) -> None:
    """Rank 0 tells the supervisor that the checkpoint of ``step`` is committed."""
    if channel is not None:
        blocked = seconds if blocked_s is None else blocked_s
        channel.send(m.CheckpointCommitted(step, seconds, str(path), nbytes, mode, blocked))


def external(
    channel: Channel | None, step: int, seconds: float, marker: Path, path: str, nbytes: int
) -> None:
    """Rank 0 tells the supervisor that its marker of the framework's own checkpoint of ``step``
    (``path``: every rank reported its part durable, ``worker_sdk.checkpointed``) is committed."""
    if channel is not None:
        channel.send(m.CheckpointExternal(step, seconds, str(marker), path, nbytes))
