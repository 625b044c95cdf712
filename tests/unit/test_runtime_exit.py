"""What a rank tells the supervisor at interpreter exit (``Runtime.leaving``)."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from worker_sdk import protocol as p
from worker_sdk._runtime import FINAL_SAVE_PHASE, Runtime
from worker_sdk._settings import Settings


class Recorder:
    """A channel that keeps what is sent."""

    closed = False

    def __init__(self) -> None:
        self.sent: list[tuple[p.Kind, dict[str, Any]]] = []

    def send(
        self, kind: p.Kind, step: int = -1, payload: dict[str, Any] | None = None, **_: Any
    ) -> bool:
        self.sent.append((kind, payload or {}))
        return True

    def close(self) -> None:
        self.closed = True


class SlowSave:
    """An asynchronous save still being written when the script ends."""

    def __init__(self, sent: list[tuple[p.Kind, dict[str, Any]]], in_flight: bool) -> None:
        self.in_flight: object | None = object() if in_flight else None
        self.sent = sent
        self.waited_after: list[p.Kind] = []

    def wait(self) -> None:
        self.waited_after = [kind for kind, _ in self.sent]
        self.in_flight = None

    def close(self) -> None:
        pass


def settings(tmp: Path) -> Settings:
    return Settings(
        supervised=True,
        endpoint=None,
        secret_file=None,
        attempt=1,
        attempt_tag="t",
        checkpoint_dir=None,
        every_steps=0,
        every_s=None,
        keep_last=1,
        async_save=False,
        heartbeat_interval_s=1.0,
        diagnostics_dir=None,
        dump_signal=int(signal.SIGUSR2),
        host="h",
    )


@pytest.mark.parametrize("in_flight", [True, False])
def test_leaving_declares_the_wait_for_the_last_save(tmp_path: Path, in_flight: bool) -> None:
    """A save in flight at exit is waited for inside a phase (so that the supervisor's hang
    rule gives it the long timeout), then EXITING says the silence is the end; with nothing in
    flight no phase is declared."""
    channel = Recorder()
    rt = Runtime(settings(tmp_path), [], None, channel, rank=0, world_size=1)  # type: ignore[arg-type]
    saver = SlowSave(channel.sent, in_flight)
    rt.saver = saver  # type: ignore[assignment]
    rt.leaving()
    kinds = [kind for kind, _ in channel.sent]
    if in_flight:
        assert saver.waited_after == [p.Kind.PHASE]
        assert channel.sent[0] == (p.Kind.PHASE, {"name": FINAL_SAVE_PHASE, "begin": True})
    assert kinds[-1] is p.Kind.EXITING and kinds.count(p.Kind.PHASE) == int(in_flight)
    assert channel.closed
