"""Stragglers: the rule (supervisor/rules/stragglers.py) as tables, its window, and the reports
that turn heartbeats into ``straggler_detected`` (supervisor/ranks/stragglers.py)."""

from __future__ import annotations

import pytest

from supervisor.ranks.stragglers import JUDGE_EVERY_S, StragglerReports
from supervisor.rules.stragglers import (
    CONFIRM_S,
    MIN_SAMPLES,
    WINDOW_S,
    Straggler,
    StragglerWatch,
    judge,
    step_time,
)
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

FIVE = MIN_SAMPLES  # enough samples


@pytest.mark.parametrize(
    ("waits", "step_s", "expected"),
    [
        # 2 ranks: rank 1 sleeps 50 ms a step; rank 0 waits for it
        ({0: [0.050] * FIVE, 1: [0.001] * FIVE}, 0.052, (1, 0.049)),
        # 4 ranks, rank 2 slow, the others wait 30 ms of a 40 ms step
        (
            {0: [0.03] * FIVE, 1: [0.031] * FIVE, 2: [0.0] * FIVE, 3: [0.029] * FIVE},
            0.04,
            (2, 0.03),
        ),
        # every rank equally slow: nobody waits for anybody
        ({0: [0.001] * FIVE, 1: [0.0012] * FIVE, 2: [0.0009] * FIVE}, 0.5, None),
        # a gap below 20 % of the step is jitter, not a straggler
        ({0: [0.015] * FIVE, 1: [0.0] * FIVE}, 0.1, None),
        # ...above it, it is one
        ({0: [0.025] * FIVE, 1: [0.0] * FIVE}, 0.1, (1, 0.025)),
        # tiny steps: a gap of 1 ms is under the absolute floor
        ({0: [0.001] * FIVE, 1: [0.0] * FIVE}, 0.002, None),
        # too few samples of a rank: it is not judged; one rank left is no comparison
        ({0: [0.05] * FIVE, 1: [0.0] * (FIVE - 1)}, 0.06, None),
        # the median: a few outliers (a checkpoint save) do not name the saving rank
        ({0: [0.0, 0.0, 0.0, 0.5, 0.5, 0.0], 1: [0.0, 0.0, 0.0, 0.0, 0.0, 0.5]}, 0.05, None),
        # a slow node: two of four ranks slow; the slowest of them is named
        ({0: [0.04] * FIVE, 1: [0.04] * FIVE, 2: [0.001] * FIVE, 3: [0.0] * FIVE}, 0.05, (3, 0.04)),
        # no step time: nothing is judged
        ({0: [0.05] * FIVE, 1: [0.0] * FIVE}, 0.0, None),
        # ties name the lowest rank
        ({0: [0.0] * FIVE, 1: [0.0] * FIVE, 2: [0.05] * FIVE}, 0.06, (0, 0.0)),
    ],
    ids=[
        "two-ranks",
        "four-ranks",
        "uniformly-slow",
        "below-share",
        "above-share",
        "below-floor",
        "too-few-samples",
        "outliers",
        "slow-node",
        "no-step-time",
        "tie",
    ],
)
def test_judge(
    waits: dict[int, list[float]], step_s: float, expected: tuple[int, float] | None
) -> None:
    """The rank that waits least is the straggler when the others wait for it at least 20 % of
    a step (and 2 ms); ``lost_s`` is the others' median wait less its own."""
    found = judge(waits, step_s)
    if expected is None:
        assert found is None
        return
    assert found is not None
    rank, lost = expected
    if lost == 0.0:  # the tie: the others' median is the middle one
        assert found.rank == rank
        return
    assert (found.rank, round(found.lost_s, 4)) == (rank, lost)


@pytest.mark.parametrize(
    ("straggler", "slower"),
    [
        (Straggler(1, 0.001, 0.050, 0.052), 25.5),
        (Straggler(1, 0.0, 0.05, 0.1), 2.0),
        (Straggler(1, 0.0, 0.2, 0.1), 100.0),  # waits above the step (noise): floored
    ],
)
def test_slower_is_busy_time_over_the_others(straggler: Straggler, slower: float) -> None:
    """``slower`` is the straggler's time outside the wait over the others'."""
    assert straggler.slower == pytest.approx(slower)


@pytest.mark.parametrize(
    ("progress", "expected"),
    [
        ({0: [(0.0, 10), (2.0, 30)], 1: [(0.0, 10), (2.0, 30)]}, 0.1),
        ({0: [(0.0, 10), (2.0, 30)], 1: [(0.0, 10), (2.0, 10)]}, 0.1),
        ({0: [(1.0, 10)]}, None),
    ],
    ids=["two-ranks", "one-without-progress", "one-heartbeat"],
)
def test_step_time(progress: dict[int, list[tuple[float, int]]], expected: float | None) -> None:
    """Seconds per step: the median over the ranks that made progress in the window."""
    assert step_time(progress) == (None if expected is None else pytest.approx(expected))


def _feed(watch: StragglerWatch, t0: float, t1: float, waits: dict[int, float]) -> None:
    """Heartbeats every 0.5 s from ``t0`` to ``t1``, a step every 50 ms, each carrying a wait."""
    t = t0
    while t < t1:
        for rank, wait in waits.items():
            watch.observe(rank, t, int(t / 0.05), wait)
        t += 0.5


def test_watch_names_a_straggler_once_and_forgets_it_after_a_window() -> None:
    """A window of normal steps names none; from the onset the slow rank is named within half a
    window and CONFIRM_S, once (not at every judgement); a window after it recovered it is
    forgotten."""
    watch = StragglerWatch()
    _feed(watch, 0.0, 30.0, {0: 0.002, 1: 0.001})
    assert watch.judge(30.0) is None and watch.current is None
    named_at = None
    t = 30.0
    while t < 60.0 and named_at is None:
        _feed(watch, t, t + 1.0, {0: 0.045, 1: 0.0})
        t += 1.0
        if (named := watch.judge(t)) is not None:
            named_at = t
            assert named.straggler.rank == 1 and named.samples >= MIN_SAMPLES
            assert 0.0 < named.window_s <= WINDOW_S
    assert named_at is not None and named_at - 30.0 <= WINDOW_S / 2 + CONFIRM_S + 1
    _feed(watch, t, t + 5.0, {0: 0.045, 1: 0.0})
    assert watch.judge(t + 5.0) is None and watch.current is not None  # still the same one
    _feed(watch, t + 5.0, t + 50.0, {0: 0.002, 1: 0.001})
    assert watch.judge(t + 50.0) is None and watch.current is None


def _named(watch: StragglerWatch, t0: float, t1: float, waits: dict[int, float]) -> list[int]:
    """Heartbeats as :func:`_feed`, judged every second: the ranks named."""
    out = []
    t = t0
    while t < t1:
        _feed(watch, t, t + 1.0, waits)
        t += 1.0
        if (named := watch.judge(t)) is not None:
            out.append(named.straggler.rank)
    return out


def test_watch_names_another_rank_when_it_becomes_the_straggler() -> None:
    """When the slowness moves to another rank, that rank is named (a second event)."""
    watch = StragglerWatch()
    assert _named(watch, 0.0, 30.0, {0: 0.045, 1: 0.0}) == [1]
    assert _named(watch, 30.0, 60.0, {0: 0.0, 1: 0.045}) == [0]


def test_watch_does_not_name_a_rank_slow_for_less_than_confirm_s() -> None:
    """A rank found by the rule for less than CONFIRM_S (descheduled for a moment) is not
    named: the rule must find the same rank at every judgement for that long."""
    watch = StragglerWatch()
    _feed(watch, 0.0, 20.0, {0: 0.045, 1: 0.0})  # the window says rank 1 ...
    t = 20.0
    for flip in range(int(CONFIRM_S) * 2):  # ... but every other judgement finds nobody
        assert watch.judge(t) is None
        waits = {0: 0.045, 1: 0.0} if flip % 2 else {0: 0.0, 1: 0.0}
        _feed(watch, t, t + 20.0, waits)  # a whole window of the one or the other
        t += 20.0
    assert watch.current is None


def test_watch_keeps_enough_samples_of_slow_steps() -> None:
    """Steps of 5 s give one sample per step: the last MIN_SAMPLES of each rank are judged
    however old, so a straggler of such a job is still named (within 60 s of the onset)."""
    watch = StragglerWatch()
    named_at = None
    for i in range(40):  # the onset is at 0
        t = 5.0 * i
        watch.observe(0, t, i, 2.0)
        watch.observe(1, t, i, 0.0)
        if watch.judge(t) is not None and named_at is None:
            named_at = t
    assert named_at is not None and named_at <= 60.0
    assert watch.current is not None and watch.current.rank == 1


def _heartbeat(rank: int, step: int, payload: dict[str, object]) -> tuple[int, m.Heartbeat]:
    """A heartbeat frame's rank and what the daemon reads from it."""
    msg = p.Message(p.Kind.HEARTBEAT, rank, 1, 100 + rank, step, step, payload=payload)
    body = m.read(msg)
    assert isinstance(body, m.Heartbeat)
    return rank, body


@pytest.mark.parametrize("exclude", [False, True])
def test_reports_log_the_straggler_with_its_node(exclude: bool) -> None:
    """Heartbeats' ``comm_wait_s`` name the straggler with its node; with exclude_stragglers
    the node is kept for the next restart and the event says so; a heartbeat without a wait
    (or with a bad one) counts for the step time only."""
    reports = StragglerReports(exclude=exclude)
    nodes = {0: "n1", 1: "n2"}
    events = []
    for i in range(60):
        t = i * 0.5
        reports.heard(*_heartbeat(0, 10 * i, {"comm_wait_s": 0.45}), t)
        reports.heard(*_heartbeat(1, 10 * i, {"comm_wait_s": 0.0, "loss": 1.0}), t)
        reports.heard(*_heartbeat(1, 10 * i, {"comm_wait_s": True}), t)
        if (event := reports.judge(t, nodes)) is not None:
            events.append(event)
    assert len(events) == 1, events
    event = events[0]
    assert (event.rank, event.node, event.exclude_node) == (1, "n2", exclude)
    assert event.step_s == pytest.approx(0.05) and event.lost_s == pytest.approx(0.45)
    assert event.slower == pytest.approx(100.0)  # the others' busy time is floored
    assert reports.to_exclude.keys() == ({"n2"} if exclude else set())
    status = reports.status(30.0)
    assert status is not None and status["rank"] == 1 and status["node"] == "n2"


def test_reports_judge_at_most_once_a_second() -> None:
    """Judging is rate-limited: calls within JUDGE_EVERY_S of the last judgement do nothing, so
    the straggler is named by the judgements made once a second (CONFIRM_S of them)."""
    reports = StragglerReports(exclude=False)
    t, events = 0.0, []
    while t < 30.0:
        reports.heard(*_heartbeat(0, int(t * 10), {"comm_wait_s": 0.08}), t)
        reports.heard(*_heartbeat(1, int(t * 10), {"comm_wait_s": 0.0}), t)
        if (event := reports.judge(t, {})) is not None:
            events.append((t, event))
        t = round(t + 0.1, 1)
    assert len(events) == 1
    named_t, event = events[0]
    assert event.rank == 1 and event.node is None
    first_judged = (MIN_SAMPLES - 1) * 0.1
    assert first_judged + CONFIRM_S <= named_t <= first_judged + CONFIRM_S + 2 * JUDGE_EVERY_S
