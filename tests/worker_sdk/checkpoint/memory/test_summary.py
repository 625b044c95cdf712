"""What rank 0 tells the supervisor of its snapshots between them (worker_sdk.checkpoint.memory
.tier, ``heartbeat``): a snapshot that has ended is counted at the next heartbeat, not only at
the next snapshot, which "auto" may put off for many steps."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.sdk_fakes import Sent
from worker_sdk.checkpoint.background.async_save import Outcome
from worker_sdk.checkpoint.memory import tier as tier_module
from worker_sdk.contract import protocol as p


class _Saver:
    """A writer with one snapshot in flight, which ends when ``done`` is set."""

    def __init__(self, _ck: object) -> None:
        self.in_flight: object | None = None
        self.done: Outcome | None = None
        self.polls = 0

    def adopt_forked(self) -> bool:
        return True

    def poll(self) -> Outcome | None:
        self.polls += 1
        if self.done is None:
            return None
        self.in_flight, done, self.done = None, self.done, None
        return done


def _tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rank: int) -> tier_module.MemoryTier:
    monkeypatch.setattr(tier_module, "AsyncSaver", _Saver)
    tier = tier_module.MemoryTier(
        tmp_path, rank=rank, world_size=2, attempt_tag="a1", every=None, channel=None
    )
    tier.channel = Sent()  # type: ignore[assignment]
    return tier


def test_a_snapshot_that_ended_is_reported_at_the_next_heartbeat(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nothing while the writer is at it; once it has committed, one summary with the count,
    the step and the bytes, and no interval (one snapshot has none); nothing more until another
    snapshot ends."""
    tier = _tier(tmp_path, monkeypatch, rank=0)
    saver, channel = tier.saver, tier.channel
    assert isinstance(saver, _Saver) and isinstance(channel, Sent)
    tier.heartbeat(10.0)
    assert (saver.polls, channel.messages) == (0, [])  # nothing in flight: not even a poll
    saver.in_flight = object()
    tier.heartbeat(11.0)
    assert (saver.polls, channel.messages) == (1, [])  # still being written
    saver.done = Outcome(7, True, None, tmp_path, 123, 0.1, 0.01)
    tier.heartbeat(12.0)
    ((kind, newest, _, payload),) = channel.messages
    assert kind == p.Kind.SNAPSHOTS
    assert (payload["count"], newest, payload["bytes"], payload["failed"]) == (1, 7, 123, None)
    assert payload["interval"] is None
    tier.heartbeat(13.0)
    assert len(channel.messages) == 1 and saver.polls == 2


def test_other_ranks_say_nothing_at_heartbeats(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rank 0 sums up; the others' writers are heard at their next snapshot, as before."""
    tier = _tier(tmp_path, monkeypatch, rank=1)
    saver, channel = tier.saver, tier.channel
    assert isinstance(saver, _Saver) and isinstance(channel, Sent)
    saver.in_flight = object()
    saver.done = Outcome(7, False, None, tmp_path, 123, 0.1, 0.01)
    tier.heartbeat(12.0)
    assert (saver.polls, channel.messages) == (0, [])
