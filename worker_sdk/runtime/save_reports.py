"""What a rank tells the supervisor (and its stderr) of how a save ended: committed, with its
timings, or failed; for synchronous saves and for the background writer's (off the per-step
path: only the runtime's slow path and its exit call these)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from worker_sdk.contract import messages as m

from .channel import Channel

if TYPE_CHECKING:
    from worker_sdk.checkpoint.background.async_save import Outcome

__all__ = ["committed", "outcome", "save_failed"]


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
