"""Goodput: where the job's wall time went, folded from its history (pure, no I/O).

The vocabulary is that of Google's ml-goodput-measurement: *goodput* is the time spent on
training steps that were kept; *badput* is the rest, by source. Every second of the wall time
(from the first attempt's start to the last one's end, or ``now`` while it runs) goes to exactly
one of them, so that goodput plus every badput source is the wall time:

- ``startup``: from an attempt's launch to the ranks' ``checkpoint_loaded`` (interpreters,
  imports, process group, and the checkpoint's restore: the history does not time the load
  apart, so restore is part of start-up); an attempt that ended before finishing a step is all
  start-up. Without a ``checkpoint_loaded`` line, none is counted.
- ``checkpoint_save``: the time the training was blocked by saves (``checkpoint_committed``'s
  ``blocked_s``; its ``seconds`` for a synchronous save that does not report it).
- ``wasted_progress``: progress lost to a disruption, the steps a later attempt ran again
  (``steps_redone``) times the attempt's mean step time.
- ``hang_detection``: for a hang, the time from the last progress to the detection (the most
  silent rank's silence, ``failure_detected``'s ``detect_s``), then to its line (stacks and
  flight recorders are collected in between).
- ``backoff``: the restart delay (``restart_scheduled``'s ``backoff_s``).
- ``recovery``: the rest of the time from an attempt's end (a failure's first sign,
  ``noticed_at``) to the next one's launch: the classification, the teardown, health checks,
  and for a stopped job the wait for its requeued allocation.

An attempt's mean step time is its run time (after start-up) less its save and hang time,
divided by the steps it finished; goodput is then the steps kept times that step time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from supervisor.record.entries import Entry
from supervisor.record.history import AttemptRow, attempt_rows
from supervisor.record.history_file import parse_timestamp
from supervisor.record.schema import (
    CheckpointCommitted,
    CheckpointLoaded,
    FailureDetected,
    RestartScheduled,
)

__all__ = [
    "BADPUT_SOURCES",
    "AttemptGoodput",
    "Goodput",
    "goodput_of",
    "goodput_to_json",
    "render_goodput",
]

BADPUT_SOURCES: Final = (
    "startup",
    "checkpoint_save",
    "wasted_progress",
    "hang_detection",
    "backoff",
    "recovery",
)
"""The badput sources, in the order they are shown."""


@dataclass(frozen=True, slots=True)
class AttemptGoodput:
    """One attempt's share of the wall time."""

    attempt: int
    steps_done: int
    """Steps it finished (its last step - its resume step + 1; 0 when unknown)."""
    steps_redone: int
    """Of those, the steps a later attempt ran again."""
    step_s: float | None
    """Its mean step time; None when it finished no step."""
    goodput_s: float
    badput_s: Mapping[str, float]
    """Seconds by source; every source of :data:`BADPUT_SOURCES` is a key. ``backoff`` and
    ``recovery`` are the time after this attempt, before the next."""


@dataclass(frozen=True, slots=True)
class Goodput:
    """The job's wall time split into goodput and badput by source."""

    wall_s: float
    goodput_s: float
    badput_s: Mapping[str, float]
    steps_redone: int
    attempts: tuple[AttemptGoodput, ...] = field(default=())

    @property
    def fraction(self) -> float | None:
        """Goodput over wall time; None when no time has passed."""
        return self.goodput_s / self.wall_s if self.wall_s > 0 else None


@dataclass(slots=True)
class _Seen:
    """What the events said about one attempt, beyond its row."""

    loaded_at: datetime | None = None
    save_blocked_s: float = 0.0
    hang_s: float = 0.0
    backoff_s: float = 0.0
    last_at: datetime | None = None
    noticed_at: datetime | None = None
    """A failure's first sign (``failure_detected``'s ``noticed_at``)."""


def goodput_of(entries: Iterable[Entry], now: datetime) -> Goodput:
    """The goodput of the history ``entries``; ``now`` ends a running last attempt."""
    listed = list(entries)
    rows = attempt_rows(listed)
    seen = _scan(listed)
    parts: list[AttemptGoodput] = []
    for i, row in enumerate(rows):
        following = rows[i + 1] if i + 1 < len(rows) else None
        parts.append(_attempt(row, seen.get(row.attempt, _Seen()), following, now))
    badput = {source: sum(p.badput_s[source] for p in parts) for source in BADPUT_SOURCES}
    good = sum(p.goodput_s for p in parts)
    return Goodput(
        wall_s=good + sum(badput.values()),
        goodput_s=good,
        badput_s=badput,
        steps_redone=sum(p.steps_redone for p in parts),
        attempts=tuple(parts),
    )


def _scan(entries: Sequence[Entry]) -> dict[int, _Seen]:
    found: dict[int, _Seen] = {}
    for entry in entries:
        at = parse_timestamp(entry.timestamp)
        number = entry.attempt
        if at is None or number is None or number < 1:
            continue
        acc = found.setdefault(number, _Seen())
        acc.last_at = at if acc.last_at is None else max(acc.last_at, at)
        event = entry.event
        if isinstance(event, CheckpointLoaded) and acc.loaded_at is None:
            acc.loaded_at = at
        elif isinstance(event, CheckpointCommitted):
            blocked = event.blocked_s
            if blocked is None and event.mode != "async":
                blocked = event.seconds
            acc.save_blocked_s += max(0.0, blocked or 0.0)
        elif isinstance(event, FailureDetected):
            acc.noticed_at = parse_timestamp(event.noticed_at)
            if event.kind == "hang":
                acc.hang_s = max(0.0, event.detect_s or 0.0)
        elif isinstance(event, RestartScheduled):
            acc.backoff_s = max(0.0, event.backoff_s)
    return found


def _attempt(
    row: AttemptRow, seen: _Seen, following: AttemptRow | None, now: datetime
) -> AttemptGoodput:
    start = row.started
    end = row.ended
    if end is None:
        end = now if row.outcome == "running" else (seen.last_at or start)
    end = max(end, start)
    # from a failure's first sign to its line (classification, a hang's diagnostics): part of
    # the hang's detection, else of the recovery
    after = 0.0
    if seen.noticed_at is not None and start <= seen.noticed_at < end:
        after = (end - seen.noticed_at).total_seconds()
        end = seen.noticed_at
    span = (end - start).total_seconds()
    startup = 0.0
    if seen.loaded_at is not None:
        startup = min(span, max(0.0, (seen.loaded_at - start).total_seconds()))
    steps_done = 0
    if row.last_step is not None and row.resume_step is not None:
        steps_done = max(0, row.last_step - row.resume_step + 1)
    run = span - startup
    badput = dict.fromkeys(BADPUT_SOURCES, 0.0)
    step_s: float | None = None
    good = 0.0
    redone = min(row.steps_lost, steps_done)
    if steps_done == 0:
        badput["startup"] = span  # it never got past starting
    else:
        badput["startup"] = startup
        save = min(run, seen.save_blocked_s)
        hang = min(run - save, seen.hang_s)
        step_s = (run - save - hang) / steps_done
        badput["checkpoint_save"] = save
        badput["hang_detection"] = hang
        badput["wasted_progress"] = redone * step_s
        good = (steps_done - redone) * step_s
    if seen.hang_s > 0:
        badput["hang_detection"] += after
    else:
        badput["recovery"] += after
    if following is not None:
        gap = max(0.0, (following.started - end).total_seconds() - after)
        badput["backoff"] = min(gap, seen.backoff_s)
        badput["recovery"] += gap - badput["backoff"]
    return AttemptGoodput(
        attempt=row.attempt,
        steps_done=steps_done,
        steps_redone=redone,
        step_s=step_s,
        goodput_s=good,
        badput_s=badput,
    )


def render_goodput(g: Goodput) -> str:
    """One line, e.g. ``goodput 81.2% (97.4s of 120.0s); badput: startup 9.1s, ...``."""
    share = "-" if g.fraction is None else f"{g.fraction:.1%}"
    lost = ", ".join(
        f"{source.replace('_', ' ')} {seconds:.1f}s"
        for source, seconds in g.badput_s.items()
        if seconds >= 0.05
    )
    return f"goodput {share} ({g.goodput_s:.1f}s of {g.wall_s:.1f}s); badput: {lost or 'none'}"


def goodput_to_json(g: Goodput) -> dict[str, object]:
    return {
        "wall_s": round(g.wall_s, 3),
        "goodput_s": round(g.goodput_s, 3),
        "goodput": None if g.fraction is None else round(g.fraction, 4),
        "badput_s": {source: round(s, 3) for source, s in g.badput_s.items()},
        "steps_redone": g.steps_redone,
        "attempts": [
            {
                "attempt": a.attempt,
                "steps_done": a.steps_done,
                "steps_redone": a.steps_redone,
                "step_s": None if a.step_s is None else round(a.step_s, 6),
                "goodput_s": round(a.goodput_s, 3),
                "badput_s": {source: round(s, 3) for source, s in a.badput_s.items()},
            }
            for a in g.attempts
        ],
    }
