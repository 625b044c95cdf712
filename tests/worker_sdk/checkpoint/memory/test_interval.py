"""When "auto" snapshots (worker_sdk.checkpoint.memory.interval), from a table."""

from __future__ import annotations

import pytest

from worker_sdk.checkpoint.memory.interval import BUDGET, CEILING, steps_to_wait

CASES = [
    # blocked so far, elapsed, the next one's cost, step time -> steps to wait
    (0.0, 0.0, 0.0, 0.0, 0),  # the first snapshot: nothing measured, nothing owed
    (0.001, 0.1, 0.001, 0.1, 1),  # 1 % of a step each, after one step: 0.2 s needed, 0.1 s had
    (0.001, 0.2, 0.001, 0.1, 0),  # exactly at the budget: taken
    (0.0005, 1.0, 0.0005, 0.1, 0),  # half a percent of a step: every step
    (0.1, 0.5, 0.1, 0.1, 194),  # a costly first one is paid back first: 19.9 s - 0.5 s
    (0.1, 19.9, 0.1, 0.1, 0),  # and then taken
    (2.0, 200.0, 0.1, 0.1, 99),  # what is owed is the whole attempt's, not one interval's
    (0.5, 100.0, 0.05, 0.1, 0),  # a credit (a writer slow to start) is spent at once
    (1.0, 1.0, 1.0, 0.0, CEILING),  # owed, with no step time known: the ceiling
    (1000.0, 1.0, 1.0, 0.001, CEILING),
]


@pytest.mark.parametrize(("blocked", "elapsed", "cost", "step", "wait"), CASES, ids=str)
def test_steps_to_wait(blocked: float, elapsed: float, cost: float, step: float, wait: int) -> None:
    """A snapshot waits the fewest steps that keep the attempt's blocked time within 1 %."""
    n = steps_to_wait(blocked, elapsed, cost, step)
    assert n == wait
    if 0 < n < CEILING:  # the fewest: one step fewer would exceed the budget
        after = elapsed + n * step + cost
        assert blocked + cost <= BUDGET * after * (1 + 1e-9)
        assert blocked + cost > BUDGET * (after - step)
    if n == 0:
        assert blocked + cost <= BUDGET * (elapsed + cost) * (1 + 1e-9)


def test_a_simulated_run_keeps_the_budget() -> None:
    """Snapshots costing 4 % of a step, the first one ten times that: over 10,000 steps the
    blocked share stays within 1 % at every snapshot but the first, and ends at or under it."""
    step, cost, first = 0.1, 0.004, 0.04
    blocked = elapsed = last = 0.0
    snapshots: list[int] = []
    due = 1
    for s in range(1, 10_001):
        elapsed += step
        if s < due:
            continue
        wait = steps_to_wait(blocked, elapsed, last, step)
        if wait:
            due = s + wait
            continue
        last = first if not snapshots else cost
        blocked += last
        elapsed += last
        snapshots.append(s)
        if len(snapshots) > 1:
            assert blocked <= BUDGET * elapsed * (1 + 1e-9)
        due = s + 1
    assert blocked <= BUDGET * elapsed
    assert len(snapshots) > 200  # about one every 40 steps once the first is paid back


def test_bad_arguments_are_refused() -> None:
    """A budget outside (0, 1), a ceiling below 1 or a negative time is an error."""
    with pytest.raises(ValueError, match="bad budget"):
        steps_to_wait(0.1, 1.0, 0.1, 0.1, budget=1.5)
    with pytest.raises(ValueError, match="bad budget"):
        steps_to_wait(0.1, 1.0, 0.1, 0.1, ceiling=0)
    with pytest.raises(ValueError, match="negative"):
        steps_to_wait(-0.1, 1.0, 0.1, 0.1)
