"""How often the memory tier snapshots under ``memory_every_steps = "auto"``: a pure rule.

A snapshot blocks ``step()`` for ``blocked_s`` (capture, the copy into the staging arena, and
any wait for the previous snapshot's writer); training runs ``step_s`` per step. Snapshotting
every ``n`` steps costs ``blocked_s / (n * step_s + blocked_s)`` of the training time; the rule
picks the smallest ``n`` that keeps it at or under ``budget`` (1 %), at least 1 (every step,
when the state is small), at most ``ceiling``.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["BUDGET", "CEILING", "choose"]

BUDGET: Final = 0.01  # the share of training time snapshots may block step()
CEILING: Final = 10_000  # never fewer snapshots than one per this many steps


def choose(
    blocked_s: float, step_s: float, *, budget: float = BUDGET, ceiling: int = CEILING
) -> int:
    """The interval in steps: the smallest n >= 1 with blocked_s <= budget * (n * step_s +
    blocked_s), capped at ``ceiling``; ``ceiling`` when no step time is known yet."""
    if not 0 < budget < 1 or ceiling < 1:
        raise ValueError(f"bad budget {budget!r} or ceiling {ceiling!r}")
    if blocked_s <= 0:
        return 1
    if step_s <= 0 or not math.isfinite(step_s) or not math.isfinite(blocked_s):
        return ceiling
    n = math.ceil(blocked_s * (1 - budget) / (budget * step_s) - 1e-9)
    return max(1, min(ceiling, n))
