"""The history writer: one JSON object per line, appended, with the documented event fields."""

from __future__ import annotations

import io
import json
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest

from supervisor.record.events import EVENTS_FILE, EventLog

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


def test_line_has_common_fields(tmp_path: Path, log: EventLog) -> None:
    """A line carries an ISO-8601 UTC timestamp ending in Z, event, level, job and attempt."""
    before = datetime.now(timezone.utc)
    log.attempt = 3
    log.emit("something", answer=42)
    (line,) = _lines(tmp_path)
    assert set(line) == COMMON | {"answer"}
    assert line["event"] == "something"
    assert line["level"] == "info"
    assert line["job"] == "toy"
    assert line["attempt"] == 3
    assert line["answer"] == 42
    stamp = line["timestamp"]
    assert isinstance(stamp, str) and stamp.endswith("Z") and "T" in stamp
    parsed = datetime.fromisoformat(stamp[:-1] + "+00:00")
    assert before - timedelta(seconds=1) <= parsed <= datetime.now(timezone.utc)


def test_line_is_on_disk_before_close(tmp_path: Path, log: EventLog) -> None:
    """Each line is written through when emit returns, not at close."""
    log.emit("first")
    assert [e["event"] for e in _lines(tmp_path)] == ["first"]
    log.emit("second", level="warning")
    assert [(e["event"], e["level"]) for e in _lines(tmp_path)] == [
        ("first", "info"),
        ("second", "warning"),
    ]


def test_path_and_non_json_values(tmp_path: Path, log: EventLog) -> None:
    """The file is <run_dir>/events.jsonl; values JSON cannot hold are written as text."""
    assert log.path == tmp_path / "events.jsonl"
    log.emit("odd", where=tmp_path / "x", nothing=None)
    (line,) = _lines(tmp_path)
    assert line["where"] == str(tmp_path / "x")
    assert line["nothing"] is None


def test_appends_across_instances(tmp_path: Path) -> None:
    """A second EventLog on the same run_dir continues the file instead of replacing it."""
    first = EventLog(tmp_path, "toy", console=None)
    first.job_started(config="job.toml", host="h", pid=1, slurm_job_id=None, restart_count=0)
    first.attempt = 1
    first.job_succeeded(last_step=9)
    first.close()
    second = EventLog(tmp_path, "toy", console=None)
    second.job_started(config="job.toml", host="h", pid=2, slurm_job_id=None, restart_count=0)
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
    events.emit(
        "demo",
        text="plain words",
        number=5,
        zero=0,
        flag=False,
        items=[1, 2],
        none=None,
        empty="",
        no_items=[],
        no_map={},
        long="x" * 200,
    )
    events.close()
    (line,) = console.getvalue().splitlines()
    expected = (
        "rvsup[toy] demo attempt=2 text=plain words number=5 zero=0 flag=false items=[1, 2] "
        f"long={'x' * 157}..."
    )
    assert line == expected
    (stored,) = _lines(tmp_path)
    assert stored["long"] == "x" * 200  # only the console copy is shortened


def test_no_console_prints_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], log: EventLog
) -> None:
    """console=None writes the file only."""
    log.emit("quiet")
    assert capsys.readouterr() == ("", "")
    assert len(_lines(tmp_path)) == 1


Call = Callable[[EventLog], None]

# (method call, event name, level, the exact documented field names, spot-checked values)
TYPED: list[tuple[str, Call, str, str, set[str], dict[str, Any]]] = [
    (
        "job_started",
        lambda e: e.job_started(
            config="/j.toml", host="n1", pid=7, slurm_job_id="12", restart_count=1, restarts_used=2
        ),
        "job_started",
        "info",
        {"config", "host", "pid", "slurm_job_id", "restart_count", "restarts_used"},
        {"pid": 7, "slurm_job_id": "12"},
    ),
    (
        "attempt_started",
        lambda e: e.attempt_started(
            resume_step=11,
            checkpoint="/c/step-10",
            launcher=("torchrun", "--nnodes=1"),
            nnodes=1,
            nproc_per_node=2,
            slurm_job_id=None,
            restart_count=0,
        ),
        "attempt_started",
        "info",
        {
            "resume_step",
            "checkpoint",
            "launcher",
            "nnodes",
            "nproc_per_node",
            "slurm_job_id",
            "restart_count",
        },
        {"resume_step": 11, "launcher": ["torchrun", "--nnodes=1"], "checkpoint": "/c/step-10"},
    ),
    (
        "checkpoint_committed",
        lambda e: e.checkpoint_committed(
            step=10, path="/c/step-10", seconds=1.234567, nbytes=4096, source="sdk"
        ),
        "checkpoint_committed",
        "info",
        {"step", "path", "seconds", "bytes", "source"},
        {"bytes": 4096, "seconds": 1.2346, "source": "sdk"},
    ),
    (
        "checkpoint_committed, unknown duration",
        lambda e: e.checkpoint_committed(
            step=10, path="/c", seconds=None, nbytes=0, source="watchdog"
        ),
        "checkpoint_committed",
        "info",
        {"step", "path", "seconds", "bytes", "source"},
        {"seconds": None, "source": "watchdog"},
    ),
    (
        "checkpoint_skipped",
        lambda e: e.checkpoint_skipped(path="/c/step-20", reason="torn", rank=1),
        "checkpoint_skipped",
        "warning",
        {"path", "reason", "rank"},
        {"reason": "torn", "rank": 1},
    ),
    (
        "failure_detected",
        lambda e: e.failure_detected(
            kind="crash",
            ranks=(1,),
            exit_codes=(-9,),
            signals=("SIGKILL",),
            last_step=15,
            detail="rank 1 killed",
            diagnostics=None,
            detect_s=0.0123456,
            hang_timeout_s=None,
            noticed_at="2026-01-01T00:00:00Z",
            nodes=["n1"],
        ),
        "failure_detected",
        "error",
        {
            "kind",
            "ranks",
            "exit_codes",
            "signals",
            "last_step",
            "detail",
            "diagnostics",
            "detect_s",
            "hang_timeout_s",
            "noticed_at",
            "nodes",
        },
        {"ranks": [1], "exit_codes": [-9], "signals": ["SIGKILL"], "detect_s": 0.0123},
    ),
    (
        "restart_scheduled",
        lambda e: e.restart_scheduled(
            backoff_s=1.23456, restarts_left=2, charged=True, deterministic=False, note="n"
        ),
        "restart_scheduled",
        "warning",
        {"backoff_s", "restarts_left", "charged", "deterministic", "note"},
        {"backoff_s": 1.235, "charged": True, "deterministic": False},
    ),
    (
        "stop_requested",
        lambda e: e.stop_requested(reason="stopped", source="rvsup stop"),
        "stop_requested",
        "info",
        {"reason", "source"},
        {"reason": "stopped", "source": "rvsup stop"},
    ),
    (
        "job_succeeded",
        lambda e: e.job_succeeded(last_step=59),
        "job_succeeded",
        "info",
        {"last_step"},
        {"last_step": 59},
    ),
    (
        "job_gave_up",
        lambda e: e.job_gave_up(reason="budget spent"),
        "job_gave_up",
        "error",
        {"reason"},
        {"reason": "budget spent"},
    ),
    (
        "job_stopped",
        lambda e: e.job_stopped(reason="preempted", requeued=True, step=40),
        "job_stopped",
        "warning",
        {"reason", "requeued", "step", "note"},
        {"requeued": True, "step": 40, "note": ""},
    ),
    (
        "messages_dropped",
        lambda e: e.messages_dropped(counts={"replayed": 2}),
        "messages_dropped",
        "warning",
        {"counts"},
        {"counts": {"replayed": 2}},
    ),
]


@pytest.mark.parametrize(
    ("call", "event", "level", "keys", "values"),
    [pytest.param(*row[1:], id=row[0]) for row in TYPED],
)
def test_typed_event_fields(
    tmp_path: Path,
    log: EventLog,
    call: Call,
    event: str,
    level: str,
    keys: set[str],
    values: dict[str, Any],
) -> None:
    """Each typed method writes its event name, level and exactly the documented field names."""
    log.attempt = 4
    call(log)
    (line,) = _lines(tmp_path)
    assert line["event"] == event
    assert line["level"] == level
    assert line["attempt"] == 4
    assert set(line) == COMMON | keys
    for key, value in values.items():
        assert line[key] == value, key
