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


def test_smoke_is_small_and_full_has_every_case() -> None:
    """Smoke runs one healthy case and one hang; the full campaign adds the 120 s evaluation."""
    assert [c.hang for c in cases("smoke")] == [False, True]
    full = {c.label for c in cases("full")}
    assert "rank 0 evaluates alone 120 s" in full and len(full) == 9
