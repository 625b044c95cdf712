"""Figure 10's reading of a trial's history: hangs declared, in time or not, and slow phases."""

from __future__ import annotations

import json

import pytest

from benchmarks.fig_slow import Verdicts, cases, verdicts


def line(event: str, **fields: object) -> str:
    return json.dumps({"event": event, **fields})


@pytest.mark.parametrize(
    ("lines", "expected"),
    [
        ([], Verdicts(0, 0, 0, ())),
        ([line("slow_phase", ranks=[0], seconds=8.2)], Verdicts(0, 0, 1, ())),
        (
            [line("failure_detected", kind="hang", detect_s=5.2, hang_timeout_s=5.0)],
            Verdicts(1, 1, 0, (5.2,)),
        ),
        (  # later than the timeout + 1 s: declared, not in time
            [line("failure_detected", kind="hang", detect_s=6.5, hang_timeout_s=5.0)],
            Verdicts(1, 0, 0, (6.5,)),
        ),
        ([line("failure_detected", kind="crash", detect_s=None)], Verdicts(0, 0, 0, ())),
        (["not json", "[1]", line("job_succeeded")], Verdicts(0, 0, 0, ())),
    ],
)
def test_verdicts(lines: list[str], expected: Verdicts) -> None:
    """Each row: the lines of an events.jsonl -> hangs, hangs in time, slow phases, latencies."""
    assert verdicts(lines) == expected


@pytest.mark.parametrize(("detect_s", "in_time"), [(30.8, 1), (31.2, 0)])
def test_an_idle_hang_is_in_time_by_its_own_bound(detect_s: float, in_time: int) -> None:
    """A hang with no CPU outside collectives is in time within hang_timeout_idle + 1 s (30 s
    here), whatever the collective timeout was."""
    lines = [line("failure_detected", kind="hang", detect_s=detect_s, hang_timeout_s=5.0)]
    assert verdicts(lines, 30.0) == Verdicts(1, in_time, 0, (detect_s,))


def test_smoke_is_small_and_full_has_every_case() -> None:
    """Smoke runs one healthy case and one hang; the full campaign adds the 120 s evaluation,
    the waits on a thread of its own, slow storage and the hangs with no CPU."""
    assert [c.hang for c in cases("smoke")] == [False, True]
    full = {c.label: c for c in cases("full")}
    assert "rank 0 evaluates alone 120 s" in full and len(full) == 14
    assert sum(c.idle for c in full.values()) == 2
    assert [c.fault for c in full.values() if c.storage] == ["storagewrite:0:60"]
