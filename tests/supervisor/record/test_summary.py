"""The history's summary: attempts, failures by kind, steps redone, time lost and goodput, added
up from the attempt rows."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest

from supervisor.record.history import AttemptRow
from supervisor.record.summary import render_summary, summarize, summary_to_json

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def row(
    n: int, start_s: float, end_s: float | None, outcome: str, lost: int, secs: float
) -> AttemptRow:
    return AttemptRow(
        attempt=n,
        started=T0 + timedelta(seconds=start_s),
        ended=None if end_s is None else T0 + timedelta(seconds=end_s),
        outcome=outcome,
        failure_kind=None,
        detail=None,
        resume_step=None,
        last_step=None,
        checkpoint_step=None,
        steps_lost=lost,
        seconds_lost=secs,
        slurm_job_id=None,
        restart_count=None,
    )


@pytest.mark.parametrize(
    ("rows", "now_s", "expected"),
    [
        ([], 0.0, (0, {}, 0, 0.0, 0.0, None)),
        ([row(1, 0, 100, "succeeded", 0, 0.0)], 500.0, (1, {}, 0, 0.0, 100.0, 1.0)),
        (
            [row(1, 0, 40, "crash", 12, 10.0), row(2, 41, 100, "succeeded", 0, 0.0)],
            500.0,
            (2, {"crash": 1}, 12, 10.0, 100.0, 0.9),
        ),
        (
            [
                row(1, 0, 10, "hang", 3, 5.0),
                row(2, 11, 20, "supervisor lost", 4, 5.0),
                row(3, 21, 30, "gave up: hang", 2, 5.0),
            ],
            500.0,
            (3, {"hang": 2, "supervisor lost": 1}, 9, 15.0, 30.0, 0.5),
        ),
        ([row(1, 0, None, "running", 0, 0.0)], 50.0, (1, {}, 0, 0.0, 50.0, 1.0)),
        ([row(1, 0, 10, "stopped", 0, 0.0)], 50.0, (1, {}, 0, 0.0, 10.0, 1.0)),
    ],
)
def test_summary_table(
    rows: list[AttemptRow],
    now_s: float,
    expected: tuple[int, dict[str, int], int, float, float, float | None],
) -> None:
    """Failures are counted by outcome (a give-up by its kind; stops and successes are not
    failures); wall time runs from the first start to the last end (now while running); goodput
    is the share of it not lost."""
    s = summarize(rows, T0 + timedelta(seconds=now_s))
    got = (s.attempts, s.failures, s.steps_redone, s.time_lost_s, s.wall_s, s.goodput)
    assert got[:5] == expected[:5]
    assert got[5] == (None if expected[5] is None else pytest.approx(expected[5]))


def test_summary_renders_one_line_and_json() -> None:
    """The table's closing line and the JSON carry the same figures."""
    s = summarize([row(1, 0, 40, "crash", 12, 10.0), row(2, 41, 100, "succeeded", 0, 0.0)], T0)
    assert render_summary(s) == ("2 attempts (1 crash); 12 steps redone; 10.0s lost of 100.0s")
    assert summary_to_json(s) == {
        "attempts": 2,
        "failures": {"crash": 1},
        "steps_redone": 12,
        "steps_skipped": 0,
        "time_lost_s": 10.0,
        "wall_s": 100.0,
        "goodput": 0.9,
        "resumes": None,
    }


def test_steps_skipped_by_rollbacks_are_summed_and_shown() -> None:
    """Steps skipped by rollbacks add up over the attempts and appear in the line only then."""
    rows = [
        replace(row(1, 0, 25, "nonfinite_loss", 0, 0.4), steps_skipped=6),
        row(2, 26, 40, "succeeded", 0, 0.0),
    ]
    s = summarize(rows, T0)
    assert s.steps_skipped == 6 and s.failures == {"nonfinite_loss": 1}
    assert "0 steps redone; 6 steps skipped by rollbacks; " in render_summary(s)
    assert summary_to_json(s)["steps_skipped"] == 6


def test_resumes_are_counted_by_verdict_and_shown_only_when_checked() -> None:
    """The resume check's verdicts add up over the attempts (a divergence by its kind, whatever
    its step) and close the line; without any, nothing is said of resumes."""
    rows = [
        row(1, 0, 25, "crash", 5, 1.0),
        replace(row(2, 26, 40, "crash", 3, 1.0), resume_check="verified"),
        replace(row(3, 41, 60, "crash", 2, 1.0), resume_check="diverged at step 41"),
        replace(row(4, 61, 80, "succeeded", 0, 0.0), resume_check="unverified"),
    ]
    s = summarize(rows, T0)
    assert s.resumes == {"verified": 1, "diverged": 1, "unverified": 1}
    assert render_summary(s).endswith("; resumes: 1 verified, 1 diverged, 1 unverified")
    assert summary_to_json(s)["resumes"] == s.resumes
    assert "resumes" not in render_summary(summarize(rows[:1], T0))
