"""The memory tier when its tmpfs is full for a while (worker_sdk.checkpoint.memory.tier): it
pauses and tries again later in the same attempt (30 s of training, then twice as long each time
it fails again, at most 10 min), the failed try's files removed; a failure that is not a lack of
room turns it off for the attempt. Driven step by step on a virtual clock with a saver that
stands in for the staging and the writer; one process, no all-gather."""

from __future__ import annotations

import errno
from collections.abc import Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from worker_sdk.checkpoint.background.async_save import Outcome
from worker_sdk.checkpoint.memory import tier as tier_module
from worker_sdk.contract.layout import temp_name


class _Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now


class _Saver:
    """Staging fails with ``errno`` for the steps in ``failing``; else takes a millisecond."""

    def __init__(self, clock: _Clock, failing: range, error: int) -> None:
        self.clock, self.failing, self.error = clock, failing, error
        self.in_flight = None
        self.steps: list[int] = []
        self.abandoned = False

    def adopt_forked(self) -> bool:
        return False

    def start(self) -> None:
        pass

    def submit(self, step: int, objects: Sequence[Any], extra: Any) -> Outcome:
        """Stage the snapshot of ``step``; its outcome, as if heard at once (committed)."""
        if step in self.failing:
            raise OSError(self.error, "No space left on device")
        self.clock.now += 0.001
        self.steps.append(step)
        return Outcome(step, True, None, Path("snapshot"), 1, 0.001, 0.001)

    def poll(self) -> None:
        return None

    def abandon(self) -> None:
        self.abandoned = True


def _train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: range, steps: int, error: int
) -> tuple[tier_module.MemoryTier, _Saver]:
    """``steps`` steps of 0.1 s, a snapshot every step, staging failing at ``failing``."""
    clock = _Clock()
    made: list[_Saver] = []

    def make_saver(ck: object) -> _Saver:
        made.append(_Saver(clock, failing, error))
        return made[-1]

    monkeypatch.setattr(tier_module, "time", SimpleNamespace(monotonic=clock.monotonic))
    monkeypatch.setattr(tier_module, "AsyncSaver", make_saver)
    tier = tier_module.MemoryTier(
        tmp_path, rank=0, world_size=1, attempt_tag="a1", every=1, channel=None
    )
    tier.start(0)
    for step in range(1, steps + 1):
        clock.now += 0.1
        if step == failing.start:  # the failed try left files behind
            (tmp_path / temp_name(step, "a1")).mkdir()
        if step >= tier.next_step:
            tier.snapshot(step, [], None)
    return tier, made[0]


def test_a_full_tmpfs_pauses_the_tier_which_tries_again_later(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ENOSPC staging the snapshot of step 10 (the tmpfs full until step 400): the tier pauses
    at step 11 for 30 s of training (300 steps), tries again at step 311 and fails again, waits
    twice as long, and from about step 912 snapshots every step once more. The failed try's
    temporary folder is removed at the pause; the tier never turned off."""
    tier, saver = _train(tmp_path, monkeypatch, range(10, 400), 1000, errno.ENOSPC)
    assert saver.steps[:9] == list(range(1, 10))
    resumed = saver.steps[9]  # 312 (the second failure seen) + 60 s of 0.1 s steps
    assert 910 <= resumed <= 915, resumed
    assert saver.steps[9:] == list(range(resumed, 1001))
    assert not tier.off and not saver.abandoned
    assert tier.retries == 0  # a snapshot taken since
    assert not (tmp_path / temp_name(10, "a1")).exists()


def test_a_failure_that_is_no_lack_of_room_turns_the_tier_off(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """EIO staging the snapshot of step 10: off for the rest of the attempt, the writer let go."""
    tier, saver = _train(tmp_path, monkeypatch, range(10, 11), 200, errno.EIO)
    assert saver.steps == list(range(1, 10))
    assert tier.off and saver.abandoned
