"""The loss passed to ``worker_sdk.step()``: a float is checked at every step, a tensor read
only when a heartbeat is due; a loss that is not finite is reported at once."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import worker_sdk
from tests.helpers.sdk_fakes import Sent, settings
from worker_sdk.contract import protocol as p
from worker_sdk.runtime.runtime import Runtime


@pytest.fixture
def sent(tmp_path: Path) -> Iterator[tuple[Runtime, Sent]]:
    channel = Sent()
    rt = Runtime(settings(tmp_path), [], None, channel, rank=0, world_size=1)  # type: ignore[arg-type]
    worker_sdk._current = rt
    try:
        yield rt, channel
    finally:
        worker_sdk._current = None


def _no_heartbeat_due(rt: Runtime) -> None:
    rt.hb_due = rt.next_due = math.inf


def test_float_nan_is_reported_at_its_step(sent: tuple[Runtime, Sent]) -> None:
    """A float NaN at step 5 is reported by that step() although no heartbeat is due."""
    rt, channel = sent
    _no_heartbeat_due(rt)
    for s in range(5):
        worker_sdk.step(s, loss=1.0)
    assert channel.messages == []
    worker_sdk.step(5, loss=math.nan)
    worker_sdk.step(6, loss=math.inf)  # reported once: the attempt ends
    [(kind, step, value, payload)] = channel.messages
    assert (kind, step, payload) == (p.Kind.LOSS_NONFINITE, 5, {"since": 5})
    assert math.isnan(value)


def test_tensor_is_read_at_heartbeat_time_only(sent: tuple[Runtime, Sent]) -> None:
    """A tensor loss is not read until a heartbeat is due; its NaN is then dated from the step
    after the previous heartbeat."""
    rt, channel = sent
    worker_sdk.step(0, loss=torch.tensor(2.0))  # the first step heartbeats at once
    assert channel.messages[-1][0] is p.Kind.HEARTBEAT
    assert channel.messages[-1][3] == {"loss": 2.0}
    _no_heartbeat_due(rt)
    for s in range(1, 8):
        worker_sdk.step(s, loss=torch.tensor(math.nan))
    assert len(channel.messages) == 1
    rt.hb_due = rt.next_due = 0.0
    worker_sdk.step(8, loss=torch.tensor(math.nan))
    kinds = [(m[0], m[1], m[3]) for m in channel.messages[1:]]
    assert kinds == [(p.Kind.LOSS_NONFINITE, 8, {"since": 1}), (p.Kind.HEARTBEAT, 8, {})]


def test_without_a_loss_heartbeats_are_as_before(sent: tuple[Runtime, Sent]) -> None:
    """A script that passes no loss sends the same heartbeat as before: no payload."""
    _, channel = sent
    worker_sdk.step(0)
    assert [(m[0], m[3]) for m in channel.messages] == [(p.Kind.HEARTBEAT, {})]


class CountedReads:
    """A loss whose value is read (``float()``, as ``.item()`` on a device would sync) only
    through ``__float__``; counts the reads."""

    def __init__(self) -> None:
        self.reads = 0

    def __float__(self) -> float:
        self.reads += 1
        return 1.5


def test_a_loss_that_is_not_a_float_is_read_once_per_heartbeat(sent: tuple[Runtime, Sent]) -> None:
    """1,000 steps with no heartbeat due never read the loss (no device sync is added); a due
    heartbeat reads it once."""
    rt, _ = sent
    loss = CountedReads()
    _no_heartbeat_due(rt)
    for s in range(1000):
        worker_sdk.step(s, loss=loss)
    assert loss.reads == 0
    rt.hb_due = rt.next_due = 0.0
    worker_sdk.step(1000, loss=loss)
    assert loss.reads == 1
