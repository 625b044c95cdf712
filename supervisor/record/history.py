"""Reading the job's history back: ``events.jsonl`` -> one row per attempt.

The supervisor appends one JSON object per line to ``<run_dir>/events.jsonl``
(:mod:`.events`); every line has ``timestamp``, ``event``, ``level``, ``job`` and ``attempt``
(1-based; 0 for job-level events before an attempt) and the fields of one :mod:`.schema` event.
A requeued allocation appends to the same file and continues the attempt numbers.

- :func:`read` (:mod:`.history_file`) reads the file into schema entries, counting the lines it
  skipped.
- :func:`attempt_rows` folds the entries into :class:`AttemptRow` s.
- :func:`render_table` / :func:`rows_to_json` present them (``rvsup history [--json]``).
- The restart budget is :func:`supervisor.rules.budget.budget_of` over ``read(path).events``.

Everything here is pure: the file is read in :mod:`.history_file`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from datetime import datetime
from typing import Any, Final

from supervisor.record.entries import Entry, parse_all
from supervisor.record.history_file import History, format_timestamp, parse_timestamp, read
from supervisor.record.schema import (
    AttemptClosed,
    AttemptStarted,
    CheckpointCommitted,
    CheckpointLoaded,
    Event,
    FailureDetected,
    JobGaveUp,
    JobStarted,
    JobStopped,
    JobSucceeded,
    RestartScheduled,
    ResumeDiverged,
    ResumeUnverified,
    ResumeVerified,
    RolledBack,
)

__all__ = [
    "AttemptRow",
    "History",
    "attempt_rows",
    "attempts",
    "format_timestamp",
    "parse_timestamp",
    "read",
    "render_table",
    "rows_to_json",
    "unfinished",
]

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
    ``"supervisor lost"`` for one a later start closed (``attempt_closed``), or ``"unknown"`` for
    an earlier attempt whose end was never logged (the daemon died)."""
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
    steps_skipped: int = 0
    """Steps a rollback after this attempt skipped (never trained on)."""
    source: str | None = None
    """Where the attempt's state came from: ``memory``, ``replica`` or ``storage`` (None: from
    scratch, or not recorded)."""
    redone_from: str | None = None
    """The ``source`` of the next attempt: where the steps lost were run again from."""
    resume_check: str | None = None
    """The resume check's verdict on the attempt's resume: ``verified``, ``diverged at step N``
    or ``unverified`` (None: a fresh start, or nothing recorded)."""


# ---------------------------------------------------------------- folding into rows


@dataclass(slots=True)
class _Attempt:
    """What the events said about one attempt so far (mutable while folding)."""

    number: int
    first_seen: datetime
    started: datetime | None = None
    resume_step: int | None = None
    source: str | None = None
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
    steps_skipped: int = 0
    backoff_s: float = 0.0
    resume_check: str | None = None
    superseded: bool = False
    """A later ``job_started`` was logged, so this attempt is not running any more."""


def attempt_rows(entries: Iterable[Entry]) -> list[AttemptRow]:
    """One row per attempt, in attempt order; entries without a valid timestamp are ignored."""
    found: dict[int, _Attempt] = {}
    slurm_job_id: str | None = None
    restart_count: int | None = None
    for entry in entries:
        at = parse_timestamp(entry.timestamp)
        if at is None:
            continue
        event = entry.event
        if isinstance(event, JobStarted):
            slurm_job_id, restart_count = event.slurm_job_id, event.restart_count
            for earlier in found.values():
                earlier.superseded = True
            continue
        number = entry.attempt
        if number is None or number < 1:
            continue
        acc = found.get(number)
        if acc is None:
            acc = found[number] = _Attempt(
                number, first_seen=at, slurm_job_id=slurm_job_id, restart_count=restart_count
            )
        _fold(acc, event, at)
    ordered = [found[n] for n in sorted(found)]
    rows = [_row(acc, is_last=i == len(ordered) - 1) for i, acc in enumerate(ordered)]
    return [
        _with_steps_lost(row, rows[i + 1] if i + 1 < len(rows) else None)
        for i, row in enumerate(rows)
    ]


def unfinished(rows: Sequence[AttemptRow]) -> list[AttemptRow]:
    """The attempts whose end was never logged (``running`` or ``unknown``): at the start of a
    daemon, which holds the job's lock, their supervisor is gone."""
    return [row for row in rows if row.outcome in ("running", "unknown")]


def attempts(events: Sequence[Mapping[str, Any]]) -> list[AttemptRow]:
    """The rows of a history given as JSON objects (``attempt_rows`` of their parsed entries)."""
    return attempt_rows(parse_all(events).entries)


def _fold(acc: _Attempt, event: Event, at: datetime) -> None:
    """Apply one event of the attempt to its accumulator."""
    if isinstance(event, AttemptStarted):
        acc.started = at
        acc.resume_step = event.resume_step
        acc.source = event.source
        acc.slurm_job_id = event.slurm_job_id or acc.slurm_job_id
    elif isinstance(event, CheckpointLoaded):  # what the ranks really loaded
        acc.resume_step = event.resume_step
        acc.source = event.source or (acc.source if event.checkpoint else None)
    elif isinstance(event, CheckpointCommitted):
        if acc.checkpoint_step is None or event.step >= acc.checkpoint_step:
            acc.checkpoint_step, acc.checkpoint_at = event.step, at
        _add_step(acc, event.step)
    elif isinstance(event, FailureDetected):
        acc.failure_kind = event.kind or None
        acc.failure_detail = event.detail or None
        _add_step(acc, event.last_step)
        acc.failed_at = at
    elif isinstance(event, RolledBack):
        acc.steps_skipped += event.skipped_steps
        where = "the start" if event.to_step is None else f"step {event.to_step}"
        acc.failure_detail = (
            f"{acc.failure_detail or event.NAME}; rolled back to {where}, on at step "
            f"{event.resume_step} ({event.skipped_steps} steps skipped)"
        )
    elif isinstance(event, RestartScheduled):
        acc.backoff_s = event.backoff_s
    elif isinstance(event, ResumeDiverged):
        acc.resume_check = f"diverged at step {event.step}"
    elif isinstance(event, ResumeVerified | ResumeUnverified):
        acc.resume_check = "verified" if isinstance(event, ResumeVerified) else "unverified"
    elif isinstance(event, JobSucceeded):
        acc.ending, acc.ending_reason, acc.ended_at = event.NAME, None, at
        _add_step(acc, event.last_step)
    elif isinstance(event, AttemptClosed):
        acc.ending, acc.ending_reason = event.NAME, event.outcome
        acc.ended_at = parse_timestamp(event.last_seen) or at
        _add_step(acc, event.last_step)
    elif isinstance(event, (JobGaveUp, JobStopped)):
        acc.ending, acc.ending_reason, acc.ended_at = event.NAME, event.reason or None, at
        _add_step(acc, event.step if isinstance(event, JobStopped) else None)


def _row(acc: _Attempt, *, is_last: bool) -> AttemptRow:
    outcome = _outcome(acc, is_last=is_last)
    detail = acc.failure_detail
    if acc.ending == JobGaveUp.NAME and acc.ending_reason:
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
        steps_skipped=acc.steps_skipped,
        source=acc.source,
        resume_check=acc.resume_check,
    )


def _end_of(acc: _Attempt) -> datetime | None:
    """A failure ends the attempt when detected (a later give-up or stop is the job's end);
    a stop ends it when the ranks have saved and left (``job_stopped``)."""
    if acc.failed_at is not None and acc.failure_kind not in _STOP_KINDS:
        return acc.failed_at
    return acc.ended_at or acc.failed_at


def _outcome(acc: _Attempt, *, is_last: bool) -> str:
    if acc.ending == JobSucceeded.NAME:
        return "succeeded"
    if acc.ending == JobGaveUp.NAME:
        return f"gave up: {acc.failure_kind}" if acc.failure_kind else "gave up"
    if acc.ending == AttemptClosed.NAME:
        return acc.failure_kind or acc.ending_reason or "supervisor lost"
    if acc.ending == JobStopped.NAME:
        if acc.failure_kind:
            return acc.failure_kind
        return acc.ending_reason if acc.ending_reason in _STOP_KINDS else "stopped"
    if acc.failure_kind:
        return acc.failure_kind
    return "running" if is_last and not acc.superseded else "unknown"


def _with_steps_lost(row: AttemptRow, following: AttemptRow | None) -> AttemptRow:
    if following is None or following.resume_step is None or row.last_step is None:
        return row
    return replace(
        row,
        steps_lost=max(0, row.last_step - (following.resume_step - 1)),
        redone_from=following.source,
    )


# ---------------------------------------------------------------- presenting

_HEADERS: Final = (
    "attempt",
    "started",
    "ended",
    "outcome",
    "resume",
    "check",
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
    cells.extend(
        [
            str(row.attempt),
            _local(row.started),
            _local(row.ended) if row.ended is not None else "-",
            row.outcome,
            _opt_text(row.resume_step),
            row.resume_check or "-",
            _opt_text(row.last_step),
            _opt_text(row.checkpoint_step),
            _steps_lost(row),
            f"{row.seconds_lost:.1f}s",
            row.slurm_job_id or "-",
            " ".join((row.detail or "-").split()),
        ]
        for row in rows
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


# ---------------------------------------------------------------- small helpers


def _local(value: datetime) -> str:
    return value.astimezone().strftime("%Y-%m-%d %H:%M:%S")


def _steps_lost(row: AttemptRow) -> str:
    """The steps the next attempt ran again, and where it resumed from (``3 (memory)``)."""
    if row.redone_from is None:
        return str(row.steps_lost)
    return f"{row.steps_lost} ({row.redone_from})"


def _opt_text(value: int | None) -> str:
    return "-" if value is None else str(value)


def _add_step(acc: _Attempt, step: int | None) -> None:
    if step is not None and step >= 0:
        acc.steps.append(step)
