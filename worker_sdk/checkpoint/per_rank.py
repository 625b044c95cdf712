"""Which objects' state differs between ranks: those are saved by every rank, in its rank file.

Modules and optimizers are replicated (DDP) or sharded (FSDP) by construction. Any other object
given to ``resume()`` (an LR scheduler, a GradScaler, a data loader, a sampler, a user object)
may hold the same state on every rank or each its own (a stateful data loader's position in its
rank's shard). At every save each rank takes a digest of each such object's state, and the ranks
compare them in one small all-gather; an object whose digests differ is saved by every rank
(``STATE_RANK``), never rank 0's state for everyone. Without a process group to compare over,
every such object of a job of several ranks is saved per rank.
"""

from __future__ import annotations

import hashlib
import io
from collections.abc import Callable, Sequence
from typing import Any

import torch

from .parallel import unwrap

__all__ = ["digest", "split"]

KIND_OTHER = "other"  # _parallel.plan's kind of an object that is neither module nor optimizer


def split(
    kinds: Sequence[str],
    objects: Sequence[Any],
    *,
    world_size: int,
    gather: Callable[[list[int]], list[list[int]]] | None,
) -> tuple[frozenset[int], dict[int, Any]]:
    """The objects whose state differs between ranks, and the state of every candidate.

    Collective when ``gather`` is given: every rank must call it at the same save. A
    ``state_dict()`` that raises is raised after the collective, so no rank waits in it alone.
    """
    candidates = [i for i, kind in enumerate(kinds) if kind == KIND_OTHER]
    states: dict[int, Any] = {}
    digests: list[int] = []
    error: Exception | None = None
    for i in candidates:
        try:
            states[i] = unwrap(objects[i]).state_dict()
            digests.append(digest(states[i]))
        except Exception as e:  # noqa: BLE001 - raised below, once the ranks have compared
            error = error or e
            digests.append(0)
    if world_size == 1 or not candidates:
        differ: set[int] = set()
    elif gather is None:
        differ = set(candidates)
    else:
        rows = gather(digests)
        differ = {i for col, i in enumerate(candidates) if len({row[col] for row in rows}) > 1}
    if error is not None:
        raise error
    return frozenset(differ), states


def digest(state: Any) -> int:
    """A 64-bit digest of ``state`` as torch.save writes it (tensors' bytes included)."""
    buffer = io.BytesIO()
    torch.save(state, buffer)
    return int.from_bytes(
        hashlib.blake2b(buffer.getbuffer(), digest_size=8).digest(), "little", signed=True
    )
