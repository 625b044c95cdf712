"""Goodput: the wall time split into goodput and badput by source, folded from the history."""

from __future__ import annotations

from dataclasses import replace
from datetime import datetime, timedelta, timezone

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from supervisor.record import history
from supervisor.record.entries import Entry
from supervisor.record.goodput import (
    BADPUT_SOURCES,
    goodput_of,
    goodput_to_json,
    render_goodput,
)
from supervisor.record.history_file import format_timestamp
from supervisor.record.schema import (
    CheckpointLoaded,
    Event,
    FailureDetected,
    JobSucceeded,
    RestartScheduled,
)
from tests.helpers.events import attempt_started, commit, job_started

T0 = datetime(2026, 1, 1, tzinfo=timezone.utc)


def at(seconds: float, attempt: int, event: Event) -> Entry:
    return Entry(format_timestamp(T0 + timedelta(seconds=seconds)), attempt, "toy", event)


def loaded(resume: int) -> CheckpointLoaded:
    return CheckpointLoaded(resume_step=resume, checkpoint=None, world_size=2)


def saved(step: int, blocked: float) -> Event:
    return replace(commit(step), seconds=blocked * 2, blocked_s=blocked)


def failed(
    kind: str, last_step: int | None, detect_s: float = 0.01, noticed_s: float | None = None
) -> FailureDetected:
    noticed = None if noticed_s is None else format_timestamp(T0 + timedelta(seconds=noticed_s))
    return FailureDetected(
        kind=kind,
        ranks=(1,),
        exit_codes=(1,),
        signals=(),
        last_step=last_step,
        detail="",
        diagnostics=None,
        detect_s=detect_s,
        hang_timeout_s=None,
        noticed_at=noticed,
        nodes=(),
    )


def backoff(seconds: float) -> RestartScheduled:
    return RestartScheduled(
        backoff_s=seconds, restarts_left=3, charged=True, deterministic=False, note=""
    )


ONE_SUCCESS = [
    at(0, 0, job_started()),
    at(0, 1, attempt_started(0)),
    at(5, 1, loaded(0)),
    at(20, 1, saved(9, 1.0)),
    at(45, 1, JobSucceeded(last_step=19)),
]
CRASH_THEN_SUCCESS = [
    at(0, 1, attempt_started(0)),
    at(2, 1, loaded(0)),
    at(12, 1, saved(9, 0.5)),
    at(17, 1, failed("crash", 14, noticed_s=16.5)),
    at(17, 1, backoff(3.0)),
    at(21, 2, attempt_started(10)),
    at(22, 2, loaded(10)),
    at(40, 2, JobSucceeded(last_step=29)),
]
HANG = [
    at(0, 1, attempt_started(0)),
    at(1, 1, loaded(0)),
    at(20, 1, failed("hang", 9, detect_s=6.0, noticed_s=16.0)),
    at(20, 1, backoff(1.0)),
    at(22, 2, attempt_started(0)),
    at(23, 2, loaded(0)),
    at(33, 2, JobSucceeded(last_step=9)),
]
NEVER_STEPPED = [
    at(0, 1, attempt_started(0)),
    at(8, 1, failed("crash", None)),
    at(8, 1, backoff(1.0)),
    at(10, 2, attempt_started(0)),
    at(11, 2, loaded(0)),
    at(21, 2, JobSucceeded(last_step=9)),
]
RUNNING = [at(0, 1, attempt_started(0)), at(2, 1, loaded(0)), at(12, 1, saved(9, 0.0))]


@pytest.mark.parametrize(
    ("entries", "now_s", "wall", "good", "badput", "redone"),
    [
        ([], 0.0, 0.0, 0.0, {}, 0),
        (ONE_SUCCESS, 99.0, 45.0, 39.0, {"startup": 5.0, "checkpoint_save": 1.0}, 0),
        (
            CRASH_THEN_SUCCESS,
            99.0,
            40.0,
            10 * 14 / 15 + 18.0,
            {
                "startup": 3.0,
                "checkpoint_save": 0.5,
                "wasted_progress": 5 * 14 / 15,
                "backoff": 3.0,
                "recovery": 1.5,  # 0.5 s from the crash's first sign to its line, then 1 s
            },
            5,
        ),
        (
            HANG,
            99.0,
            33.0,
            10.0,
            {
                "startup": 2.0,
                "hang_detection": 10.0,  # 6 s silent, then 4 s to its line
                "wasted_progress": 9.0,
                "backoff": 1.0,
                "recovery": 1.0,
            },
            10,
        ),
        (NEVER_STEPPED, 99.0, 21.0, 10.0, {"startup": 9.0, "backoff": 1.0, "recovery": 1.0}, 0),
        (RUNNING, 30.0, 30.0, 28.0, {"startup": 2.0}, 0),
    ],
    ids=["empty", "one-success", "crash", "hang", "never-stepped", "running"],
)
def test_goodput_table(
    entries: list[Entry],
    now_s: float,
    wall: float,
    good: float,
    badput: dict[str, float],
    redone: int,
) -> None:
    """Each history's wall time splits into goodput and badput by source as documented, and the
    parts add up to the wall time."""
    g = goodput_of(entries, T0 + timedelta(seconds=now_s))
    assert g.wall_s == pytest.approx(wall)
    assert g.goodput_s == pytest.approx(good)
    expected = {source: badput.get(source, 0.0) for source in BADPUT_SOURCES}
    assert dict(g.badput_s) == pytest.approx(expected)
    assert g.goodput_s + sum(g.badput_s.values()) == pytest.approx(g.wall_s)
    assert g.steps_redone == redone


def test_steps_redone_and_step_time_per_attempt() -> None:
    """Each attempt carries its steps done, steps redone and mean step time."""
    g = goodput_of(CRASH_THEN_SUCCESS, T0)
    first, second = g.attempts
    assert (first.steps_done, first.steps_redone) == (15, 5)
    assert first.step_s == pytest.approx(14 / 15)
    assert (second.steps_done, second.steps_redone) == (20, 0)
    assert second.step_s == pytest.approx(0.9)


def test_rendered_line_and_json() -> None:
    """The line ``rvsup history`` prints and its JSON carry the same figures."""
    g = goodput_of(ONE_SUCCESS, T0)
    assert render_goodput(g) == (
        "goodput 86.7% (39.0s of 45.0s); badput: startup 5.0s, checkpoint save 1.0s"
    )
    out = goodput_to_json(g)
    assert out["goodput"] == 0.8667 and out["wall_s"] == 45.0
    assert out["badput_s"] == dict.fromkeys(BADPUT_SOURCES, 0.0) | {
        "startup": 5.0,
        "checkpoint_save": 1.0,
    }


attempt_shapes = st.tuples(
    st.floats(0, 10),  # start-up
    st.integers(0, 40),  # steps finished
    st.floats(0.01, 2),  # step time
    st.integers(1, 15),  # checkpoint every
    st.sampled_from(["crash", "hang", "oom"]),
    st.floats(0, 5),  # from the first sign to the line
    st.floats(0, 5),  # backoff
    st.floats(0, 5),  # from the backoff's end to the next launch
)


@settings(max_examples=150, deadline=None)
@given(st.lists(attempt_shapes, min_size=1, max_size=4), st.booleans())
def test_any_history_adds_up_to_its_wall_time(
    shapes: list[tuple[float, int, float, int, str, float, float, float]], ends: bool
) -> None:
    """Whatever the attempts, every part is >= 0, goodput plus badput is the wall time (first
    launch to last end), and the steps redone are the rows'."""
    entries: list[Entry] = []
    t, resume = 0.0, 0
    for n, (startup, steps, step_s, every, kind, after, wait, gap) in enumerate(shapes, 1):
        last = n == len(shapes)
        entries += [at(t, n, attempt_started(resume)), at(t + startup, n, loaded(resume))]
        t += startup
        newest = resume - 1
        for step in range(resume, resume + steps):
            t += step_s
            if (step + 1) % every == 0:
                entries.append(at(t, n, saved(step, 0.0)))
                newest = step
        last_step = resume + steps - 1 if steps else None
        if last and ends:
            entries.append(at(t, n, JobSucceeded(last_step=last_step)))
            break
        if last:
            break
        entries.append(at(t + after, n, failed(kind, last_step, detect_s=1.0, noticed_s=t)))
        entries.append(at(t + after, n, backoff(wait)))
        t += after + wait + gap
        resume = newest + 1
    end = T0 + timedelta(seconds=t + 1.0)
    g = goodput_of(entries, end)
    parts = [g.goodput_s, *g.badput_s.values()]
    assert all(p >= -1e-6 for p in parts), g
    assert sum(parts) == pytest.approx(g.wall_s, abs=1e-5)
    rows = history.attempt_rows(entries)
    last_end = rows[-1].ended or end
    assert g.wall_s == pytest.approx((last_end - rows[0].started).total_seconds(), abs=1e-5)
    assert g.steps_redone == sum(
        min(r.steps_lost, a.steps_done) for r, a in zip(rows, g.attempts, strict=True)
    )
