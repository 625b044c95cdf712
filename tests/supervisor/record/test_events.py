"""The history writer: one JSON object per line, appended, fsynced, schema events only."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from supervisor.record.events import EventLog
from supervisor.record.rundir import EVENTS_FILE
from supervisor.record.schema import (
    Event,
    FailureDetected,
    JobStarted,
    JobSucceeded,
    StopRequested,
    TimeLeftUnknown,
    to_json,
)
from tests.helpers.events import SAMPLES

COMMON = {"timestamp", "event", "level", "job", "attempt"}


def _lines(run_dir: Path) -> list[dict[str, Any]]:
    text = (run_dir / EVENTS_FILE).read_text(encoding="utf-8")
    assert text.endswith("\n")
    out = []
    for line in text.splitlines():
        value = json.loads(line)
        assert isinstance(value, dict)
        out.append(value)
    return out


@pytest.fixture
def log(tmp_path: Path) -> Iterator[EventLog]:
    events = EventLog(tmp_path, "toy", console=None)
    yield events
    events.close()


def started(pid: int) -> JobStarted:
    return JobStarted(
        config="job.toml", host="h", pid=pid, slurm_job_id=None, restart_count=None, restarts_used=0
    )


def test_line_has_common_fields(tmp_path: Path, log: EventLog) -> None:
    """A line carries an ISO-8601 UTC timestamp ending in Z, event, level, job and attempt."""
    before = datetime.now(timezone.utc)
    log.attempt = 3
    log.log(JobSucceeded(last_step=42))
    (line,) = _lines(tmp_path)
    assert set(line) == COMMON | {"last_step"}
    assert line["event"] == "job_succeeded"
    assert line["level"] == "info"
    assert line["job"] == "toy"
    assert line["attempt"] == 3
    assert line["last_step"] == 42
    stamp = line["timestamp"]
    assert isinstance(stamp, str) and stamp.endswith("Z") and "T" in stamp
    parsed = datetime.fromisoformat(stamp[:-1] + "+00:00")
    assert before - timedelta(seconds=1) <= parsed <= datetime.now(timezone.utc)


def test_line_is_on_disk_before_close(tmp_path: Path, log: EventLog) -> None:
    """Each line is written through when log() returns, not at close."""
    log.log(StopRequested(reason="stopped", source="rvsup stop"))
    assert [e["event"] for e in _lines(tmp_path)] == ["stop_requested"]
    log.log(TimeLeftUnknown(error="squeue"))
    assert [(e["event"], e["level"]) for e in _lines(tmp_path)] == [
        ("stop_requested", "info"),
        ("time_left_unknown", "warning"),
    ]


def test_path(tmp_path: Path, log: EventLog) -> None:
    """The file is <run_dir>/events.jsonl."""
    assert log.path == tmp_path / "events.jsonl"


def test_appends_across_instances(tmp_path: Path) -> None:
    """A second EventLog on the same run_dir continues the file instead of replacing it."""
    first = EventLog(tmp_path, "toy", console=None)
    first.log(started(1))
    first.attempt = 1
    first.log(JobSucceeded(last_step=9))
    first.close()
    second = EventLog(tmp_path, "toy", console=None)
    second.log(started(2))
    second.close()
    lines = _lines(tmp_path)
    assert [(e["event"], e["attempt"]) for e in lines] == [
        ("job_started", 0),
        ("job_succeeded", 1),
        ("job_started", 0),
    ]
    assert [e.get("pid") for e in lines] == [1, None, 2]


def test_console_tee_format(tmp_path: Path) -> None:
    """The console line is 'rvsup[job] event k=v ...' without empty values or common fields."""
    console = io.StringIO()
    events = EventLog(tmp_path, "toy", console=console)
    events.attempt = 2
    events.log(
        FailureDetected(
            kind="crash",
            ranks=(1, 2),
            exit_codes=(),
            signals=(),
            last_step=0,
            detail="plain words",
            diagnostics=None,
            detect_s=None,
            hang_timeout_s=None,
            noticed_at="x" * 200,
            nodes=(),
        )
    )
    events.close()
    (line,) = console.getvalue().splitlines()
    expected = (
        "rvsup[toy] failure_detected attempt=2 kind=crash ranks=[1, 2] last_step=0 "
        f"detail=plain words noticed_at={'x' * 157}..."
    )
    assert line == expected
    (stored,) = _lines(tmp_path)
    assert stored["noticed_at"] == "x" * 200  # only the console copy is shortened


def test_no_console_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], log: EventLog
) -> None:
    """console=None writes the file only."""
    log.log(TimeLeftUnknown(error="quiet"))
    assert capsys.readouterr() == ("", "")
    assert len(_lines(tmp_path)) == 1


def test_on_log_sees_each_event_once_it_is_on_disk(tmp_path: Path) -> None:
    """on_log is called with every event logged, in order, after its line is in the file."""
    seen: list[tuple[Event, int]] = []
    log = EventLog(
        tmp_path,
        "toy",
        console=None,
        on_log=lambda event: seen.append((event, len(_lines(tmp_path)))),
    )
    log.log(started(1))
    log.log(JobSucceeded(last_step=3))
    log.on_log = None  # it may be set, or cleared, after construction
    log.log(TimeLeftUnknown(error="x"))
    log.close()
    assert seen == [(started(1), 1), (JobSucceeded(last_step=3), 2)]


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.NAME)
def test_log_writes_the_schema_fields(tmp_path: Path, log: EventLog, event: Event) -> None:
    """log() writes the event's name and level and exactly its fields, lists as JSON lists."""
    log.attempt = 4
    log.log(event)
    (line,) = _lines(tmp_path)
    assert (line["event"], line["level"], line["attempt"]) == (event.NAME, event.LEVEL, 4)
    assert {k: v for k, v in line.items() if k not in COMMON} == to_json(event)
