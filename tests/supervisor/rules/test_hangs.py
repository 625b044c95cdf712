"""The hang timeout rule: percentile, the automatic timeout and which ranks count as hung."""

from __future__ import annotations

import random

import pytest

from supervisor.rules.hangs import (
    FACTOR,
    FLOOR_S,
    PERCENTILE,
    Silence,
    StepTimes,
    auto_timeout,
    hung_ranks,
    percentile,
    quiet_ranks,
)


def test_documented_constants() -> None:
    """The factor and floor are the ones docs/failures.md documents (10 x p99, 5 s)."""
    assert FACTOR == 10.0
    assert FLOOR_S == 5.0


@pytest.mark.parametrize(
    ("values", "q", "expected"),
    [
        pytest.param([3.0], 0.99, 3.0, id="single value"),
        pytest.param([float(v) for v in range(1, 101)], 0.99, 99.0, id="p99 of 1..100 is 99"),
        pytest.param([float(v) for v in range(100, 0, -1)], 0.99, 99.0, id="unsorted input"),
        pytest.param([float(v) for v in range(1, 11)], 0.99, 10.0, id="p99 of 10 is the max"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 0.5, 2.0, id="median of 4: nearest rank 2"),
        pytest.param([5.0, 1.0, 4.0, 2.0, 3.0], 0.5, 3.0, id="median of 5"),
        pytest.param([2.0, 7.0, 1.0], 0.0, 1.0, id="q=0 is the min"),
        pytest.param([2.0, 7.0, 1.0], 1.0, 7.0, id="q=1 is the max"),
        pytest.param([float(v) for v in range(1, 101)], 0.29, 29.0, id="float rounding of q*n"),
    ],
)
def test_percentile(values: list[float], q: float, expected: float) -> None:
    """percentile is the nearest-rank quantile, whatever the input order."""
    assert percentile(values, q) == expected


@pytest.mark.parametrize(
    ("step_times", "interval_s", "ceiling_s", "expected"),
    [
        pytest.param([], 1.0, 1800.0, None, id="no samples: None"),
        pytest.param([0.1], 1.0, 1800.0, 5.0, id="floor: 2+1 < 5"),
        pytest.param([1.0], 1.0, 1800.0, 12.0, id="2 x interval + 10 x step"),
        pytest.param([1.0], 3.0, 1800.0, 16.0, id="interval term doubles the interval"),
        pytest.param([2.0], 0.5, 1800.0, 21.0, id="factor ten on the step"),
        pytest.param([100.0], 1.0, 600.0, 600.0, id="ceiling"),
        pytest.param([0.01], 0.1, 3.0, 3.0, id="a ceiling below the floor wins"),
        pytest.param([1.0] * 99 + [50.0], 1.0, 1800.0, 12.0, id="one outlier in 100 ignored"),
        pytest.param([1.0] * 98 + [50.0] * 2, 1.0, 1800.0, 502.0, id="two outliers in 100 count"),
    ],
)
def test_auto_timeout(
    step_times: list[float], interval_s: float, ceiling_s: float, expected: float | None
) -> None:
    """auto_timeout = min(ceiling, max(5, 2 x interval + 10 x p99)), None before any sample."""
    p99 = percentile(step_times, PERCENTILE) if step_times else None
    got = auto_timeout(p99, interval_s=interval_s, ceiling_s=ceiling_s)
    if expected is None:
        assert got is None
    else:
        assert got == pytest.approx(expected)


def _s(silent_s: float, *, started: bool = True, busy: bool = False, rank: int = 0) -> Silence:
    return Silence(rank=rank, silent_s=silent_s, started=started, busy=busy)


@pytest.mark.parametrize(
    ("silence", "timeout_s", "startup_s", "hung"),
    [
        pytest.param(_s(59, started=False), 10.0, 60.0, False, id="startup: within startup"),
        pytest.param(_s(61, started=False), 10.0, 60.0, True, id="startup: past startup"),
        pytest.param(_s(30, started=False), 100.0, 20.0, True, id="startup ignores larger timeout"),
        pytest.param(_s(30), None, 60.0, False, id="no timeout yet: startup applies"),
        pytest.param(_s(61), None, 60.0, True, id="no timeout yet: past startup"),
        pytest.param(_s(10.0), 10.0, 60.0, False, id="running: exactly at timeout"),
        pytest.param(_s(10.1), 10.0, 60.0, True, id="running: past timeout"),
        pytest.param(_s(30, busy=True), 10.0, 60.0, False, id="busy: startup extends"),
        pytest.param(_s(61, busy=True), 10.0, 60.0, True, id="busy: past startup"),
        pytest.param(_s(80, busy=True), 100.0, 60.0, False, id="busy: timeout larger"),
        pytest.param(_s(101, busy=True), 100.0, 60.0, True, id="busy: past larger timeout"),
        pytest.param(_s(4.0), 3.0, 60.0, True, id="configured timeout below the floor"),
        pytest.param(_s(30, busy=True), None, 60.0, False, id="busy, no timeout: startup"),
    ],
)
def test_hung_ranks_one(
    silence: Silence, timeout_s: float | None, startup_s: float, hung: bool
) -> None:
    """A rank is hung when its silence exceeds the limit of its situation."""
    got = hung_ranks([silence], timeout_s=timeout_s, startup_timeout_s=startup_s)
    assert got == ((silence.rank,) if hung else ())


def test_hung_ranks_many_in_order() -> None:
    """Several ranks: exactly the hung ones, in input order, as a tuple."""
    ranks = [
        _s(20, rank=3),
        _s(1, rank=0),
        _s(20, rank=1, started=False),
        _s(70, rank=2, started=False),
        _s(20, rank=5, busy=True),
        _s(11, rank=4),
    ]
    assert hung_ranks(ranks, timeout_s=10.0, startup_timeout_s=60.0) == (3, 2, 4)
    assert hung_ranks([], timeout_s=10.0, startup_timeout_s=60.0) == ()


@pytest.mark.parametrize(
    ("silence", "margin_s", "near"),
    [
        pytest.param(_s(8.5), 2.0, True, id="within the margin of a 10 s timeout"),
        pytest.param(_s(7.5), 2.0, False, id="before the margin"),
        pytest.param(_s(11.0), 2.0, True, id="past the timeout itself"),
        pytest.param(_s(58.5, started=False), 2.0, True, id="startup: margin of its own limit"),
        pytest.param(_s(20.0, started=False), 2.0, False, id="startup: far from 60 s"),
        pytest.param(_s(58.5, busy=True), 2.0, True, id="busy: margin of the larger limit"),
        pytest.param(_s(9.5), 0.0, False, id="no margin: the timeout itself"),
    ],
)
def test_hung_ranks_with_a_margin(silence: Silence, margin_s: float, near: bool) -> None:
    """With a margin, the ranks that will be hung if they stay silent that much longer (when
    the native stacks of a hang are taken): the limit of each situation, less the margin."""
    got = hung_ranks([silence], timeout_s=10.0, startup_timeout_s=60.0, margin_s=margin_s)
    assert got == ((silence.rank,) if near else ())


def test_quiet_ranks_names_the_furthest_behind_first() -> None:
    """A hang names every rank quiet for at least half the longest hung silence, furthest behind
    first, then the longest silent; ranks still talking are left out."""
    silences = [
        Silence(0, 9.0, True, False),
        Silence(1, 12.0, True, False),
        Silence(2, 0.5, True, False),  # still making progress
        Silence(3, 8.0, True, False),
    ]
    steps = {0: 40, 1: 40, 2: 41, 3: 37}
    assert quiet_ranks(silences, [1], steps) == ((3, 1, 0), 12.0)


def test_step_times_percentile_is_the_sorted_lists() -> None:
    """StepTimes (the incremental multiset the tick reads) gives exactly percentile() of what it
    holds, through any mix of adds and removes, duplicates included."""
    rng = random.Random(7)
    held: list[float] = []
    times = StepTimes()
    assert times.percentile(0.99) is None
    for _ in range(3000):
        if held and rng.random() < 0.4:
            value = held.pop(rng.randrange(len(held)))
            times.remove(value)
        else:
            value = rng.choice([0.02, 0.5, rng.random()])
            held.append(value)
            times.add(value)
        if held:
            for q in (0.0, 0.5, 0.99, 1.0):
                assert times.percentile(q) == percentile(held, q)
    assert len(times) == len(held)
