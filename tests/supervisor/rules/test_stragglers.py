"""Stragglers: the rule (supervisor/rules/stragglers.py) as tables, its window, and the reports
that turn heartbeats into ``straggler_detected`` (supervisor/ranks/stragglers.py)."""

from __future__ import annotations

import gc

import pytest

from supervisor.ranks.stragglers import JUDGE_EVERY_S, StragglerReports, judge_every_s
from supervisor.rules.stragglers import (
    CONFIRM_S,
    MIN_SAMPLES,
    WINDOW_S,
    Sample,
    StragglerWatch,
    judge,
)
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

N = MIN_SAMPLES  # enough samples


def _samples(wait: float, step: float, n: int = N, steps: int = 10) -> list[Sample]:
    """``n`` heartbeats of ``steps`` steps each, every step ``step`` seconds long, of which the
    rank waited ``wait``."""
    return [Sample(wait, step, steps)] * n


@pytest.mark.parametrize(
    ("samples", "expected"),
    [
        # 2 ranks compute 20 ms a step, rank 1 sleeps 60 ms more: an 80 ms step, rank 0 waits
        # 60 ms of it; rank 1 computes 4x as long; over 10 beats of 10 steps rank 0 waited 6 s
        ({0: _samples(0.06, 0.08), 1: _samples(0.0, 0.08)}, (1, 0.06, 4.0, 6.0)),
        # 4 ranks, rank 2 slow: the others wait 30 ms of a 40 ms step (the median: 30 ms)
        (
            {
                0: _samples(0.03, 0.04),
                1: _samples(0.031, 0.04),
                2: _samples(0.0, 0.04),
                3: _samples(0.029, 0.04),
            },
            (2, 0.03, 4.0, 3.0),
        ),
        # every rank equally slow: nobody waits for anybody
        ({r: _samples(0.001, 0.5) for r in range(3)}, None),
        # a gap below 20 % of the step is jitter, not a straggler
        ({0: _samples(0.015, 0.1), 1: _samples(0.0, 0.1)}, None),
        # ...above it, it is one: 100 ms against 75 ms of compute
        ({0: _samples(0.025, 0.1), 1: _samples(0.0, 0.1)}, (1, 0.025, 1.3333, 2.5)),
        # tiny steps: a gap of 1 ms is under the absolute floor
        ({0: _samples(0.001, 0.002), 1: _samples(0.0, 0.002)}, None),
        # too few samples of a rank: it is not judged; one rank left is no comparison
        ({0: _samples(0.05, 0.06), 1: _samples(0.0, 0.06, N - 1)}, None),
        # the median: a few outliers (a checkpoint save) do not name the saving rank
        (
            {
                0: [Sample(w, 0.05) for w in (0.0,) * 7 + (0.5, 0.5, 0.0)],
                1: [Sample(w, 0.05) for w in (0.0,) * 9 + (0.5,)],
            },
            None,
        ),
        # a slow node: two of four ranks slow; the slowest of them is named
        (
            {
                0: _samples(0.04, 0.05),
                1: _samples(0.04, 0.05),
                2: _samples(0.001, 0.05),
                3: _samples(0.0, 0.05),
            },
            (3, 0.04, 5.0, 4.0),
        ),
        # no step time: nothing is judged
        ({0: _samples(0.05, 0.0), 1: _samples(0.0, 0.0)}, None),
        # ties name the lowest rank
        (
            {0: _samples(0.0, 0.06), 1: _samples(0.0, 0.06), 2: _samples(0.05, 0.06)},
            (0, 0.0, 1.0, 0.0),
        ),
        # the window right after an onset: 4 beats of 20 ms steps before it, 6 of 80 ms after;
        # the figures are those of the steps after it (the medians), and the time lost is
        # what was lost after it (6 beats of 10 steps, 60 ms each)
        (
            {
                0: _samples(0.0, 0.02, 4) + _samples(0.06, 0.08, 6),
                1: _samples(0.0, 0.02, 4) + _samples(0.0, 0.08, 6),
            },
            (1, 0.06, 4.0, 3.6),
        ),
        # waits above the step (noise): the others' compute time is floored at 1 % of a step
        ({0: _samples(0.2, 0.1), 1: _samples(0.0, 0.1)}, (1, 0.2, 100.0, 20.0)),
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
        "just-after-onset",
        "waits-above-step",
    ],
)
def test_judge(
    samples: dict[int, list[Sample]], expected: tuple[int, float, float, float] | None
) -> None:
    """The rank that waits least is the straggler when the others wait for it at least 20 % of
    a step (and 5 ms); ``slower`` is its compute time over the others' median, ``lost_s`` the
    time the others waited for it over the window."""
    found = judge(samples)
    if expected is None:
        assert found is None
        return
    assert found is not None
    rank, per_step, slower, lost = expected
    if per_step == 0.0:  # the tie: the others' median is the middle one
        assert found.rank == rank
        return
    assert found.rank == rank
    assert found.lost_per_step_s == pytest.approx(per_step, abs=1e-4)
    assert found.slower == pytest.approx(slower, rel=1e-3)
    assert found.lost_s == pytest.approx(lost, rel=1e-3)


def test_watch_makes_samples_from_heartbeats() -> None:
    """A heartbeat's sample is its wait with the seconds per step since the rank's previous
    heartbeat; the first heartbeat, one without progress and one without a wait make none."""
    watch = StragglerWatch()
    watch.observe(0, 0.0, 0, 0.01)  # the first: nothing to measure the step time from
    watch.observe(0, 1.0, 10, 0.03)
    watch.observe(0, 1.5, 10, 0.03)  # no progress
    watch.observe(0, 2.0, 30, None)  # no wait: progress only
    watch.observe(0, 3.0, 40, 0.05)
    for t in range(4, 4 + N):
        watch.observe(1, float(t - 4), (t - 4) * 10, 0.0)
    window = watch._ranks[0]
    samples = zip(window.waits, window.step_s, window.steps, strict=True)
    assert list(samples) == [Sample(0.03, 0.1, 10), Sample(0.05, 0.1, 10)]
    assert list(window.at) == [1.0, 3.0]


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


def test_watch_keeps_its_samples_out_of_the_collectors_sight() -> None:
    """A daemon of 16k ranks keeps ~20 samples of each (a heartbeat a second over the window):
    they are kept in arrays of numbers, which the garbage collector does not track, so its full
    collections do not walk them (a tracked object per sample made them cost ~2 % of a core)."""
    watch = StragglerWatch()
    ranks, beats = 50, 2 * N
    for i in range(beats):
        for rank in range(ranks):
            watch.observe(rank, float(i), i, 0.01)
    gc.collect()
    before = len(gc.get_objects())
    for i in range(beats, 2 * beats):
        for rank in range(ranks):
            watch.observe(rank, float(i), i, 0.01)
    gc.collect()
    assert len(gc.get_objects()) - before < ranks  # not one per sample (1,000 more kept)


def _heartbeat(rank: int, step: int, payload: dict[str, object]) -> tuple[int, int, float | None]:
    """A heartbeat frame's rank, and the step and wait the daemon reads from it."""
    msg = p.Message(p.Kind.HEARTBEAT, rank, 1, 100 + rank, step, step, payload=payload)
    body = m.read(msg)
    assert isinstance(body, m.Heartbeat)
    return rank, body.step, body.comm_wait_s


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
        reports.heard(*_heartbeat(0, 10 * i, {"comm_wait_s": 0.04}), t)
        reports.heard(*_heartbeat(1, 10 * i, {"comm_wait_s": 0.0, "loss": 1.0}), t)
        reports.heard(*_heartbeat(1, 10 * i, {"comm_wait_s": True}), t)
        if (event := reports.judge(t, nodes)) is not None:
            events.append(event)
    assert len(events) == 1, events
    event = events[0]
    assert (event.rank, event.node, event.exclude_node) == (1, "n2", exclude)
    assert event.step_s == pytest.approx(0.05) and event.lost_per_step_s == pytest.approx(0.04)
    assert event.slower == pytest.approx(5.0)  # 50 ms of compute against 10 ms
    assert event.lost_s == pytest.approx(0.4 * event.samples)  # 40 ms a step, 10 steps a beat
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


@pytest.mark.parametrize(
    ("ranks", "every_s"), [(1, 1.0), (4096, 1.0), (8192, 2.0), (16384, 4.0), (40960, 10.0)]
)
def test_many_ranks_are_judged_less_often(ranks: int, every_s: float) -> None:
    """Once a second up to 4,096 ranks heard, then once per 4,096 ranks' worth of seconds (a
    judgement costs about 15 µs per rank): the next judgement is that far off."""
    assert judge_every_s(ranks) == every_s
    reports = StragglerReports(exclude=False)
    for rank in range(ranks):
        reports.heard(rank, 1, 0.01, 0.0)
    reports.judge(10.0, {})
    assert not reports.due(10.0 + every_s - 0.01)
    assert reports.due(10.0 + every_s)
