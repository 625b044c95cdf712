"""Stragglers: which rank makes the others wait (pure: no I/O, no clock; times are handed in).

Under DDP every rank's step lasts as long as the slowest rank's: the gradient all-reduce at the
end of the backward pass finishes only once the last rank has joined it. What differs between
the ranks is how long each of them *waits* there after its own backward is done: the rank that
makes the others wait waits (almost) not at all, the others wait for it. The SDK reads that wait
from DDP's own runtime statistics (``worker_sdk.runtime.stragglers``) and sends it with its heartbeats
(``comm_wait_s``, one sample per heartbeat at most); durations only, so nodes' clocks need not
agree.

The rule (:func:`judge`), over a window of recent samples:

- each rank's wait is the median of its samples (a checkpoint save or a hiccup in a few of them
  does not move it); a rank with fewer than :data:`MIN_SAMPLES` is not judged;
- the candidate is the rank that waits least; the others' wait is the median of the other ranks'
  waits; their difference, ``lost_s``, is how much longer every step is because of the candidate;
- it is a straggler when ``lost_s`` is at least :data:`MIN_SHARE` of the step time (and at least
  :data:`MIN_LOST_S`): a job whose ranks are all equally slow has no straggler, since every rank
  waits equally little.

``slower`` says how much slower the straggler works than the others: its time outside the wait
(``step_s - wait``) over theirs. :class:`StragglerWatch` keeps the windows (:data:`WINDOW_S`),
judges them, and names a straggler once the rule has found the same rank for
:data:`CONFIRM_S` (a rank descheduled for a few seconds is not named); it says when a straggler
is first named, when another rank becomes it, and forgets it once the rule has found none
for a whole window.
"""

from __future__ import annotations

import statistics
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

__all__ = [
    "CONFIRM_S",
    "MIN_LOST_S",
    "MIN_SAMPLES",
    "MIN_SHARE",
    "WINDOW_S",
    "Named",
    "Straggler",
    "StragglerWatch",
    "judge",
    "step_time",
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
_BUSY_FLOOR = 0.01  # of the step: the others' time outside the wait, for ``slower``


@dataclass(frozen=True, slots=True)
class Straggler:
    """A rank the others wait for."""

    rank: int
    wait_s: float
    """Its median wait per sampled step."""
    others_wait_s: float
    """The median of the other ranks' median waits."""
    step_s: float
    """The step time over the window."""

    @property
    def lost_s(self) -> float:
        """How much longer every step is because of it: what the others wait for it."""
        return self.others_wait_s - self.wait_s

    @property
    def slower(self) -> float:
        """Its time outside the wait over the others' (3.0: it takes three times as long)."""
        busy_others = max(self.step_s - self.others_wait_s, _BUSY_FLOOR * self.step_s)
        return max(self.step_s - self.wait_s, busy_others) / busy_others


def judge(waits: Mapping[int, Sequence[float]], step_s: float) -> Straggler | None:
    """The straggler among ranks whose waits (seconds, per sampled step) are ``waits``, when
    steps last ``step_s`` seconds; None when there is none (module docstring)."""
    medians = {r: statistics.median(w) for r, w in waits.items() if len(w) >= MIN_SAMPLES}
    if len(medians) < 2 or not step_s > 0:
        return None
    rank = min(medians, key=lambda r: (medians[r], r))
    others = statistics.median(v for r, v in medians.items() if r != rank)
    found = Straggler(rank, medians[rank], others, step_s)
    if found.lost_s < MIN_LOST_S or found.lost_s < MIN_SHARE * step_s:
        return None
    return found


def step_time(progress: Mapping[int, Sequence[tuple[float, int]]]) -> float | None:
    """The median over ranks of each rank's seconds per step, from its ``(time, step)`` pairs
    (oldest first); None when no rank made progress."""
    rates = []
    for pairs in progress.values():
        (t0, s0), (t1, s1) = pairs[0], pairs[-1]
        if s1 > s0 and t1 > t0:
            rates.append((t1 - t0) / (s1 - s0))
    return statistics.median(rates) if rates else None


@dataclass(slots=True)
class _RankWindow:
    progress: deque[tuple[float, int]] = field(default_factory=deque)  # (time, step)
    waits: deque[tuple[float, float]] = field(default_factory=deque)  # (time, wait)


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

    def observe(self, rank: int, now: float, step: int, wait_s: float | None) -> None:
        """A heartbeat of ``rank`` at ``step``, with its wait when it carried one."""
        w = self._ranks.setdefault(rank, _RankWindow())
        w.progress.append((now, step))
        if wait_s is not None and wait_s >= 0:
            w.waits.append((now, wait_s))

    def judge(self, now: float) -> Named | None:
        """Judge the window ending at ``now``: a :class:`Named` when a straggler is named that
        was not the one named before."""
        start = now - self.window_s
        for w in self._ranks.values():  # a rank's last MIN_SAMPLES stay: slow steps
            while len(w.progress) > MIN_SAMPLES and w.progress[0][0] < start:
                w.progress.popleft()
            while len(w.waits) > MIN_SAMPLES and w.waits[0][0] < start:
                w.waits.popleft()
        waits = {r: [v for _, v in w.waits] for r, w in self._ranks.items()}
        step_s = step_time({r: w.progress for r, w in self._ranks.items() if w.progress})
        found = judge(waits, step_s) if step_s is not None else None
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
        oldest = min(w.waits[0][0] for w in self._ranks.values() if len(w.waits) >= MIN_SAMPLES)
        samples = min(n for v in waits.values() if (n := len(v)) >= MIN_SAMPLES)
        return Named(found, now - oldest, samples)
