"""events.jsonl -> attempt rows: outcomes, steps/seconds lost, table, JSON, torn lines, budget."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from supervisor.record.history import (
    AttemptRow,
    BudgetState,
    attempts,
    budget_state,
    format_timestamp,
    parse_timestamp,
    read_events,
    render_table,
    rows_to_json,
)

T0 = datetime(2026, 11, 22, 19, 0, 0, tzinfo=timezone.utc)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def ev(t: float, event: str, attempt: int, /, **fields: Any) -> dict[str, Any]:
    """One event line as the supervisor writes it, ``t`` seconds after T0."""
    return {
        "timestamp": format_timestamp(at(t)),
        "event": event,
        "level": "info",
        "job": "gpt-small",
        "attempt": attempt,
        **fields,
    }


# Attempt 1 crashes at step 120 (checkpoint 99), attempt 2 is preempted and saves at 160,
# a requeued allocation runs attempt 3 to the end.
STREAM = [
    ev(0, "job_started", 0, config="job.toml", slurm_job_id="4242", restart_count=0, host="n1"),
    ev(1, "attempt_started", 1, resume_step=0, checkpoint=None, launcher=["torchrun"], nnodes=1),
    ev(20, "checkpoint_committed", 1, step=49, path="ckpt/49", seconds=0.5, bytes=10),
    ev(40, "checkpoint_committed", 1, step=99, path="ckpt/99", seconds=0.5, bytes=10),
    ev(
        50,
        "failure_detected",
        1,
        kind="crash",
        ranks=[1],
        exit_codes=[],
        signals=["SIGKILL"],
        last_step=120,
        detail="rank 1 killed by SIGKILL at step 120",
        diagnostics=None,
        detect_s=0.2,
    ),
    ev(51, "restart_scheduled", 1, backoff_s=2.5, restarts_left=4, charged=True),
    ev(54, "attempt_started", 2, resume_step=100, checkpoint="ckpt/99", launcher=["torchrun"]),
    ev(70, "checkpoint_committed", 2, step=149, path="ckpt/149", seconds=0.5, bytes=10),
    ev(80, "stop_requested", 2, reason="preempted", source="SIGTERM"),
    ev(
        81,
        "failure_detected",
        2,
        kind="preempted",
        ranks=[],
        last_step=160,
        detail="stopped on preemption at step 160",
    ),
    ev(82, "checkpoint_committed", 2, step=160, path="ckpt/160", seconds=0.5, bytes=10),
    ev(83, "job_stopped", 2, reason="preempted", requeued=True, step=160),
    ev(200, "job_started", 0, slurm_job_id="4242", restart_count="1"),
    ev(201, "attempt_started", 3, resume_step=161, checkpoint="ckpt/160", slurm_job_id=4242),
    ev(203, "rank_started", 3, rank=0),
    ev(250, "checkpoint_committed", 3, step=199, path="ckpt/199", seconds=0.5, bytes=10),
    ev(260, "job_succeeded", 3, last_step=199),
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


def test_three_attempts() -> None:
    """Crash, preemption and success become three rows with the right losses."""
    assert attempts(STREAM) == EXPECTED_ROWS


def test_rows_from_the_file(tmp_path: Path) -> None:
    """The same rows come back through events.jsonl on disk."""
    path = tmp_path / "events.jsonl"
    write_lines(path, STREAM)
    events, skipped = read_events(path)
    assert skipped == 0
    assert attempts(events) == EXPECTED_ROWS


@pytest.mark.parametrize(
    ("tail", "n_events", "skipped"),
    [
        pytest.param(b"", 17, 0, id="clean"),
        pytest.param(b'{"timestamp": "2026-11-22T19:0', 17, 0, id="torn-last-line-not-counted"),
        pytest.param(b'{"timestamp": "2026-11-22T19:0\n', 17, 1, id="bad-complete-line-counted"),
        pytest.param(b"\n\n", 17, 0, id="blank-lines-ignored"),
        pytest.param(b"[1, 2]\n\xff\xfe\n", 17, 2, id="non-object-and-bad-utf8"),
        pytest.param(b'{"event": "job_succeeded"}', 18, 0, id="unterminated-but-whole"),
    ],
)
def test_read_events(tmp_path: Path, tail: bytes, n_events: int, skipped: int) -> None:
    """Unparseable lines are skipped and counted, except a torn last line (a write in progress)."""
    path = tmp_path / "events.jsonl"
    write_lines(path, STREAM, tail)
    events, n_skipped = read_events(path)
    assert (len(events), n_skipped) == (n_events, skipped)
    assert events[: len(STREAM)] == STREAM


def test_torn_last_line_leaves_rows_intact(tmp_path: Path) -> None:
    """A history whose last line was torn by a crash still gives the full attempt table."""
    path = tmp_path / "events.jsonl"
    write_lines(path, STREAM, b'{"timestamp": "2026-11-22T19:10:00Z", "event": "job_st')
    events, skipped = read_events(path)
    assert skipped == 0
    assert attempts(events) == EXPECTED_ROWS


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
    rows = attempts([ev(0, "attempt_started", 1)])
    line = render_table(rows).splitlines()[1]
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


def test_budget_state_of_the_stream() -> None:
    """A new start after the three attempts continues from attempt 3 with one restart used."""
    assert budget_state(STREAM) == BudgetState(
        attempts=3, restarts_used=1, no_progress_streak=0, oom_count=0, last_failure="preempted"
    )


def crash_attempt(
    n: int,
    t: float,
    *,
    kind: str = "crash",
    commit: int | None = None,
    resume: int = 0,
    charged: bool = True,
) -> list[dict[str, Any]]:
    """One failed attempt: start, maybe a commit, a failure, a restart."""
    events = [ev(t, "attempt_started", n, resume_step=resume)]
    if commit is not None:
        events.append(ev(t + 1, "checkpoint_committed", n, step=commit))
    events.append(ev(t + 2, "failure_detected", n, kind=kind, last_step=commit))
    events.append(ev(t + 3, "restart_scheduled", n, backoff_s=1.0, charged=charged))
    return events


@pytest.mark.parametrize(
    ("events", "expected"),
    [
        pytest.param([], BudgetState(0, 0, 0, 0, None), id="empty"),
        pytest.param(
            crash_attempt(1, 0) + crash_attempt(2, 10),
            BudgetState(2, 2, 2, 0, "crash"),
            id="two-without-progress",
        ),
        pytest.param(
            crash_attempt(1, 0, commit=9) + crash_attempt(2, 10, commit=9, resume=10),
            BudgetState(2, 2, 1, 0, "crash"),
            id="recommit-of-resumed-step-is-no-progress",
        ),
        pytest.param(
            crash_attempt(1, 0) + crash_attempt(2, 10, kind="oom", commit=5),
            BudgetState(2, 2, 0, 1, "oom"),
            id="progress-resets",
        ),
        pytest.param(
            crash_attempt(1, 0) + crash_attempt(2, 10, kind="preempted", charged=False),
            BudgetState(2, 1, 1, 0, "preempted"),
            id="uncharged-keeps-streak",
        ),
    ],
)
def test_budget_state(events: list[dict[str, Any]], expected: BudgetState) -> None:
    """Restarts, no-progress streak and OOM count are recovered from the events alone."""
    assert budget_state(events) == expected


def test_gave_up_and_running_outcomes() -> None:
    """A give-up row names the failure kind; a later attempt without an end is running."""
    events = [
        *crash_attempt(1, 0, commit=4),
        ev(5, "attempt_started", 2, resume_step=5),
        ev(6, "failure_detected", 2, kind="hang", last_step=7, detail="rank 0 hung"),
        ev(8, "job_gave_up", 2, reason="restart budget spent: 1 of 1 restarts used"),
    ]
    rows = attempts(events)
    assert [r.outcome for r in rows] == ["crash", "gave up: hang"]
    assert rows[1].detail == "rank 0 hung; gave up: restart budget spent: 1 of 1 restarts used"
    assert rows[1].ended == at(6)  # the failure, not the give-up decision, ends the attempt
    assert rows[1].seconds_lost == 1.0  # no commit in attempt 2: from its start to the failure
    assert rows[0].steps_lost == 0
    running = attempts([*events[:-2], ev(7, "checkpoint_committed", 2, step=6)])
    assert running[1].outcome == "running"
    assert running[1].ended is None
    assert running[1].checkpoint_step == 6


def test_attempt_without_end_before_a_new_start_is_unknown() -> None:
    """If the daemon died mid-attempt and a new start followed, that attempt is not 'running'."""
    events = [
        ev(0, "attempt_started", 1, resume_step=0),
        ev(100, "job_started", 0),
    ]
    assert [r.outcome for r in attempts(events)] == ["unknown"]
    events.append(ev(101, "attempt_started", 2, resume_step=0))
    assert [r.outcome for r in attempts(events)] == ["unknown", "running"]


def test_malformed_events_are_tolerated() -> None:
    """Bad timestamps, attempts or field types are ignored instead of crashing the reader."""
    events: list[dict[str, Any]] = [
        {"event": "attempt_started", "attempt": 1},
        ev(0, "attempt_started", 1, resume_step="x"),
        {**ev(1, "checkpoint_committed", 1, step=3), "timestamp": "yesterday"},
        {**ev(2, "failure_detected", 1, kind="crash"), "attempt": True},
        ev(3, "failure_detected", 1, kind="crash", last_step=None, ranks="oops"),
    ]
    (row,) = attempts(events)
    assert (row.started, row.resume_step, row.checkpoint_step, row.outcome) == (
        at(0),
        None,
        None,
        "crash",
    )


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
    events = [*crash_attempt(1, 0, commit=4), ev(30, "job_stopped", 1, reason="stopped", step=None)]
    (row,) = attempts(events)
    assert (row.outcome, row.ended, row.last_step) == ("crash", at(2), 4)
    assert row.seconds_lost == 2.0  # 1 s from the commit to the failure, plus the 1 s backoff
