"""When silence means a hang: the hang timeout rule (pure).

A rank reports its last finished step with every heartbeat, and with it the longest step it took
since the previous heartbeat. With ``hang_timeout = "auto"`` the timeout is::

    min(ceiling, max(FLOOR_S, 2 x heartbeat interval + FACTOR x p99(longest steps)))

over the last 256 heartbeats of every rank (FACTOR = 10, FLOOR_S = 5 s, ceiling =
``hang_timeout_max``, 30 min by default). Before the first finished step, ``startup_timeout``
applies instead. While a rank writes a checkpoint or is inside ``worker_sdk.phase()`` its silence
is judged against ``max(timeout, startup_timeout)``: saves and declared phases may be long.
A configured ``hang_timeout`` replaces the automatic value (the same extensions apply).
A silence past its limit is a hang only once :mod:`supervisor.rules.stuck` judges the group
stuck; a busy group gets until ``hang_timeout_max``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sortedcontainers import SortedList  # type: ignore[import-untyped]

__all__ = [
    "FACTOR",
    "FLOOR_S",
    "PERCENTILE",
    "Silence",
    "StepTimes",
    "auto_timeout",
    "hung_ranks",
    "percentile",
    "quiet_ranks",
]

FACTOR = 10.0
FLOOR_S = 5.0
PERCENTILE = 0.99


def percentile(values: Sequence[float], q: float) -> float:
    """The ``q`` quantile (nearest rank) of a non-empty sequence."""
    ordered = sorted(values)
    return ordered[_nearest_rank(len(ordered), q)]


def _nearest_rank(n: int, q: float) -> int:
    return min(n - 1, max(0, int(q * n + 0.999999) - 1))


def auto_timeout(p99: float | None, *, interval_s: float, ceiling_s: float) -> float | None:
    """The automatic hang timeout from the p99 step duration, or None before any was observed."""
    if p99 is None:
        return None
    learned = 2 * interval_s + FACTOR * p99
    return min(ceiling_s, max(FLOOR_S, learned))


class StepTimes:
    """Every rank's recent per-heartbeat longest-step durations as one sorted multiset, so that
    the p99 the tick reads ten times a second is one lookup: with 4096 ranks x 256 heartbeats,
    sorting them on every tick would take most of a core."""

    def __init__(self) -> None:
        self._sorted: Any = SortedList()

    def __len__(self) -> int:
        return len(self._sorted)

    def add(self, seconds: float) -> None:
        self._sorted.add(seconds)

    def remove(self, seconds: float) -> None:
        self._sorted.remove(seconds)

    def clear(self) -> None:
        self._sorted.clear()

    def percentile(self, q: float) -> float | None:
        """The ``q`` quantile, by the same nearest rank as :func:`percentile`; None if empty."""
        n = len(self._sorted)
        if n == 0:
            return None
        return float(self._sorted[_nearest_rank(n, q)])


@dataclass(frozen=True, slots=True)
class Silence:
    """One rank's situation, as the hang check sees it."""

    rank: int
    silent_s: float  # seconds since its last progress (or since the attempt started)
    started: bool  # has it finished a step in this attempt?
    busy: bool  # saving a checkpoint or inside a declared phase


def hung_ranks(
    ranks: Sequence[Silence],
    *,
    timeout_s: float | None,
    startup_timeout_s: float,
    margin_s: float = 0.0,
) -> tuple[int, ...]:
    """Ranks whose silence exceeds what is allowed for their situation; with ``margin_s``,
    the ranks that will be hung if they stay silent that much longer."""
    out = []
    for r in ranks:
        if not r.started or timeout_s is None:
            limit = startup_timeout_s
        elif r.busy:
            limit = max(timeout_s, startup_timeout_s)
        else:
            limit = timeout_s
        if r.silent_s > limit - margin_s:
            out.append(r.rank)
    return tuple(out)


def quiet_ranks(
    silences: Sequence[Silence], hung: Sequence[int], last_steps: Mapping[int, int]
) -> tuple[tuple[int, ...], float]:
    """The ranks to name for a hang, and the longest silence among the hung ones.

    Every rank quiet for at least half that long is part of the hang (in lock-step training the
    others wait in a collective); the furthest behind come first, then the longest silent.
    """
    limit = max(s.silent_s for s in silences if s.rank in hung)
    quiet = [s for s in silences if s.silent_s >= limit / 2]
    quiet.sort(key=lambda s: (last_steps.get(s.rank, -1), -s.silent_s))
    return tuple(s.rank for s in quiet), limit
