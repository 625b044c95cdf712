"""When the memory tier snapshots under ``memory_every_steps = "auto"``: a pure rule.

The budget is kept over the whole attempt, not per interval: the time ``step()`` has been blocked
by snapshots so far (``blocked_s``: their capture and copy into the staging arena, and the
all-gathers of the steps a snapshot was put off or checked) must stay at or under ``budget``
(1 %) of the time since the attempt's first step (``elapsed_s``), the next snapshot included,
whose cost is estimated by the previous one's (``next_blocked_s``). A snapshot is taken when
that holds; otherwise the rule says how many steps of ``step_s`` to wait until it will. So a
costly first snapshot (arenas allocated, pages touched for the first time) is paid back before
the second, and a snapshot every step is taken whenever one costs at most 1 % of a step.
"""

from __future__ import annotations

import math
from typing import Final

__all__ = ["BUDGET", "CEILING", "steps_to_wait"]

BUDGET: Final = 0.01  # the share of training time snapshots may block step()
CEILING: Final = 10_000  # never wait longer than this many steps for a snapshot


def steps_to_wait(
    blocked_s: float,
    elapsed_s: float,
    next_blocked_s: float,
    step_s: float,
    *,
    budget: float = BUDGET,
    ceiling: int = CEILING,
) -> int:
    """0 when a snapshot now keeps ``blocked_s + next_blocked_s <= budget * (elapsed_s +
    next_blocked_s)``; else the fewest steps of ``step_s`` after which it will, at most
    ``ceiling`` (``ceiling`` when no step time is known)."""
    if not 0 < budget < 1 or ceiling < 1:
        raise ValueError(f"bad budget {budget!r} or ceiling {ceiling!r}")
    if min(blocked_s, elapsed_s, next_blocked_s) < 0:
        raise ValueError(f"negative time: {blocked_s!r}, {elapsed_s!r}, {next_blocked_s!r}")
    owed = (blocked_s + next_blocked_s) / budget - next_blocked_s - elapsed_s
    if owed <= 0:
        return 0
    if not math.isfinite(owed) or step_s <= 0 or not math.isfinite(step_s):
        return ceiling
    return max(1, min(ceiling, math.ceil(owed / step_s - 1e-9)))
