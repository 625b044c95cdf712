"""What a rank tells the supervisor at interpreter exit (``Runtime.leaving``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.sdk_fakes import Sent, settings
from worker_sdk.contract import protocol as p
from worker_sdk.runtime.runtime import FINAL_SAVE_PHASE, Runtime


class SlowSave:
    """An asynchronous save still being written when the script ends."""

    def __init__(self, channel: Sent, in_flight: bool) -> None:
        self.in_flight: object | None = object() if in_flight else None
        self.channel = channel
        self.waited_after: list[p.Kind] = []

    def wait(self) -> None:
        self.waited_after = [kind for kind, *_ in self.channel.messages]
        self.in_flight = None

    def close(self) -> None:
        pass


@pytest.mark.parametrize("in_flight", [True, False])
def test_leaving_declares_the_wait_for_the_last_save(tmp_path: Path, in_flight: bool) -> None:
    """A save in flight at exit is waited for inside a phase (so that the supervisor's hang
    rule gives it the long timeout), then EXITING says the silence is the end; with nothing in
    flight no phase is declared."""
    channel = Sent()
    rt = Runtime(settings(tmp_path), [], None, channel, rank=0, world_size=1)  # type: ignore[arg-type]
    saver = SlowSave(channel, in_flight)
    rt.saver = saver  # type: ignore[assignment]
    rt.leaving()
    kinds = [kind for kind, *_ in channel.messages]
    if in_flight:
        assert saver.waited_after == [p.Kind.PHASE]
        assert channel.messages[0][0] is p.Kind.PHASE
        assert channel.messages[0][3] == {"name": FINAL_SAVE_PHASE, "begin": True}
    assert kinds[-1] is p.Kind.EXITING and kinds.count(p.Kind.PHASE) == int(in_flight)
    assert channel.closed
