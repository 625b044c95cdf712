"""Fakes for the SDK's runtime in one process: its settings under rvsup, and a channel that keeps
what the rank sends."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p
from worker_sdk.runtime.settings import Settings


def settings(tmp: Path) -> Settings:
    """A supervised rank's settings: no checkpoint directory, heartbeats every second."""
    return Settings(
        supervised=True,
        endpoint=None,
        secret_file=None,
        attempt=1,
        attempt_tag="t",
        checkpoint_dir=None,
        checkpoint_dir_id=None,
        every_steps=0,
        every_s=None,
        keep_last=1,
        async_save=False,
        heartbeat_interval_s=1.0,
        diagnostics_dir=None,
        dump_signal=int(signal.SIGUSR2),
        host="h",
    )


class Sent:
    """A channel that keeps every message (kind, step, value, payload); nothing comes back."""

    closed = False

    def __init__(self) -> None:
        self.messages: list[tuple[p.Kind, int, float, dict[str, Any]]] = []

    def send(self, body: m.Body) -> bool:
        kind, step, value, _, payload = m.fields(body)
        self.messages.append((kind, step, value, payload or {}))
        return True

    def receive(self) -> None:
        return None

    def close(self) -> None:
        self.closed = True
