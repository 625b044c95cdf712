"""The supervisor's side of the pruning protection (supervisor/ranks/training.py PruneGuard)."""

from __future__ import annotations

from pathlib import Path

import pytest

from supervisor.ranks.training import PruneGuard
from worker_sdk.contract import layout


@pytest.mark.parametrize(
    ("updates", "expected"),
    [
        # ((earliest onset, newest known commit) in order, the step in the file after them)
        ([(10, None)], 10),
        ([(10, 9), (20, 14)], 20),  # moved past commit 14: the checkpoint kept changes
        ([(10, 9), (20, 9)], 10),  # no commit since 10: the same one kept (9), not written
        ([(10, 4), (20, 4), (30, 24)], 30),
        ([(30, 24), (12, 24)], 12),  # moved back (a new attempt): at once
        ([(10, None), (None, None)], None),  # nothing to protect: the file goes
    ],
)
def test_written_when_the_checkpoint_kept_may_change(
    tmp_path: Path, updates: list[tuple[int | None, int | None]], expected: int | None
) -> None:
    """The step is written when it moves back, or forward past a known commit; else left."""
    guard = PruneGuard(tmp_path, 1)
    for step, newest in updates:
        guard.update(step, newest)
    assert layout.read_protect(tmp_path) == expected


def test_looks_once_per_heartbeat_round(tmp_path: Path) -> None:
    """due() is true at the first report and then once per world_size reports; a new guard
    reads the file."""
    guard = PruneGuard(tmp_path, 3)
    assert [guard.due() for _ in range(7)] == [True, False, False, True, False, False, True]
    guard.update(7, None)
    assert PruneGuard(tmp_path, 3).written == 7
    one = PruneGuard(tmp_path, 1)
    assert [one.due() for _ in range(3)] == [True, True, True]
