"""The event schema: one dataclass per event, the writer's JSON, the tolerant reader."""

from __future__ import annotations

import ast
import itertools
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from supervisor.record import schema
from supervisor.record.entries import Entry, parse, parse_all, parse_entry
from supervisor.record.events import EventLog
from supervisor.record.rundir import EVENTS_FILE
from supervisor.record.schema import (
    EVENTS,
    AttemptStarted,
    CheckpointCommitted,
    CheckpointSkipped,
    Event,
    FailureDetected,
    JobGaveUp,
    JobStopped,
    JobSucceeded,
    MessagesDropped,
    RestartScheduled,
    StopRequested,
    to_json,
)
from supervisor.rules.observation import FailureKind, StopReason
from tests.helpers.events import SAMPLES

ROOT = Path(__file__).resolve().parents[3]
COMMON = ("timestamp", "event", "level", "job", "attempt")
ADDED_SINCE_0_1 = frozenset(
    {"resharded_from", "world_size", "format", "mode", "blocked_s", "containment", "node_ranks"}
)
"""Optional fields added after 0.1: null (or an empty map) when an old line is read back."""


def _without_added(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in fields.items() if not (k in ADDED_SINCE_0_1 and v in (None, {}))}


# One line of every event as rvsup wrote them before the schema existed (the old typed methods
# of EventLog, keys in the order written; only the timestamps were made up).
OLD_LINES: list[dict[str, Any]] = [
    {"job": "gpt-small", "attempt": 0, "config": "/jobs/gpt.toml", "host": "n1", "pid": 4711,
     "slurm_job_id": "4242", "restart_count": 0, "restarts_used": 0, "event": "job_started",
     "level": "info", "timestamp": "2026-11-22T19:00:00.320474Z"},
    {"job": "gpt-small", "attempt": 1, "resume_step": 0, "checkpoint": None,
     "launcher": ["torchrun", "--nnodes=1", "--nproc-per-node=2", "train.py"], "nnodes": 1,
     "nproc_per_node": 2, "slurm_job_id": "4242", "restart_count": 0, "event": "attempt_started",
     "level": "info", "timestamp": "2026-11-22T19:00:01.321501Z"},
    {"job": "gpt-small", "attempt": 1, "step": 99, "path": "/ckpt/step-0000000099",
     "seconds": 0.5123, "bytes": 1048576, "source": "sdk", "event": "checkpoint_committed",
     "level": "info", "timestamp": "2026-11-22T19:00:40.321773Z"},
    {"job": "gpt-small", "attempt": 1, "kind": "crash", "ranks": [1], "exit_codes": [],
     "signals": ["SIGKILL"], "last_step": 120, "detail": "rank 1 killed by SIGKILL at step 120",
     "diagnostics": None, "detect_s": 0.0123, "hang_timeout_s": 31.5,
     "noticed_at": "2026-11-22T19:00:50.000000Z", "nodes": [], "event": "failure_detected",
     "level": "error", "timestamp": "2026-11-22T19:00:50.322029Z"},
    {"job": "gpt-small", "attempt": 1, "backoff_s": 2.718, "restarts_left": 4, "charged": True,
     "deterministic": False, "note": "restart 1 of 5 in 2.7s after crash",
     "event": "restart_scheduled", "level": "warning", "timestamp": "2026-11-22T19:00:51.322291Z"},
    {"job": "gpt-small", "attempt": 2, "resume_step": 100, "checkpoint": "/ckpt/step-0000000099",
     "launcher": ["torchrun"], "nnodes": 1, "nproc_per_node": 2, "slurm_job_id": "4242",
     "restart_count": 0, "event": "attempt_started", "level": "info",
     "timestamp": "2026-11-22T19:00:54.322537Z"},
    {"job": "gpt-small", "attempt": 2, "path": "/ckpt/step-0000000149",
     "reason": "torn: MANIFEST.json missing", "rank": 0, "event": "checkpoint_skipped",
     "level": "warning", "timestamp": "2026-11-22T19:00:55.322770Z"},
    {"job": "gpt-small", "attempt": 2, "counts": {"bad_mac": 2, "replayed": 1},
     "event": "messages_dropped", "level": "warning", "timestamp": "2026-11-22T19:00:56.323033Z"},
    {"job": "gpt-small", "attempt": 2, "reason": "preempted", "source": "signal SIGTERM",
     "event": "stop_requested", "level": "info", "timestamp": "2026-11-22T19:01:20.323304Z"},
    {"job": "gpt-small", "attempt": 2, "kind": "preempted", "ranks": [], "exit_codes": [],
     "signals": [], "last_step": 160, "detail": "stopped on preemption at step 160",
     "diagnostics": None, "detect_s": None, "hang_timeout_s": None, "noticed_at": None,
     "nodes": [], "event": "failure_detected", "level": "error",
     "timestamp": "2026-11-22T19:01:21.323497Z"},
    {"job": "gpt-small", "attempt": 2, "job_id": "4242", "error": "scontrol: job not requeueable",
     "event": "requeue_failed", "level": "error", "timestamp": "2026-11-22T19:01:22.323680Z"},
    {"job": "gpt-small", "attempt": 2, "error": "squeue: timed out", "event": "time_left_unknown",
     "level": "warning", "timestamp": "2026-11-22T19:01:22.323913Z"},
    {"job": "gpt-small", "attempt": 2, "reason": "preempted", "requeued": True, "step": 160,
     "note": "", "event": "job_stopped", "level": "warning",
     "timestamp": "2026-11-22T19:01:23.324100Z"},
    {"job": "gpt-small", "attempt": 3, "kind": "hang", "ranks": [0, 1], "exit_codes": [],
     "signals": [], "last_step": 170, "detail": "ranks 0, 1 made no progress for 30.0s",
     "diagnostics": "/runs/gpt/diagnostics/attempt-3", "detect_s": 30.25, "hang_timeout_s": 30.0,
     "noticed_at": "2026-11-22T19:10:00.000000Z", "nodes": ["n2"], "event": "failure_detected",
     "level": "error", "timestamp": "2026-11-22T19:10:00.324312Z"},
    {"job": "gpt-small", "attempt": 3, "reason": "restart budget spent: 5 of 5 restarts used",
     "event": "job_gave_up", "level": "error", "timestamp": "2026-11-22T19:10:01.324493Z"},
    {"job": "gpt-small", "attempt": 4, "last_step": 199, "event": "job_succeeded",
     "level": "info", "timestamp": "2026-11-22T19:20:00.324666Z"},
]  # fmt: skip


def test_registry() -> None:
    """Every event is registered by its unique name, with a valid level and no common field."""
    assert [type(e) for e in SAMPLES] == list(EVENTS.values())
    for name, cls in EVENTS.items():
        assert name == cls.NAME
        assert cls.LEVEL in ("info", "warning", "error")
        assert not {f.name for f in fields(cls)} & set(COMMON), name


def test_every_event_and_field_has_a_docstring() -> None:
    """Each event class has a docstring, and each of its fields a docstring line after it."""
    classes = {
        n.name: n
        for path in sorted((ROOT / "supervisor" / "record" / "schema").glob("*.py"))
        for n in ast.parse(path.read_text()).body
        if isinstance(n, ast.ClassDef)
    }
    for cls in EVENTS.values():
        node = classes[cls.__name__]
        assert ast.get_docstring(node), cls.__name__
        body = node.body
        documented = {
            stmt.target.id
            for stmt, after in itertools.pairwise(body)
            if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name)
            if isinstance(after, ast.Expr) and isinstance(after.value, ast.Constant)
        }
        assert {f.name for f in fields(cls)} <= documented, cls.__name__


@pytest.mark.parametrize("event", SAMPLES, ids=lambda e: e.NAME)
def test_round_trip(event: Event) -> None:
    """An event written (through JSON) and parsed back compares equal to the one logged."""
    line = json.loads(json.dumps({"event": event.NAME, "level": event.LEVEL, **to_json(event)}))
    assert parse(line) == event
    assert all(not isinstance(v, tuple) for v in to_json(event).values())


@pytest.mark.parametrize("line", OLD_LINES, ids=lambda line: f"{line['event']}-{line['attempt']}")
def test_old_lines_read_back(line: dict[str, Any]) -> None:
    """Every line the pre-schema writer produced parses, with exactly its fields and level (and
    the optional fields added since, as null)."""
    entry = parse_entry(line)
    assert entry is not None
    assert (entry.timestamp, entry.attempt, entry.job) == (
        line["timestamp"],
        line["attempt"],
        line["job"],
    )
    assert line["event"] == entry.event.NAME
    assert line["level"] == entry.event.LEVEL
    assert _without_added(to_json(entry.event)) == {
        k: v for k, v in line.items() if k not in COMMON
    }


def test_old_lines_are_written_byte_for_byte(tmp_path: Path) -> None:
    """Logging the events read from old lines rewrites them with the same fields, values and order,
    but the timestamp and the optional fields added since (null)."""
    log = EventLog(tmp_path, "gpt-small", console=None)
    for line in OLD_LINES:
        entry = parse_entry(line)
        assert entry is not None and entry.attempt is not None
        log.attempt = entry.attempt
        log.log(entry.event)
    log.close()
    written = (tmp_path / EVENTS_FILE).read_text(encoding="utf-8").splitlines()
    assert len(written) == len(OLD_LINES)
    for text, old in zip(written, OLD_LINES, strict=True):
        new = _without_added(json.loads(text))
        assert new.pop("timestamp") and list(new) == [k for k in old if k != "timestamp"]
        assert new == {k: v for k, v in old.items() if k != "timestamp"}


def test_building_normalises_values() -> None:
    """Lists become tuples, enum members plain strings, and floats are rounded as written."""
    event = FailureDetected(
        kind=FailureKind.CRASH,
        ranks=[1],  # type: ignore[arg-type]
        exit_codes=(),
        signals=(),
        last_step=None,
        detail="d",
        diagnostics=None,
        detect_s=0.123456,
        hang_timeout_s=2,  # an int is a float
        noticed_at=None,
        nodes=[],  # type: ignore[arg-type]
    )
    assert (event.ranks, event.nodes, event.detect_s, event.hang_timeout_s) == (
        (1,),
        (),
        0.1235,
        2.0,
    )
    assert type(event.kind) is str and event.kind == "crash"
    assert type(StopRequested(reason=StopReason.PREEMPTED, source="x").reason) is str
    assert (
        RestartScheduled(
            backoff_s=1.23456, restarts_left=0, charged=False, deterministic=False, note=""
        ).backoff_s
        == 1.235
    )
    assert (
        CheckpointCommitted(step=1, path="p", seconds=9.87654, bytes=0, source="sdk").seconds
        == 9.8765
    )


@pytest.mark.parametrize(
    "build",
    [
        lambda: JobGaveUp(reason=None),  # type: ignore[arg-type]
        lambda: JobSucceeded(last_step=True),
        lambda: JobStopped(reason="x", requeued="yes", step=None, note=""),  # type: ignore[arg-type]
        lambda: MessagesDropped(counts={"a": 1.5}),  # type: ignore[dict-item]
        lambda: CheckpointSkipped(path="p", reason="r", rank="one"),  # type: ignore[arg-type]
    ],
    ids=["none-for-str", "bool-for-int", "str-for-bool", "float-in-map", "word-for-int"],
)
def test_building_rejects_wrong_types(build: Any) -> None:
    """The writer cannot log a value of the wrong type: building the event raises."""
    with pytest.raises(TypeError):
        build()


def _line(name: str, **fields: Any) -> dict[str, Any]:
    return {
        "timestamp": "2026-11-22T19:00:00Z",
        "event": name,
        "level": "info",
        "attempt": 1,
        **fields,
    }


ATTEMPT = {"resume_step": 5, "nnodes": 1, "nproc_per_node": 2}
TOLERANT: dict[str, tuple[dict[str, Any], Event | None]] = {
    "optional-and-empty-fields-missing": (
        _line("attempt_started", **ATTEMPT),
        AttemptStarted(
            resume_step=5,
            checkpoint=None,
            launcher=(),
            nnodes=1,
            nproc_per_node=2,
            slurm_job_id=None,
            restart_count=None,
        ),
    ),
    "slurm-values-as-text-and-numbers": (
        _line("attempt_started", **ATTEMPT, slurm_job_id=4242, restart_count="1"),
        AttemptStarted(
            resume_step=5,
            checkpoint=None,
            launcher=(),
            nnodes=1,
            nproc_per_node=2,
            slurm_job_id="4242",
            restart_count=1,
        ),
    ),
    "wrong-types-are-unknown": (
        _line("failure_detected", kind="crash", ranks="oops", last_step="x", detect_s=[1]),
        FailureDetected(
            kind="crash",
            ranks=(),
            exit_codes=(),
            signals=(),
            last_step=None,
            detail="",
            diagnostics=None,
            detect_s=None,
            hang_timeout_s=None,
            noticed_at=None,
            nodes=(),
        ),
    ),
    "a-list-with-one-bad-item-is-unknown": (
        _line("failure_detected", kind="hang", ranks=[1, "x"], signals=["SIGKILL"]),
        FailureDetected(
            kind="hang",
            ranks=(),
            exit_codes=(),
            signals=("SIGKILL",),
            last_step=None,
            detail="",
            diagnostics=None,
            detect_s=None,
            hang_timeout_s=None,
            noticed_at=None,
            nodes=(),
        ),
    ),
    "fields-of-no-event-are-ignored": (
        _line("checkpoint_skipped", path="p", reason="r", rank=None, extra="ignored"),
        CheckpointSkipped(path="p", reason="r", rank=None),
    ),
    "flags-only-from-booleans": (
        _line("restart_scheduled", backoff_s=2, restarts_left=1, charged="true"),
        RestartScheduled(
            backoff_s=2.0, restarts_left=1, charged=False, deterministic=False, note=""
        ),
    ),
    "map-with-a-bad-count": (
        _line("messages_dropped", counts={"replayed": "x"}),
        MessagesDropped(counts={}),
    ),
    "required-int-missing": (_line("checkpoint_committed", path="p"), None),
    "required-int-not-a-number": (_line("checkpoint_committed", step="x", bytes=1), None),
    "a-bool-is-not-a-number": (_line("checkpoint_committed", step=True, bytes=1), None),
    "required-float-from-text": (_line("restart_scheduled", backoff_s="2", restarts_left=1), None),
    "unknown-event": (_line("rank_started", rank=0), None),
    "no-event-name": ({"attempt": 1, "step": 3}, None),
}


@pytest.mark.parametrize(("line", "expected"), TOLERANT.values(), ids=list(TOLERANT))
def test_parse_is_tolerant(line: dict[str, Any], expected: Event | None) -> None:
    """Bad optional fields read as unknown/empty; a bad required field or unknown name: None."""
    assert parse(line) == expected


def test_parse_all_counts_what_it_skips() -> None:
    """parse_all keeps good lines in order, counts invalid and unknown ones, reads common fields."""
    good = _line("job_gave_up", reason="r")
    parsed = parse_all(
        [
            good,
            _line("rank_started"),
            {"event": 3},
            _line("checkpoint_committed"),
            {"event": "job_succeeded", "attempt": "2", "timestamp": 5, "job": ["x"]},
            _line("future_event"),
        ]
    )
    assert (parsed.invalid, parsed.unknown) == (2, 2)
    assert parsed.entries == (
        Entry("2026-11-22T19:00:00Z", 1, None, JobGaveUp(reason="r")),
        Entry(None, 2, None, JobSucceeded(last_step=None)),
    )
    assert parse_entry({**good, "attempt": True}) == Entry(
        "2026-11-22T19:00:00Z", None, None, JobGaveUp(reason="r")
    )


def test_describe_lists_every_event_and_field() -> None:
    """describe() renders one Markdown row per event naming its level and every field."""
    rows = schema.describe().splitlines()
    assert rows[0].startswith("| event | level |")
    assert len(rows) == 2 + len(EVENTS)
    for row, cls in zip(rows[2:], EVENTS.values(), strict=True):
        assert row.startswith(f"| `{cls.NAME}` | {cls.LEVEL} |")
        for f in fields(cls):
            assert f"`{f.name}` (" in row
    assert "`seconds` (float or null)" in schema.describe()
    assert "`ranks` (list of int)" in schema.describe()


_PURE = {"__future__", "collections.abc", "dataclasses", "types", "typing", "supervisor.record"}
_SCHEMA = sorted(
    str(p.relative_to(ROOT / "supervisor" / "record"))
    for p in (ROOT / "supervisor" / "record" / "schema").glob("*.py")
)


@pytest.mark.parametrize("module", [*_SCHEMA, "typed_json.py"])
def test_schema_is_pure(module: str) -> None:
    """The schema (which the pure rules import) imports only data and typing modules."""
    tree = ast.parse((ROOT / "supervisor" / "record" / module).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    found = {m for m in found if not m.startswith("supervisor.record.schema.")}
    assert found <= _PURE, sorted(found - _PURE)
