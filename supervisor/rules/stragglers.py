"""Stragglers: which rank makes the others wait (pure: no I/O, no clock; times are handed in).

Under DDP every rank's step lasts as long as the slowest rank's: the gradient all-reduce at the
end of the backward pass finishes only once the last rank has joined it. What differs between
the ranks is how long each of them *waits* there after its own backward is done: the rank that
makes the others wait waits (almost) not at all, the others wait for it. The SDK reads that wait
from DDP's own runtime statistics (``worker_sdk.runtime.stragglers``) and sends it with its heartbeats
(``comm_wait_s``, one sample per heartbeat at most); durations only, so nodes' clocks need not
agree.

The rule (:func:`judge`), over a window of recent samples (one per heartbeat that carries a wait:
the wait per step, and the seconds per step since the rank's previous heartbeat):

- each rank's wait is the median of its samples (a checkpoint save or a hiccup in a few of them
  does not move it); a rank with fewer than :data:`MIN_SAMPLES` is not judged;
- the candidate is the rank that waits least; the others' wait is the median of the other ranks'
  waits; their difference is how much longer every step is because of the candidate;
- it is a straggler when that difference is at least :data:`MIN_SHARE` of the step time (and at
  least :data:`MIN_LOST_S`): a job whose ranks are all equally slow has no straggler, since every
  rank waits equally little.

What the event says is taken from the same samples: ``slower`` is the straggler's compute time
per step (the step less the wait, the median of its samples) over the median of the other ranks'
compute times; ``lost_s`` is the time the other ranks spent waiting for it over the window (the
median of the other ranks' summed waits, each sample's wait times the steps it covers, less the
straggler's own). :class:`StragglerWatch` keeps the windows (:data:`WINDOW_S`), judges them, and
names a straggler once the rule has found the same rank for :data:`CONFIRM_S` (a rank
descheduled for a few seconds is not named); it says when a straggler is first named, when
another rank becomes it, and forgets it once the rule has found none for a whole window.
"""

from __future__ import annotations

import bisect
import statistics
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import NamedTuple

__all__ = [
    "CONFIRM_S",
    "MIN_LOST_S",
    "MIN_SAMPLES",
    "MIN_SHARE",
    "WINDOW_S",
    "Columns",
    "Named",
    "Sample",
    "Straggler",
    "StragglerWatch",
    "judge",
    "judge_columns",
]

WINDOW_S = 20.0
"""The samples of the last this many seconds are judged (detection well within 60 s of onset);
a rank's last :data:`MIN_SAMPLES` samples are kept however old (steps slower than 2 s: one
sample per step)."""
MIN_SAMPLES = 10
"""Samples a rank needs in the window to be judged."""
CONFIRM_S = 5.0
"""A rank is named once the rule has found it for this long."""
MIN_SHARE = 0.2
"""The others must wait at least this share of a step for the candidate."""
MIN_LOST_S = 0.005
"""...and at least this long per step (tiny steps' scheduling noise is not a straggler)."""
_BUSY_FLOOR = 0.01  # of the step: the least compute time per step ``slower`` divides by


class Sample(NamedTuple):
    """One heartbeat's figures of a rank."""

    wait_s: float
    """Seconds it waited for the others per step."""
    step_s: float
    """Seconds per step since its previous heartbeat."""
    steps: int = 1
    """The steps since its previous heartbeat."""


class Columns(NamedTuple):
    """A rank's samples as columns, oldest first (what :class:`StragglerWatch` keeps: thousands
    of ranks' windows, each a few contiguous arrays of numbers rather than an object per
    sample, are sorted in C and never walked by the garbage collector)."""

    waits: Sequence[float]
    step_s: Sequence[float]
    steps: Sequence[float]

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Columns:
        return cls(
            [x.wait_s for x in samples], [x.step_s for x in samples], [x.steps for x in samples]
        )


@dataclass(frozen=True, slots=True)
class Straggler:
    """A rank the others wait for, with the figures of the window it was judged over."""

    rank: int
    wait_s: float
    """Its median wait per step."""
    others_wait_s: float
    """The median of the other ranks' median waits per step."""
    step_s: float
    """The step time: the median over the ranks of their median seconds per step."""
    slower: float
    """Its compute time per step over the median of the others' (3.0: three times as long)."""
    lost_s: float
    """Seconds the other ranks spent waiting for it over the window (the median rank)."""

    @property
    def lost_per_step_s(self) -> float:
        """How much longer every step is because of it: what the others wait for it per step."""
        return self.others_wait_s - self.wait_s


def judge(samples: Mapping[int, Sequence[Sample]]) -> Straggler | None:
    """The straggler among ranks whose recent samples are ``samples``; None when there is none
    (module docstring)."""
    return judge_columns({r: Columns.of(v) for r, v in samples.items()})


def judge_columns(columns: Mapping[int, Columns]) -> Straggler | None:
    """:func:`judge` of the ranks' samples as columns."""
    judged = {r: c for r, c in columns.items() if len(c.waits) >= MIN_SAMPLES}
    if len(judged) < 2:
        return None
    waits: dict[int, float] = {}
    steps: list[float] = []
    for r, c in judged.items():  # thousands of ranks: each column sorted in C
        waits[r] = _median_of(sorted(c.waits))
        steps.append(_median_of(sorted(c.step_s)))
    step_s = statistics.median(steps)
    if not step_s > 0:
        return None
    rank = min(waits, key=lambda r: (waits[r], r))
    others = [r for r in judged if r != rank]
    others_wait = statistics.median(waits[r] for r in others)
    lost_per_step = others_wait - waits[rank]
    if lost_per_step < MIN_LOST_S or lost_per_step < MIN_SHARE * step_s:
        return None
    busy = {  # compute time per step: the step less the wait
        r: statistics.median(max(0.0, s - w) for w, s in zip(c.waits, c.step_s, strict=True))
        for r, c in judged.items()
    }
    busy_others = max(statistics.median(busy[r] for r in others), _BUSY_FLOOR * step_s)
    waited = {  # each sample's wait times its steps
        r: sum(w * n for w, n in zip(c.waits, c.steps, strict=True)) for r, c in judged.items()
    }
    lost = max(0.0, statistics.median(waited[r] for r in others) - waited[rank])
    return Straggler(rank, waits[rank], others_wait, step_s, busy[rank] / busy_others, lost)


def _median_of(ordered: Sequence[float]) -> float:
    """The median of ``ordered`` (sorted, not empty), as :func:`statistics.median` gives it."""
    n = len(ordered)
    i = n // 2
    return ordered[i] if n % 2 else (ordered[i - 1] + ordered[i]) / 2


class _RankWindow:
    """A rank's samples as columns (:class:`Columns`), with when each was heard."""

    __slots__ = ("at", "last_step", "last_t", "step_s", "steps", "waits")

    def __init__(self) -> None:
        self.last_t: float | None = None  # time and step of its previous heartbeat
        self.last_step = 0
        self.at, self.waits, self.step_s, self.steps = (array("d") for _ in range(4))

    def drop_before(self, start: float) -> None:
        """Drop the samples heard before ``start``, but the newest :data:`MIN_SAMPLES`."""
        old = min(bisect.bisect_left(self.at, start), len(self.at) - MIN_SAMPLES)
        if old > 0:
            for column in (self.at, self.waits, self.step_s, self.steps):
                del column[:old]

    @property
    def columns(self) -> Columns:
        return Columns(self.waits, self.step_s, self.steps)


@dataclass(frozen=True, slots=True)
class Named:
    """What :meth:`StragglerWatch.judge` says changed: a straggler newly named (or another rank
    named instead), with the window it was judged over."""

    straggler: Straggler
    window_s: float
    samples: int
    """The fewest samples a judged rank had."""


class StragglerWatch:
    """The ranks' recent samples and the straggler named from them (times in seconds)."""

    def __init__(self, window_s: float = WINDOW_S) -> None:
        self.window_s = window_s
        self._ranks: dict[int, _RankWindow] = {}
        self.current: Straggler | None = None
        """The straggler named, until the rule has found none for a whole window."""
        self.since: float | None = None
        """When ``current`` was named."""
        self._last_seen = 0.0
        self._candidate: tuple[int, float] | None = None  # (rank, since when the rule finds it)

    @property
    def ranks_heard(self) -> int:
        """How many ranks' heartbeats it has seen."""
        return len(self._ranks)

    def observe(self, rank: int, now: float, step: int, wait_s: float | None) -> None:
        """A heartbeat of ``rank`` at ``step``, with its wait per step when it carried one."""
        w = self._ranks.get(rank)
        if w is None:
            w = self._ranks[rank] = _RankWindow()
        last_t, last_step = w.last_t, w.last_step
        w.last_t, w.last_step = now, step
        if last_t is None or wait_s is None or not wait_s >= 0:
            return
        steps, seconds = step - last_step, now - last_t
        if steps > 0 and seconds > 0:  # a sample into each column
            w.at.append(now)
            w.waits.append(wait_s)
            w.step_s.append(seconds / steps)
            w.steps.append(steps)

    def judge(self, now: float) -> Named | None:
        """Judge the window ending at ``now``: a :class:`Named` when a straggler is named that
        was not the one named before."""
        start = now - self.window_s
        for w in self._ranks.values():  # a rank's last MIN_SAMPLES stay: slow steps
            w.drop_before(start)
        judged = {r: w for r, w in self._ranks.items() if len(w.at) >= MIN_SAMPLES}
        found = judge_columns({r: w.columns for r, w in judged.items()})
        if found is None:
            self._candidate = None
            if self.current is not None and now - self._last_seen >= self.window_s:
                self.current, self.since = None, None
            return None
        if self._candidate is None or self._candidate[0] != found.rank:
            self._candidate = (found.rank, now)
        if now - self._candidate[1] < CONFIRM_S:
            return None
        before, self.current, self._last_seen = self.current, found, now
        if before is not None and before.rank == found.rank:
            return None
        self.since = now
        oldest = min(w.at[0] for w in judged.values())
        return Named(found, now - oldest, min(len(w.at) for w in judged.values()))
