"""Reading the job's history back: ``events.jsonl`` -> one row per attempt.

The supervisor appends one JSON object per line to ``<run_dir>/events.jsonl`` (see
``supervisor.events``); every line has ``timestamp``, ``event``, ``level``, ``job`` and
``attempt`` (1-based; 0 for job-level events before an attempt). A requeued allocation
appends to the same file and continues the attempt numbers.

- :func:`read_events` parses the file, skipping what is not a JSON object.
- :func:`attempts` folds the events into :class:`AttemptRow` s; unknown events and
  missing or malformed fields are tolerated (the field is simply unknown).
- :func:`render_table` / :func:`rows_to_json` present them (``rvsup history [--json]``).
- :func:`budget_state` is what a new ``rvsup start`` needs to continue the restart budget.

Everything except :func:`read_events` is pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Final

from supervisor.rules.policy import next_no_progress_streak

__all__ = [
    "AttemptRow",
    "BudgetState",
    "attempts",
    "budget_state",
    "format_timestamp",
    "parse_timestamp",
    "read_events",
    "render_table",
    "rows_to_json",
]

_ENDING_EVENTS: Final = frozenset({"job_succeeded", "job_gave_up", "job_stopped"})
_STOP_KINDS: Final = frozenset({"preempted", "timelimit", "stopped"})
_NOTHING_LOST: Final = frozenset({"succeeded", "running", "unknown"})


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One attempt of the job, as ``rvsup history`` shows it."""

    attempt: int
    started: datetime
    """When ``attempt_started`` was logged (or the attempt's first event), UTC."""
    ended: datetime | None
    """When a failure was detected; for a stop or success, when ``job_stopped`` /
    ``job_succeeded`` was logged; None while running or if never logged."""
    outcome: str
    """``"running"``, ``"succeeded"``, a failure kind (``"crash"``, ``"oom"``, ``"hang"``,
    ``"preempted"``, ``"timelimit"``, ``"node_failure"``, ``"stopped"``), ``"gave up: <kind>"``,
    or ``"unknown"`` for an earlier attempt whose end was never logged (the daemon died)."""
    failure_kind: str | None
    detail: str | None
    resume_step: int | None
    """The first step the attempt ran: the loaded checkpoint's step + 1, or 0."""
    last_step: int | None
    """The last step it finished, as far as the events say."""
    checkpoint_step: int | None
    """The newest checkpoint committed during the attempt."""
    steps_lost: int
    """Finished steps the next attempt ran again: ``last_step - (next resume_step - 1)``,
    at least 0; 0 for the last attempt or when either step is unknown."""
    seconds_lost: float
    """Time from the attempt's newest commit (or its start) to its end, plus the backoff
    before the next attempt; 0 for an attempt that succeeded, runs, or whose end is unknown.
    The next attempt's start-up time is not included."""
    slurm_job_id: str | None
    restart_count: int | None
    """Slurm's restart count of the allocation the attempt ran in."""


@dataclass(frozen=True, slots=True)
class BudgetState:
    """Where the job's restart budget stands, as recorded in the history."""

    attempts: int
    """The highest attempt number seen (0 if none)."""
    restarts_used: int
    """``restart_scheduled`` events with ``charged`` true."""
    no_progress_streak: int
    """Charged attempts in a row, most recent last, that committed no new checkpoint."""
    oom_count: int
    last_failure: str | None
    """The kind of the last ``failure_detected``."""


# ---------------------------------------------------------------- reading


def read_events(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The events of ``path`` and the number of lines skipped because they are not JSON objects.

    Blank lines are ignored. A last line without a newline that does not parse is a write
    in progress (or torn by a crash): it is skipped without being counted. A missing file is an
    empty history.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    lines = data.split(b"\n")
    torn_tail = not data.endswith(b"\n")
    events: list[dict[str, Any]] = []
    skipped = 0
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError:  # includes UnicodeDecodeError
            value = None
        if isinstance(value, dict):
            events.append(value)
        elif not (torn_tail and index == len(lines) - 1):
            skipped += 1
    return events, skipped


def parse_timestamp(value: object) -> datetime | None:
    """An aware UTC datetime from an ISO-8601 string (a naive one is taken as UTC), else None."""
    if not isinstance(value, str):
        return None
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def format_timestamp(value: datetime) -> str:
    """The history's own format: ``"2026-11-22T19:03:01.123456Z"``."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


# ---------------------------------------------------------------- folding into rows


@dataclass(slots=True)
class _Attempt:
    """What the events said about one attempt so far (mutable while folding)."""

    number: int
    first_seen: datetime
    started: datetime | None = None
    resume_step: int | None = None
    slurm_job_id: str | None = None
    restart_count: int | None = None
    checkpoint_step: int | None = None
    checkpoint_at: datetime | None = None
    failure_kind: str | None = None
    failure_detail: str | None = None
    failed_at: datetime | None = None
    ended_at: datetime | None = None
    ending: str | None = None
    ending_reason: str | None = None
    steps: list[int] = field(default_factory=list)
    backoff_s: float = 0.0
    superseded: bool = False
    """A later ``job_started`` was logged, so this attempt is not running any more."""


def attempts(events: Sequence[Mapping[str, Any]]) -> list[AttemptRow]:
    """One row per attempt, in attempt order; events without a valid timestamp are ignored."""
    found: dict[int, _Attempt] = {}
    slurm_job_id: str | None = None
    restart_count: int | None = None
    for event in events:
        at = parse_timestamp(event.get("timestamp"))
        if at is None:
            continue
        name = event.get("event")
        if name == "job_started":
            slurm_job_id = _opt_str(event.get("slurm_job_id"))
            restart_count = _opt_int(event.get("restart_count"))
            for earlier in found.values():
                earlier.superseded = True
            continue
        number = _opt_int(event.get("attempt"))
        if number is None or number < 1:
            continue
        acc = found.get(number)
        if acc is None:
            acc = found[number] = _Attempt(
                number, first_seen=at, slurm_job_id=slurm_job_id, restart_count=restart_count
            )
        _fold(acc, str(name), event, at)
    ordered = [found[n] for n in sorted(found)]
    rows = [_row(acc, is_last=i == len(ordered) - 1) for i, acc in enumerate(ordered)]
    return [
        _with_steps_lost(row, rows[i + 1] if i + 1 < len(rows) else None)
        for i, row in enumerate(rows)
    ]


def _fold(acc: _Attempt, name: str, event: Mapping[str, Any], at: datetime) -> None:
    """Apply one event of the attempt to its accumulator."""
    if name == "attempt_started":
        acc.started = at
        acc.resume_step = _opt_int(event.get("resume_step"))
        acc.slurm_job_id = _opt_str(event.get("slurm_job_id")) or acc.slurm_job_id
    elif name == "checkpoint_committed":
        step = _opt_int(event.get("step"))
        if step is not None and (acc.checkpoint_step is None or step >= acc.checkpoint_step):
            acc.checkpoint_step, acc.checkpoint_at = step, at
        _add_step(acc, step)
    elif name == "failure_detected":
        acc.failure_kind = _opt_str(event.get("kind"))
        acc.failure_detail = _opt_str(event.get("detail"))
        _add_step(acc, event.get("last_step"))
        acc.failed_at = at
    elif name == "restart_scheduled":
        acc.backoff_s = _opt_float(event.get("backoff_s")) or 0.0
    elif name in _ENDING_EVENTS:
        acc.ending = name
        acc.ending_reason = _opt_str(event.get("reason"))
        _add_step(acc, event.get("last_step" if name == "job_succeeded" else "step"))
        acc.ended_at = at


def _row(acc: _Attempt, *, is_last: bool) -> AttemptRow:
    outcome = _outcome(acc, is_last=is_last)
    detail = acc.failure_detail
    if acc.ending == "job_gave_up" and acc.ending_reason:
        detail = f"{detail}; gave up: {acc.ending_reason}" if detail else acc.ending_reason
    started = acc.started or acc.first_seen
    ended = _end_of(acc)
    seconds_lost = 0.0
    if outcome not in _NOTHING_LOST and ended is not None:
        since = acc.checkpoint_at or started
        seconds_lost = max(0.0, (ended - since).total_seconds()) + acc.backoff_s
    return AttemptRow(
        attempt=acc.number,
        started=started,
        ended=ended,
        outcome=outcome,
        failure_kind=acc.failure_kind,
        detail=detail,
        resume_step=acc.resume_step,
        last_step=max(acc.steps) if acc.steps else None,
        checkpoint_step=acc.checkpoint_step,
        steps_lost=0,
        seconds_lost=seconds_lost,
        slurm_job_id=acc.slurm_job_id,
        restart_count=acc.restart_count,
    )


def _end_of(acc: _Attempt) -> datetime | None:
    """A failure ends the attempt when detected (a later give-up or stop is the job's end);
    a stop ends it when the ranks have saved and left (``job_stopped``)."""
    if acc.failed_at is not None and acc.failure_kind not in _STOP_KINDS:
        return acc.failed_at
    return acc.ended_at or acc.failed_at


def _outcome(acc: _Attempt, *, is_last: bool) -> str:
    if acc.ending == "job_succeeded":
        return "succeeded"
    if acc.ending == "job_gave_up":
        return f"gave up: {acc.failure_kind}" if acc.failure_kind else "gave up"
    if acc.ending == "job_stopped":
        if acc.failure_kind:
            return acc.failure_kind
        return acc.ending_reason if acc.ending_reason in _STOP_KINDS else "stopped"
    if acc.failure_kind:
        return acc.failure_kind
    return "running" if is_last and not acc.superseded else "unknown"


def _with_steps_lost(row: AttemptRow, following: AttemptRow | None) -> AttemptRow:
    if following is None or following.resume_step is None or row.last_step is None:
        return row
    return replace(row, steps_lost=max(0, row.last_step - (following.resume_step - 1)))


# ---------------------------------------------------------------- presenting

_HEADERS: Final = (
    "attempt",
    "started",
    "ended",
    "outcome",
    "resume",
    "last step",
    "checkpoint",
    "steps lost",
    "time lost",
    "slurm job",
    "detail",
)
_RIGHT_ALIGNED: Final = frozenset(
    {"attempt", "resume", "last step", "checkpoint", "steps lost", "time lost"}
)


def render_table(rows: Sequence[AttemptRow]) -> str:
    """An aligned plain-text table: a header row, then one row per attempt.

    Times are local (``YYYY-mm-dd HH:MM:SS``), durations like ``12.3s``, unknowns ``-``.
    """
    headers = list(_HEADERS)
    cells = [headers]
    for row in rows:
        cells.append(
            [
                str(row.attempt),
                _local(row.started),
                _local(row.ended) if row.ended is not None else "-",
                row.outcome,
                _opt_text(row.resume_step),
                _opt_text(row.last_step),
                _opt_text(row.checkpoint_step),
                str(row.steps_lost),
                f"{row.seconds_lost:.1f}s",
                row.slurm_job_id or "-",
                " ".join((row.detail or "-").split()),
            ]
        )
    widths = [max(len(line[i]) for line in cells) for i in range(len(headers))]
    aligns = [">" if name in _RIGHT_ALIGNED else "<" for name in headers]
    return "\n".join(
        "  ".join(
            f"{text:{a}{w}}" for text, a, w in zip(line, aligns, widths, strict=True)
        ).rstrip()
        for line in cells
    )


def rows_to_json(rows: Sequence[AttemptRow]) -> list[dict[str, Any]]:
    """The rows as JSON-serialisable dicts (timestamps in the history's ISO-8601 format)."""
    out = []
    for row in rows:
        item = {f.name: getattr(row, f.name) for f in fields(row)}
        item["started"] = format_timestamp(row.started)
        item["ended"] = format_timestamp(row.ended) if row.ended is not None else None
        out.append(item)
    return out


# ---------------------------------------------------------------- the restart budget


def budget_state(events: Sequence[Mapping[str, Any]]) -> BudgetState:
    """How far the job's budget is spent, so that a new ``rvsup start`` continues the count.

    An attempt progressed if it committed a checkpoint newer than any committed (or resumed
    from) before it; the no-progress streak is folded with the same rule as
    :meth:`supervisor.policy.JobHistory.after`.
    """
    highest = restarts_used = oom_count = 0
    last_failure: str | None = None
    newest: int | None = None
    charged: dict[int, bool] = {}
    progressed: dict[int, bool] = {}
    for event in events:
        number = _opt_int(event.get("attempt"))
        if number is None:
            continue
        highest = max(highest, number)
        name = event.get("event")
        if name == "failure_detected":
            last_failure = _opt_str(event.get("kind"))
            oom_count += int(last_failure == "oom")
        elif name == "restart_scheduled" and event.get("charged") is True:
            restarts_used += 1
            charged[number] = True
        elif name == "attempt_started":
            resume = _opt_int(event.get("resume_step"))
            if resume is not None and resume > 0:
                newest = max(newest if newest is not None else -1, resume - 1)
            charged.setdefault(number, False)
        elif name == "checkpoint_committed":
            step = _opt_int(event.get("step"))
            if step is not None and (newest is None or step > newest):
                newest = step
                progressed[number] = True
    streak = 0
    for number in sorted(set(charged) | set(progressed)):
        if number >= 1:
            streak = next_no_progress_streak(
                streak, charged=charged.get(number, False), progressed=progressed.get(number, False)
            )
    return BudgetState(highest, restarts_used, streak, oom_count, last_failure)


# ---------------------------------------------------------------- small helpers


def _local(value: datetime) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _opt_text(value: int | None) -> str:
    return "-" if value is None else str(value)


def _opt_int(value: object) -> int | None:
    """An int, or a string of one (Slurm's values come from the environment), else None."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _opt_float(value: object) -> float | None:
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return None


def _opt_str(value: object) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)


def _add_step(acc: _Attempt, value: object) -> None:
    step = _opt_int(value)
    if step is not None and step >= 0:
        acc.steps.append(step)
