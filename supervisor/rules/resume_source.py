"""Where the next attempt resumes from: a memory snapshot (this node's, or a copy another node
sends a node that joins) or storage. Pure, table-tested.

The memory tier (docs/memory-tier.md) keeps the newest snapshots of every rank's state in host
memory. A snapshot counts only when it is complete for every rank (committed: every rank's part
written and checksummed, the manifest renamed into place: ``worker_sdk.contract.layout``), and it
is used only when it is newer than the newest storage checkpoint. The attempt after a rollback
for a loss anomaly (``resume_before``: its onset) resumes from storage, the checkpoint the
``rolled_back`` event names, never from memory: what it says was restored and skipped is what
happened (the rollback also discards the snapshots from the onset on). The ranks verify
the chosen snapshot's checksums as they load it and fall back to an older one, then
to storage (``worker_sdk.checkpoint.memory.load``).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

__all__ = ["ResumeChoice", "Source", "choose"]

Source = Literal["memory", "replica", "storage"]


@dataclass(frozen=True, slots=True)
class ResumeChoice:
    """The checkpoint the next attempt resumes from: its source and step (None: from scratch)."""

    source: Source | None
    step: int | None

    @property
    def resume_step(self) -> int:
        """The first step the attempt runs (before a rollback's skip)."""
        return 0 if self.step is None else self.step + 1


def choose(
    storage: int | None,
    snapshots: Iterable[int],
    *,
    resume_before: int | None = None,
    memory_on: bool = True,
    joining: bool = False,
) -> ResumeChoice:
    """The newest of ``storage`` (its newest checkpoint step, None: none) and the complete
    ``snapshots``' steps, a snapshot winning only when strictly newer; snapshots only when
    ``memory_on`` (the tier not off) and not after a rollback (``resume_before``). A snapshot
    is a ``replica`` when ``joining``: a node of the attempt ran none of the previous one (a
    spare in place of a lost node), so it holds no copy and gets one from a node that does."""
    usable = sorted(snapshots, reverse=True) if resume_before is None else []
    if memory_on and usable and (storage is None or usable[0] > storage):
        return ResumeChoice("replica" if joining else "memory", usable[0])
    if storage is None:
        return ResumeChoice(None, None)
    return ResumeChoice("storage", storage)
