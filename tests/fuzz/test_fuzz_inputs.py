"""Property tests (hypothesis) of what the daemon reads from outside: job.toml documents, frames
on the rank channel, lines of events.jsonl (``RVSUP_FUZZ_EXAMPLES`` sets how many cases each
property tries; 150 in the suite). None of them may crash the daemon or the CLI: a bad
job.toml is a keyed ConfigError, a bad frame a counted BadMessageError, a bad line a skipped one.
"""

from __future__ import annotations

import json
import math
import os
import struct
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from supervisor.config.load import _SECTION_KEYS, parse_config
from supervisor.config.model import ConfigError, JobConfig
from supervisor.ranks.rank_table import RankTable
from supervisor.ranks.reports import exit_from_report
from supervisor.record import history, summary
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

# RVSUP_FUZZ_EXAMPLES=5000 for a longer search than the suite's
FAST = settings(
    max_examples=int(os.environ.get("RVSUP_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
KEY = b"k" * 32

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
    st.sampled_from(["0", "off", "auto", "10s", "-1m", "1e309h", "tcp", "python", "true", "∞"]),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
known_keys = st.sampled_from(sorted({k for keys in _SECTION_KEYS.values() for k in keys}))
sections = st.dictionaries(
    st.sampled_from([*_SECTION_KEYS, "bogus"]),
    st.dictionaries(known_keys | st.text(max_size=10), values, max_size=6) | values,
    max_size=7,
)


@FAST
@given(sections)
@example({"job": {"name": "x", "command": ["python"]}, "checkpoint": {"async": "yes"}})
@example({"launch": {"nproc_per_node": 2**70}})
@example({"heartbeat": {"interval": float("nan")}})
# found by this test: keys with line breaks split a problem's line in two
@example({"job": {"\r": None}})
@example({"job": {"\x85": None}})
@example({"job": {"env": {"\r": None}}})
@example({"bogus\nsection": {}})
def test_any_job_document_is_accepted_or_refused_with_keyed_messages(
    data: dict[str, Any],
) -> None:
    """Whatever the document holds, validation returns a configuration or raises ConfigError,
    each of whose lines names the file and the key (or section) at fault."""
    path = Path("/jobs/fuzz/job.toml")
    try:
        cfg = parse_config(data, path)
    except ConfigError as e:
        assert e.issues
        for line in str(e).splitlines():
            assert line.startswith(f"{path}: ")
        for issue in e.issues:
            known = issue.key.split(".")[0] in (*_SECTION_KEYS, "bogus", "")
            assert known or issue.key.startswith('"'), issue  # an odd section name, quoted
        return
    assert isinstance(cfg, JobConfig)


_HEADER = struct.Struct("<3sBBxxxiIIQqd")


@FAST
@given(
    kind=st.integers(0, 255),
    flags=st.integers(0, 255),
    rank=st.integers(-(2**31), 2**31 - 1),
    attempt=st.integers(0, 2**32 - 1),
    seq=st.integers(0, 2**64 - 1),
    step=st.integers(-(2**63), 2**63 - 1),
    value=st.floats(allow_nan=True, allow_infinity=True),
    payload=st.binary(max_size=64) | values.map(lambda v: json.dumps(v).encode()),
)
def test_authenticated_frames_of_any_content_never_crash_the_rank_table(
    kind: int,
    flags: int,
    rank: int,
    attempt: int,
    seq: int,
    step: int,
    value: float,
    payload: bytes,
) -> None:
    """A frame that passes the MAC (a buggy or hostile rank knowing the secret) with any header
    and payload decodes to a Message or raises BadMessageError; a decoded one folds into the
    rank table, and a RANK_EXIT report is read or rejected, without an exception."""
    body = _HEADER.pack(p.MAGIC, kind, flags, rank, attempt, 4242, seq, step, value) + payload
    frame = body + p.mac(KEY, body)
    try:
        msg = p.decode(KEY, frame)
    except p.BadMessageError as e:
        assert e.reason
        return
    table = RankTable()
    st_ = table.fold(b"id", msg.rank, msg.pid, m.read(msg), 100.0)
    assert st_.rank == msg.rank
    exit_from_report(msg)
    table.ranks[msg.rank].to_status(101.0)


@FAST
@given(st.binary(max_size=300))
def test_random_bytes_are_dropped_with_a_reason(frame: bytes) -> None:
    """Unauthenticated bytes never decode."""
    try:
        p.decode(KEY, frame)
    except p.BadMessageError as e:
        assert e.reason in ("oversized", "truncated", "unauthenticated")
    else:  # pragma: no cover - a forged MAC
        raise AssertionError("decoded random bytes")


def _valid_lines() -> list[str]:
    t = "2026-01-01T00:00:0{}.000000Z"
    lines = [
        {
            "event": "job_started",
            "config": "j",
            "host": "h",
            "pid": 1,
            "slurm_job_id": None,
            "restart_count": None,
            "restarts_used": 0,
            "attempt": 0,
        },
        {
            "event": "attempt_started",
            "resume_step": 0,
            "checkpoint": None,
            "launcher": ["t"],
            "nnodes": 1,
            "nproc_per_node": 2,
            "slurm_job_id": None,
            "restart_count": None,
            "attempt": 1,
        },
        {"event": "job_succeeded", "last_step": 9, "attempt": 1},
    ]
    return [
        json.dumps({"timestamp": t.format(i), "level": "info", "job": "j", **line})
        for i, line in enumerate(lines)
    ]


garbage = st.one_of(
    st.text(max_size=80).filter(lambda s: "\n" not in s and "\r" not in s),
    values.map(json.dumps),
    st.dictionaries(
        st.sampled_from(["event", "timestamp", "attempt", "step", "level"]), values
    ).map(json.dumps),
)


@FAST
@given(st.lists(garbage, max_size=8), st.integers(0, 3), st.integers(0, 40))
def test_torn_and_garbage_history_lines_are_skipped_and_counted(
    junk: list[str], where: int, cut: int
) -> None:
    """Garbage lines mixed into a valid history, and a torn last line: the history still reads,
    renders and sums up; every line is either an entry or counted as skipped or unknown."""
    import tempfile

    lines = _valid_lines()
    lines[where:where] = junk
    text = "\n".join(lines) + "\n" + lines[0][:cut]
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "events.jsonl"
        path.write_text(text)
        past = history.read(path)
    counted = len(past.entries) + past.unreadable + past.invalid + past.unknown
    blank = sum(1 for line in junk if not line.strip())
    assert len(lines) - blank <= counted <= len(lines) + (1 if cut else 0)
    assert len(past.entries) >= 3 or junk  # the valid lines always read
    rows = history.attempt_rows(past.entries)
    history.render_table(rows)
    total = summary.summarize(rows, datetime(2026, 1, 2, tzinfo=timezone.utc))
    assert total.goodput is None or (0.0 <= total.goodput <= 1.0 and not math.isnan(total.goodput))
