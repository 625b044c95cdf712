"""``rvsup history JOB.toml --plot FILE``: a picture of the history (matplotlib, extra ``plot``).

Two panels, drawn from the same fold as ``rvsup history``'s goodput line
(:mod:`supervisor.record.goodput`):

- above, the step over the wall time, one line per attempt through the points the history
  records (its start at the step it resumed from, each committed checkpoint, its end); failures
  marked by kind, checkpoints by tier, the span whose steps a later attempt ran again shaded;
- below, the wall time as one stacked bar: goodput, then badput by source.

The artists carry ids (``set_gid``), which the SVG keeps as element ids: ``failure-N`` per
failed attempt N, ``checkpoint-TIER-STEP``, ``redone-N``, ``attempt-N``, ``goodput``,
``badput-SOURCE`` and ``title``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Final

from supervisor.record.entries import Entry
from supervisor.record.goodput import BADPUT_SOURCES, Goodput, goodput_of
from supervisor.record.history import AttemptRow, attempt_rows
from supervisor.record.history_file import parse_timestamp
from supervisor.record.schema import (
    AttemptClosed,
    CheckpointCommitted,
    CheckpointLoaded,
    Event,
    FailureDetected,
    JobStopped,
    JobSucceeded,
)

if TYPE_CHECKING:
    from matplotlib.axes import Axes

__all__ = ["FORMATS", "PlotError", "draw"]

FORMATS: Final = (".png", ".svg")

_KIND_MARKERS: Final = {
    "crash": "X",
    "oom": "s",
    "hang": "P",
    "node_failure": "D",
    "preempted": "v",
    "timelimit": "v",
    "stopped": "v",
}
_SOURCE_COLORS: Final = {
    "goodput": "#2e7d32",
    "startup": "#90a4ae",
    "checkpoint_save": "#1e88e5",
    "wasted_progress": "#e53935",
    "hang_detection": "#8e24aa",
    "backoff": "#fb8c00",
    "recovery": "#6d4c41",
}
_TIER_MARKERS: Final = {"storage": "o", "memory": "^"}


class PlotError(Exception):
    """The picture cannot be drawn: a suffix it does not know, or matplotlib missing."""


@dataclass(slots=True)
class _Track:
    """One attempt as drawn: its (seconds, step) points, checkpoints and end."""

    attempt: int
    points: list[tuple[float, int]] = field(default_factory=list)
    checkpoints: list[tuple[float, int, str]] = field(default_factory=list)
    failure: tuple[float, int | None, str] | None = None
    started: float = 0.0
    loaded: float | None = None
    """When the ranks reported what they loaded: the end of the start-up."""
    hang_s: float = 0.0


def draw(entries: Sequence[Entry], now: datetime, target: Path, *, job: str) -> None:
    """Draw the history ``entries`` into ``target`` (PNG or SVG by its suffix)."""
    suffix = target.suffix.lower()
    if suffix not in FORMATS:
        raise PlotError(
            f"cannot draw into {target.name!r}: the file must end in .png or .svg (got "
            f"{suffix or 'no suffix'!r})"
        )
    try:  # the optional extra, imported only when a picture is asked for
        from matplotlib import rc_context
        from matplotlib.figure import Figure
    except ImportError:
        raise PlotError("drawing the history needs matplotlib: pip install 'rvsup[plot]'") from None
    rows = attempt_rows(entries)
    if not rows:
        raise PlotError("the history has no attempt to draw")
    good = goodput_of(entries, now)
    origin = rows[0].started
    tracks = _tracks(entries, rows, origin, now)
    fig = Figure(figsize=(11, 6.5), layout="constrained")
    top, bottom = fig.subplots(2, 1, height_ratios=[4, 1])
    _draw_steps(top, tracks, rows, origin)
    _draw_backoffs(top, rows, good, origin)
    top.legend(loc="upper left", fontsize=8)
    _draw_time(bottom, good)
    share = "-" if good.fraction is None else f"{good.fraction:.1%}"
    failures = sum(1 for t in tracks if t.failure is not None)
    title = fig.suptitle(
        f"{job}: goodput {share} of {_duration(good.wall_s)} wall time; "
        f"{len(rows)} attempts, {failures} failures, {good.steps_redone} steps redone"
    )
    title.set_gid("title")
    target.parent.mkdir(parents=True, exist_ok=True)
    with rc_context({"svg.fonttype": "none", "svg.hashsalt": "rvsup"}):  # text stays text
        fig.savefig(target, dpi=110)


def _tracks(
    entries: Sequence[Entry], rows: Sequence[AttemptRow], origin: datetime, now: datetime
) -> list[_Track]:
    by_number = {row.attempt: _Track(row.attempt) for row in rows}

    def seconds(at: datetime) -> float:
        return (at - origin).total_seconds()

    for row in rows:
        by_number[row.attempt].started = seconds(row.started)
    for entry in entries:
        at = parse_timestamp(entry.timestamp)
        track = by_number.get(entry.attempt if entry.attempt is not None else -1)
        if at is not None and track is not None:
            _add(track, entry.event, seconds(at), seconds)
    last = rows[-1]
    if last.outcome == "running" and last.last_step is not None:
        by_number[last.attempt].points.append((seconds(now), last.last_step))
    for row in rows:
        track = by_number[row.attempt]
        if track.loaded is None and row.resume_step is not None:  # no checkpoint_loaded line
            track.points.append((track.started, row.resume_step - 1))
        track.points.sort()
    return [by_number[row.attempt] for row in rows]


def _add(track: _Track, event: Event, t: float, seconds: Callable[[datetime], float]) -> None:
    """One event of the attempt, at ``t`` seconds, into its track."""
    if isinstance(event, CheckpointLoaded):
        if track.loaded is None:
            track.loaded = t
            track.points.append((t, event.resume_step - 1))
    elif isinstance(event, CheckpointCommitted):
        tier = str(getattr(event, "tier", None) or "storage")
        track.checkpoints.append((t, event.step, tier))
        track.points.append((t, event.step))
    elif isinstance(event, FailureDetected):
        noticed = parse_timestamp(event.noticed_at)
        when = seconds(noticed) if noticed is not None else t
        track.failure = (when, event.last_step, event.kind or "failure")
        if event.kind == "hang":
            track.hang_s = max(0.0, event.detect_s or 0.0)
        if event.last_step is not None:
            track.points.append((when, event.last_step))
    elif isinstance(event, (JobSucceeded, JobStopped, AttemptClosed)):
        step = event.step if isinstance(event, JobStopped) else event.last_step
        if step is not None:
            track.points.append((t, step))


def _draw_steps(
    ax: Axes, tracks: Sequence[_Track], rows: Sequence[AttemptRow], origin: datetime
) -> None:
    colors = [f"C{i % 10}" for i in range(len(tracks))]
    for track, row, color in zip(tracks, rows, colors, strict=True):
        if track.loaded is not None and track.loaded > track.started:
            span = ax.axvspan(
                track.started, track.loaded, color=_SOURCE_COLORS["startup"], alpha=0.25, lw=0
            )
            span.set_gid(f"startup-{track.attempt}")
        if track.failure is not None and track.hang_s > 0:
            end = (row.ended - origin).total_seconds() if row.ended else track.failure[0]
            span = ax.axvspan(
                track.failure[0] - track.hang_s,
                end,
                color=_SOURCE_COLORS["hang_detection"],
                alpha=0.18,
                lw=0,
            )
            span.set_gid(f"hang-{track.attempt}")
        if row.steps_lost > 0 and track.points and row.last_step is not None:
            # the steps a later attempt ran again: from reaching the step it resumed from
            kept = row.last_step - row.steps_lost
            begin = next((t for t, s in track.points if s >= kept), track.points[-1][0])
            end = track.points[-1][0]
            span = ax.axvspan(begin, end, color="#e53935", alpha=0.15, lw=0)
            span.set_gid(f"redone-{track.attempt}")
            ax.annotate(
                f"{row.steps_lost} steps redone",
                (begin, kept),
                ha="right",
                va="bottom",
                fontsize=8,
                color="#b71c1c",
                xytext=(-4, 6),
                textcoords="offset points",
            )
        if track.points:
            xs = [t for t, _ in track.points]
            ys = [s for _, s in track.points]
            (line,) = ax.plot(xs, ys, color=color, lw=1.8, label=f"attempt {track.attempt}")
            line.set_gid(f"attempt-{track.attempt}")
        for tier in sorted({c[2] for c in track.checkpoints}):
            marks = [c for c in track.checkpoints if c[2] == tier]
            for t, step, _ in marks:
                (mark,) = ax.plot(
                    [t], [step], _TIER_MARKERS.get(tier, "o"), ms=5, mfc="white", mec=color
                )
                mark.set_gid(f"checkpoint-{tier}-{step}")
        if track.failure is not None:
            t, failed_step, kind = track.failure
            y = failed_step if failed_step is not None else (row.resume_step or 0)
            (mark,) = ax.plot(
                [t], [y], _KIND_MARKERS.get(kind, "X"), ms=11, color="#c62828", mec="black"
            )
            mark.set_gid(f"failure-{track.attempt}")
            ax.annotate(
                kind, (t, y), xytext=(4, 6), textcoords="offset points", fontsize=9, color="#c62828"
            )
    for label, color, alpha in (
        ("start-up", _SOURCE_COLORS["startup"], 0.25),
        ("steps redone later", "#e53935", 0.15),
        ("hang detection", _SOURCE_COLORS["hang_detection"], 0.18),
    ):
        ax.fill_between([], [], color=color, alpha=alpha, lw=0, label=label)
    tiers = sorted({c[2] for track in tracks for c in track.checkpoints})
    for tier in tiers:
        ax.plot(
            [],
            [],
            _TIER_MARKERS.get(tier, "o"),
            mfc="white",
            mec="gray",
            label=f"checkpoint ({tier})",
        )
    ax.set_xlabel(f"seconds since {origin.strftime('%Y-%m-%d %H:%M:%S')} UTC")
    ax.set_ylabel("step")
    ax.grid(alpha=0.3)


def _draw_backoffs(ax: Axes, rows: Sequence[AttemptRow], good: Goodput, origin: datetime) -> None:
    """The restart delays after each attempt, shaded."""
    for row, part in zip(rows, good.attempts, strict=True):
        wait = part.badput_s["backoff"]
        if wait <= 0 or row.ended is None:
            continue
        begin = (row.ended - origin).total_seconds()
        span = ax.axvspan(begin, begin + wait, color=_SOURCE_COLORS["backoff"], alpha=0.15, lw=0)
        span.set_gid(f"backoff-{row.attempt}")
    ax.fill_between([], [], color=_SOURCE_COLORS["backoff"], alpha=0.15, lw=0, label="backoff")


def _draw_time(ax: Axes, good: Goodput) -> None:
    parts = [("goodput", good.goodput_s)] + [(s, good.badput_s[s]) for s in BADPUT_SOURCES]
    left = 0.0
    for name, seconds in parts:
        if seconds <= 0:
            continue
        share = seconds / good.wall_s if good.wall_s > 0 else 0.0
        label = f"{name.replace('_', ' ')} {seconds:.1f}s ({share:.0%})"
        bars = ax.barh([0], [seconds], left=left, color=_SOURCE_COLORS[name], label=label)
        for patch in bars:
            patch.set_gid("goodput" if name == "goodput" else f"badput-{name}")
        left += seconds
    ax.set_yticks([])
    ax.set_xlim(0, max(left, 1e-9))
    ax.set_xlabel("wall time (seconds): goodput, then badput by source")
    ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.45), ncol=4, fontsize=8, frameon=False)


def _duration(seconds: float) -> str:
    minutes, secs = divmod(round(seconds), 60)
    return f"{minutes}m {secs:02d}s" if minutes else f"{seconds:.1f}s"
