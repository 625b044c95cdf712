"""The "auto" interval of the memory tier (worker_sdk.checkpoint.memory.interval), from a table."""

from __future__ import annotations

import pytest

from worker_sdk.checkpoint.memory.interval import CEILING, choose

CASES = [
    # blocked_s, step_s -> interval
    (0.0, 0.1, 1),  # nothing measured yet / free: every step
    (0.0005, 0.1, 1),  # 0.5 % of a step: every step
    (0.001, 0.1, 1),  # exactly 1 %: blocked <= 1 % of (step + blocked)
    (0.002, 0.1, 2),
    (0.05, 0.1, 50),  # half a step: every 50 steps
    (1.0, 0.1, 990),
    (1.0, 0.0, CEILING),  # no step time known: the ceiling
    (1000.0, 0.001, CEILING),
]


@pytest.mark.parametrize(("blocked", "step", "interval"), CASES, ids=str)
def test_choose(blocked: float, step: float, interval: int) -> None:
    """The smallest interval that keeps the blocked time at or under 1 % of training time."""
    n = choose(blocked, step)
    assert n == interval
    if 1 < n < CEILING:  # the smallest: one step fewer would exceed the budget
        assert blocked / (n * step + blocked) <= 0.01 < blocked / ((n - 1) * step + blocked)


def test_bad_arguments_are_refused() -> None:
    """A budget outside (0, 1) or a ceiling below 1 is an error."""
    with pytest.raises(ValueError, match="bad budget"):
        choose(0.1, 0.1, budget=1.5)
    with pytest.raises(ValueError, match="bad budget"):
        choose(0.1, 0.1, ceiling=0)
