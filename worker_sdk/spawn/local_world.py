"""How many of the job's ranks run on this node (standard library only): the ranks ask before
they take or load a snapshot (on several nodes, every node keeps a copy of each), and when they
size the snapshots a node holds."""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["every_rank_here", "ranks_here"]


def every_rank_here(env: Mapping[str, str], world_size: int | None = None) -> bool:
    """Whether torchrun's ``LOCAL_WORLD_SIZE`` is the whole world (``world_size``, or the
    environment's ``WORLD_SIZE``; 1 where neither says). Unset: a job of one node. A value
    that is not a number: not known to be one node."""
    try:
        world = int(env.get("WORLD_SIZE") or 1) if world_size is None else world_size
        return int(env.get("LOCAL_WORLD_SIZE") or world) == world
    except ValueError:
        return False


def ranks_here(env: Mapping[str, str], world_size: int) -> int:
    """torchrun's ``LOCAL_WORLD_SIZE``, within [1, ``world_size``]; the whole world where it is
    unset or not a number (the most a node can hold: a size worked out from it is an upper
    bound)."""
    try:
        return max(1, min(world_size, int(env.get("LOCAL_WORLD_SIZE") or world_size)))
    except ValueError:
        return max(1, world_size)
