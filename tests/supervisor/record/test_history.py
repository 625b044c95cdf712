"""events.jsonl -> attempt rows: outcomes, steps/seconds lost, table, JSON, torn lines."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from supervisor.record.entries import parse_all
from supervisor.record.history import AttemptRow, attempt_rows, render_table, rows_to_json
from supervisor.record.history_file import format_timestamp, parse_timestamp, read
from supervisor.record.schema import (
    CheckpointCommitted,
    CheckpointLoaded,
    CheckpointSkipped,
    Event,
    FailureDetected,
    JobGaveUp,
    JobStopped,
    JobSucceeded,
    RestartScheduled,
    StopRequested,
    to_json,
)
from tests.helpers.events import attempt_started, job_started

T0 = datetime(2026, 11, 22, 19, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ev(t: float, attempt: int, event: Event) -> dict[str, Any]:
    """One line as the supervisor writes it, ``t`` seconds after T0."""
    return {
        "timestamp": format_timestamp(at(t)),
        "event": event.NAME,
        "level": event.LEVEL,
        "job": "gpt-small",
        "attempt": attempt,
        **to_json(event),
    }


def committed(step: int) -> CheckpointCommitted:
    return CheckpointCommitted(step=step, path=f"ckpt/{step}", seconds=0.5, bytes=10, source="sdk")


def failed(
    kind: str, last_step: int | None, detail: str = "", ranks: tuple[int, ...] = ()
) -> Event:
    return FailureDetected(
        kind=kind,
        ranks=ranks,
        exit_codes=(),
        signals=(),
        last_step=last_step,
        detail=detail,
        diagnostics=None,
        detect_s=0.2,
        hang_timeout_s=None,
        noticed_at=None,
        nodes=(),
    )


def restart(backoff_s: float, charged: bool = True) -> RestartScheduled:
    return RestartScheduled(
        backoff_s=backoff_s, restarts_left=4, charged=charged, deterministic=False, note=""
    )


def stopped(reason: str, step: int | None) -> JobStopped:
    return JobStopped(reason=reason, requeued=True, step=step, note="")


# Attempt 1 crashes at step 120 (checkpoint 99), attempt 2 is preempted and saves at 160,
# a requeued allocation runs attempt 3 to the end.
STREAM = [
    ev(0, 0, job_started("4242", 0)),
    ev(1, 1, attempt_started(0)),
    ev(20, 1, committed(49)),
    ev(40, 1, committed(99)),
    ev(50, 1, failed("crash", 120, "rank 1 killed by SIGKILL at step 120", ranks=(1,))),
    ev(51, 1, restart(2.5)),
    ev(54, 2, attempt_started(100)),
    ev(70, 2, committed(149)),
    ev(80, 2, StopRequested(reason="preempted", source="SIGTERM")),
    ev(81, 2, failed("preempted", 160, "stopped on preemption at step 160")),
    ev(82, 2, committed(160)),
    ev(83, 2, stopped("preempted", 160)),
    {**ev(200, 0, job_started("4242")), "restart_count": "1"},  # Slurm's value, as text
    {**ev(201, 3, attempt_started(161)), "slurm_job_id": 4242},  # a number where text belongs
    {**ev(203, 3, JobSucceeded(last_step=None)), "event": "rank_started"},  # a newer rvsup's
    ev(250, 3, committed(199)),
    ev(260, 3, JobSucceeded(last_step=199)),
]

EXPECTED_ROWS = [
    AttemptRow(
        attempt=1,
        started=at(1),
        ended=at(50),
        outcome="crash",
        failure_kind="crash",
        detail="rank 1 killed by SIGKILL at step 120",
        resume_step=0,
        last_step=120,
        checkpoint_step=99,
        steps_lost=21,  # steps 99..119 finished, plus 120: 120 - (100 - 1)
        seconds_lost=12.5,  # 10 s since the commit at step 99, plus the 2.5 s backoff
        slurm_job_id="4242",
        restart_count=0,
    ),
    AttemptRow(
        attempt=2,
        started=at(54),
        ended=at(83),
        outcome="preempted",
        failure_kind="preempted",
        detail="stopped on preemption at step 160",
        resume_step=100,
        last_step=160,
        checkpoint_step=160,
        steps_lost=0,
        seconds_lost=1.0,  # from the stop checkpoint to job_stopped
        slurm_job_id="4242",
        restart_count=0,
    ),
    AttemptRow(
        attempt=3,
        started=at(201),
        ended=at(260),
        outcome="succeeded",
        failure_kind=None,
        detail=None,
        resume_step=161,
        last_step=199,
        checkpoint_step=199,
        steps_lost=0,
        seconds_lost=0.0,
        slurm_job_id="4242",
        restart_count=1,
    ),
]


@pytest.fixture
def local_tz(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Local time is UTC+05:30 for the test (a POSIX TZ string, no tz database needed)."""
    monkeypatch.setenv("TZ", "IST-5:30")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def write_lines(path: Path, events: list[dict[str, Any]], tail: bytes = b"") -> None:
    path.write_bytes(b"".join(json.dumps(e).encode() + b"\n" for e in events) + tail)


def rows(lines: list[dict[str, Any]]) -> list[AttemptRow]:
    return attempt_rows(parse_all(lines).entries)


def test_three_attempts() -> None:
    """Crash, preemption and success become three rows with the right losses."""
    assert rows(STREAM) == EXPECTED_ROWS


def test_rows_from_the_file(tmp_path: Path) -> None:
    """The same rows come back through events.jsonl on disk."""
    path = tmp_path / "events.jsonl"
    write_lines(path, STREAM)
    history = read(path)
    assert (history.skipped, history.unknown) == (0, 1)
    assert attempt_rows(history.entries) == EXPECTED_ROWS


@pytest.mark.parametrize(
    ("tail", "n_entries", "unreadable", "invalid"),
    [
        pytest.param(b"", 16, 0, 0, id="clean"),
        pytest.param(b'{"timestamp": "2026-11-22T19:0', 16, 0, 0, id="torn-last-line-not-counted"),
        pytest.param(b'{"timestamp": "2026-11-22T19:0\n', 16, 1, 0, id="bad-complete-line-counted"),
        pytest.param(b"\n\n", 16, 0, 0, id="blank-lines-ignored"),
        pytest.param(b"[1, 2]\n\xff\xfe\n", 16, 2, 0, id="non-object-and-bad-utf8"),
        pytest.param(b'{"event": "job_succeeded"}', 17, 0, 0, id="unterminated-but-whole"),
        pytest.param(b'{"event": "checkpoint_committed"}\n', 16, 0, 1, id="no-step-is-invalid"),
    ],
)
def test_read(tmp_path: Path, tail: bytes, n_entries: int, unreadable: int, invalid: int) -> None:
    """read() counts non-objects (not a torn last line), invalid and unknown events apart."""
    path = tmp_path / "events.jsonl"
    write_lines(path, STREAM, tail)
    history = read(path)
    assert (len(history.entries), history.unreadable, history.invalid) == (
        n_entries,
        unreadable,
        invalid,
    )
    assert (history.unknown, history.skipped) == (1, unreadable + invalid)
    assert history.events[:16] == tuple(e.event for e in parse_all(STREAM).entries)


def test_read_a_missing_file(tmp_path: Path) -> None:
    """A run directory without events.jsonl is an empty history."""
    history = read(tmp_path / "events.jsonl")
    assert (history.entries, history.skipped, history.unknown) == ((), 0, 0)


def test_torn_last_line_leaves_rows_intact(tmp_path: Path) -> None:
    """A history whose last line was torn by a crash still gives the full attempt table."""
    path = tmp_path / "events.jsonl"
    write_lines(path, STREAM, b'{"timestamp": "2026-11-22T19:10:00Z", "event": "job_st')
    history = read(path)
    assert history.skipped == 0
    assert attempt_rows(history.entries) == EXPECTED_ROWS


def test_render_table(local_tz: None) -> None:
    """The table has a header, one aligned row per attempt, local times and durations."""
    text = render_table(EXPECTED_ROWS)
    lines = text.splitlines()
    assert len(lines) == 4
    header = lines[0]
    for column in ("attempt", "started", "ended", "outcome", "resume", "steps lost", "time lost"):
        assert column in header
    crash, preempted, succeeded = lines[1:]
    assert "2026-11-23 00:30:01" in crash  # 19:00:01 UTC at UTC+05:30
    assert "2026-11-23 00:30:50" in crash
    assert "12.5s" in crash
    assert "rank 1 killed by SIGKILL at step 120" in crash
    assert " 21 " in crash
    assert "1.0s" in preempted
    assert "0.0s" in succeeded
    outcome_col = header.index("outcome")
    assert crash.index("crash") == outcome_col
    assert preempted.index("preempted") == outcome_col
    assert succeeded.index("succeeded") == outcome_col
    assert all(line == line.rstrip() for line in lines)


def test_render_table_shows_unknowns_as_dashes(local_tz: None) -> None:
    """A running attempt has no end, loss or detail yet: dashes, not 'None'."""
    line = render_table(rows([ev(0, 1, attempt_started(0))])).splitlines()[1]
    assert "None" not in line
    assert line.split()[:4] == ["1", "2026-11-23", "00:30:00", "-"]


def test_render_table_without_rows() -> None:
    """No attempts: the header alone."""
    lines = render_table([]).splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("attempt")


def test_json_round_trip() -> None:
    """rows_to_json() survives json.dumps/loads unchanged and keeps exact timestamps."""
    data = rows_to_json(EXPECTED_ROWS)
    again = json.loads(json.dumps(data))
    assert again == data
    assert again[0]["started"] == "2026-11-22T19:00:01.000000Z"
    assert again[2]["outcome"] == "succeeded"
    for item, row in zip(again, EXPECTED_ROWS, strict=True):
        assert parse_timestamp(item["started"]) == row.started
        assert parse_timestamp(item["ended"]) == row.ended
        assert item["steps_lost"] == row.steps_lost


def crash_attempt(
    n: int, t: float, *, kind: str = "crash", commit: int | None = None, resume: int = 0
) -> list[dict[str, Any]]:
    """One failed attempt: start, maybe a commit, a failure, a restart."""
    lines = [ev(t, n, attempt_started(resume))]
    if commit is not None:
        lines.append(ev(t + 1, n, committed(commit)))
    lines.append(ev(t + 2, n, failed(kind, commit)))
    lines.append(ev(t + 3, n, restart(1.0)))
    return lines


def test_gave_up_and_running_outcomes() -> None:
    """A give-up row names the failure kind; a later attempt without an end is running."""
    lines = [
        *crash_attempt(1, 0, commit=4),
        ev(5, 2, attempt_started(5)),
        ev(6, 2, failed("hang", 7, "rank 0 hung")),
        ev(8, 2, JobGaveUp(reason="restart budget spent: 1 of 1 restarts used")),
    ]
    got = rows(lines)
    assert [r.outcome for r in got] == ["crash", "gave up: hang"]
    assert got[1].detail == "rank 0 hung; gave up: restart budget spent: 1 of 1 restarts used"
    assert got[1].ended == at(6)  # the failure, not the give-up decision, ends the attempt
    assert got[1].seconds_lost == 1.0  # no commit in attempt 2: from its start to the failure
    assert got[0].steps_lost == 0
    running = rows([*lines[:-2], ev(7, 2, committed(6))])
    assert running[1].outcome == "running"
    assert running[1].ended is None
    assert running[1].checkpoint_step == 6


def test_attempt_without_end_before_a_new_start_is_unknown() -> None:
    """If the daemon died mid-attempt and a new start followed, that attempt is not 'running'."""
    lines = [ev(0, 1, attempt_started(0)), ev(100, 0, job_started())]
    assert [r.outcome for r in rows(lines)] == ["unknown"]
    lines.append(ev(101, 2, attempt_started(0)))
    assert [r.outcome for r in rows(lines)] == ["unknown", "running"]


def test_malformed_events_are_tolerated() -> None:
    """Bad timestamps, attempts or field types are ignored instead of crashing the reader."""
    lines: list[dict[str, Any]] = [
        {**ev(0, 1, attempt_started(0)), "timestamp": None},
        {**ev(0, 1, attempt_started(0)), "resume_step": "x"},  # a required field: skipped
        {**ev(1, 1, committed(3)), "timestamp": "yesterday"},
        {**ev(2, 1, failed("crash", None)), "attempt": True},
        {**ev(3, 1, failed("crash", None)), "ranks": "oops", "detail": 5},
        {**ev(4, 1, restart(1.0)), "backoff_s": None},  # a required field: skipped
    ]
    parsed = parse_all(lines)
    assert (len(parsed.entries), parsed.invalid) == (4, 2)
    (row,) = attempt_rows(parsed.entries)
    assert (row.started, row.resume_step, row.checkpoint_step, row.outcome, row.detail) == (
        at(3),
        None,
        None,
        "crash",
        "5",
    )
    assert row.seconds_lost == 0.0  # no backoff known


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2026-11-22T19:03:01.123456Z", datetime(2026, 11, 22, 19, 3, 1, 123456, timezone.utc)),
        ("2026-11-22T20:03:01+01:00", datetime(2026, 11, 22, 19, 3, 1, tzinfo=timezone.utc)),
        ("2026-11-22T19:03:01", datetime(2026, 11, 22, 19, 3, 1, tzinfo=timezone.utc)),
        ("not a time", None),
        (12345, None),
    ],
)
def test_parse_timestamp(text: object, expected: datetime | None) -> None:
    """ISO-8601 with Z, an offset or none (taken as UTC) parses; anything else is None."""
    assert parse_timestamp(text) == expected


def test_stop_during_backoff_keeps_the_failure() -> None:
    """A stop logged while waiting to restart leaves the attempt a crash that ended at detection."""
    lines = [*crash_attempt(1, 0, commit=4), ev(30, 1, stopped("stopped", None))]
    (row,) = rows(lines)
    assert (row.outcome, row.ended, row.last_step) == ("crash", at(2), 4)
    assert row.seconds_lost == 2.0  # 1 s from the commit to the failure, plus the 1 s backoff


def test_an_attempt_closed_by_a_later_start_ends_where_it_was_last_seen() -> None:
    """An attempt whose daemon died is ``unknown`` (and listed by ``unfinished``) until the next
    start logs ``attempt_closed``: then it is ``supervisor lost``, ended when last seen, its steps
    since the checkpoint lost, and nothing is unfinished any more."""
    from supervisor.record.history import unfinished
    from supervisor.record.schema import AttemptClosed

    before = [
        ev(0, 0, job_started()),
        ev(1, 1, attempt_started(0)),
        ev(5, 1, committed(9)),
        ev(30, 0, job_started()),
    ]
    assert [(r.attempt, r.outcome) for r in unfinished(rows(before))] == [(1, "unknown")]
    closed = AttemptClosed(
        outcome="supervisor lost", last_seen=format_timestamp(at(12)), last_step=15
    )
    after = [
        *before,
        ev(30.5, 1, closed),
        ev(31, 2, attempt_started(10)),
        ev(40, 2, JobSucceeded(last_step=19)),
    ]
    first, second = rows(after)
    assert (first.outcome, first.ended, first.last_step) == ("supervisor lost", at(12), 15)
    assert first.steps_lost == 6
    assert first.seconds_lost == pytest.approx(7.0)
    assert second.outcome == "succeeded"
    assert unfinished(rows(after)) == []


def test_the_resume_step_is_what_the_ranks_loaded() -> None:
    """attempt_started announced step-149, which proved corrupt when read: the ranks fell back to
    step-99 (checkpoint_loaded), so the row resumes at 100 and the crash before it lost the 50
    steps redone, not 0."""
    lines = [
        ev(0, 0, job_started()),
        ev(1, 1, attempt_started(0)),
        ev(20, 1, committed(99)),
        ev(30, 1, committed(149)),
        ev(40, 1, failed("crash", 150, "rank 1 killed by SIGKILL at step 150", ranks=(1,))),
        ev(41, 1, restart(0.5)),
        ev(42, 2, attempt_started(150)),
        ev(43, 2, CheckpointSkipped(path="/c/step-149", reason="damaged", rank=0)),
        ev(44, 2, CheckpointLoaded(resume_step=100, checkpoint="/c/step-99", world_size=2)),
        ev(60, 2, JobSucceeded(last_step=199)),
    ]
    first, second = rows(lines)
    assert second.resume_step == 100
    assert first.steps_lost == 51  # 150 - (100 - 1)


def test_steps_lost_are_shown_next_to_the_source_resumed_from(local_tz: None) -> None:
    """A crash followed by a resume from a memory snapshot: the row counts the steps redone and
    says they were redone from memory (the table: ``1 (memory)``); the next row's source is
    what its ranks loaded."""
    crash = FailureDetected(
        kind="crash",
        ranks=(1,),
        exit_codes=(),
        signals=("SIGKILL",),
        last_step=24,
        detail="rank 1 killed by SIGKILL at step 24",
        diagnostics=None,
        detect_s=0.01,
        hang_timeout_s=None,
        noticed_at=None,
        nodes=(),
    )
    lines = [
        ev(0, 1, attempt_started(0)),
        ev(10, 1, crash),
        ev(11, 2, dataclasses.replace(attempt_started(24), source="memory")),
        ev(11.5, 2, CheckpointLoaded(resume_step=24, checkpoint="shm/23", source="memory")),
        ev(20, 2, JobSucceeded(last_step=59)),
    ]
    first, second = rows(lines)
    assert (first.steps_lost, first.redone_from, first.source) == (1, "memory", None)
    assert (second.source, second.resume_step) == ("memory", 24)
    assert " 1 (memory) " in render_table([first, second]).splitlines()[1]
