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
    "Sample",
    "Straggler",
    "StragglerWatch",
    "judge",
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


@dataclass(frozen=True, slots=True)
class Sample:
    """One heartbeat's figures of a rank."""

    wait_s: float
    """Seconds it waited for the others per step."""
    step_s: float
    """Seconds per step since its previous heartbeat."""
    steps: int = 1
    """The steps since its previous heartbeat."""

    @property
    def busy_s(self) -> float:
        """Its compute time per step: the step less the wait."""
        return max(0.0, self.step_s - self.wait_s)


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
    judged = {r: v for r, v in samples.items() if len(v) >= MIN_SAMPLES}
    if len(judged) < 2:
        return None
    waits = {r: statistics.median(x.wait_s for x in v) for r, v in judged.items()}
    step_s = statistics.median(statistics.median(x.step_s for x in v) for v in judged.values())
    if not step_s > 0:
        return None
    rank = min(waits, key=lambda r: (waits[r], r))
    others = [r for r in judged if r != rank]
    others_wait = statistics.median(waits[r] for r in others)
    lost_per_step = others_wait - waits[rank]
    if lost_per_step < MIN_LOST_S or lost_per_step < MIN_SHARE * step_s:
        return None
    busy = {r: statistics.median(x.busy_s for x in v) for r, v in judged.items()}
    busy_others = max(statistics.median(busy[r] for r in others), _BUSY_FLOOR * step_s)
    waited = {r: sum(x.wait_s * x.steps for x in v) for r, v in judged.items()}
    lost = max(0.0, statistics.median(waited[r] for r in others) - waited[rank])
    return Straggler(rank, waits[rank], others_wait, step_s, busy[rank] / busy_others, lost)


@dataclass(slots=True)
class _RankWindow:
    last: tuple[float, int] | None = None  # (time, step) of its previous heartbeat
    samples: deque[tuple[float, Sample]] = field(default_factory=deque)  # (time, sample)


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
        w = self._ranks.setdefault(rank, _RankWindow())
        last, w.last = w.last, (now, step)
        if last is None or wait_s is None or not wait_s >= 0:
            return
        steps, seconds = step - last[1], now - last[0]
        if steps > 0 and seconds > 0:
            w.samples.append((now, Sample(wait_s, seconds / steps, steps)))

    def judge(self, now: float) -> Named | None:
        """Judge the window ending at ``now``: a :class:`Named` when a straggler is named that
        was not the one named before."""
        start = now - self.window_s
        for w in self._ranks.values():  # a rank's last MIN_SAMPLES stay: slow steps
            while len(w.samples) > MIN_SAMPLES and w.samples[0][0] < start:
                w.samples.popleft()
        samples = {  # the rule judges only ranks with enough samples
            r: [x for _, x in w.samples]
            for r, w in self._ranks.items()
            if len(w.samples) >= MIN_SAMPLES
        }
        found = judge(samples)
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
        judged = [w.samples for w in self._ranks.values() if len(w.samples) >= MIN_SAMPLES]
        oldest = min(v[0][0] for v in judged)
        return Named(found, now - oldest, min(len(v) for v in judged))
