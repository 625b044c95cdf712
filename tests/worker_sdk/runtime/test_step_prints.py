"""The resume check's fingerprints in a rank (worker_sdk.runtime.step_prints), through
``worker_sdk.step()`` with a channel that keeps what is sent: the losses of the armed steps,
read only when sent; the parameters' checksum on the grid; re-armed after each save."""

from __future__ import annotations

import math
import struct
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from torch import nn

import worker_sdk
from tests.helpers.sdk_fakes import Sent, settings
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p
from worker_sdk.contract.protocol import PRINT_WINDOW
from worker_sdk.runtime.runtime import Runtime
from worker_sdk.runtime.step_prints import StepPrints, parameter_sum


@pytest.fixture
def rank(tmp_path: Path) -> Iterator[tuple[Runtime, Sent, nn.Linear]]:
    """A supervised rank whose fingerprints are armed from step 0, no heartbeat due."""
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    channel = Sent()
    rt = Runtime(settings(tmp_path), [model], None, channel, rank=0, world_size=1)  # type: ignore[arg-type]
    rt.prints = StepPrints([model], channel.send)
    rt.prints.arm(0)
    rt.hb_due = rt.next_due = math.inf
    rt.next_save_step = rt.prints.params_at
    worker_sdk._current = rt
    try:
        yield rt, channel, model
    finally:
        worker_sdk._current = None


def _prints(channel: Sent) -> list[m.StepPrints]:
    return [
        m.StepPrints(
            step,
            tuple(float(v) if v else None for v in payload["losses"].split(","))
            if payload["losses"]
            else (),
            payload["params_step"],
            payload["params"],
            payload["exact"],
        )
        for kind, step, _, payload in channel.messages
        if kind is p.Kind.STEP_PRINTS
    ]


class CountedReads:
    """A loss read (as ``.item()`` on a device would sync) only through ``__float__``."""

    def __init__(self, value: float) -> None:
        self.value, self.reads = value, 0

    def __float__(self) -> float:
        self.reads += 1
        return self.value


def test_armed_losses_are_read_and_sent_only_at_a_heartbeat(
    rank: tuple[Runtime, Sent, nn.Linear],
) -> None:
    """Steps 0-4 with a loss each: nothing is read or sent until a heartbeat is due; then one
    STEP_PRINTS carries the five losses from step 0, each read once, and the next heartbeat
    sends only what came after."""
    rt, channel, _ = rank
    losses = [CountedReads(0.5 + s) for s in range(5)]
    for s, loss in enumerate(losses):
        worker_sdk.step(s, loss=loss)
    assert channel.messages == []
    assert [loss.reads for loss in losses] == [0] * 5
    rt.hb_due = rt.next_due = 0.0
    worker_sdk.step(5, loss=6.5)
    assert _prints(channel) == [m.StepPrints(0, (0.5, 1.5, 2.5, 3.5, 4.5, 6.5), exact=True)]
    assert [loss.reads for loss in losses] == [1] * 5
    rt.hb_due = rt.next_due = 0.0
    worker_sdk.step(6, loss=7.5)
    assert _prints(channel)[1:] == [m.StepPrints(6, (7.5,), exact=True)]


def test_the_parameters_are_summed_on_the_grid_and_a_save_arms_the_steps_after_it(
    rank: tuple[Runtime, Sent, nn.Linear],
) -> None:
    """At the window's grid step (PRINT_WINDOW - 1) the parameters' checksum is taken as
    they are after that step; a save of step 20 sends what was kept and arms 21..36, whose
    grid step is 31; steps outside the armed window keep nothing."""
    rt, channel, model = rank
    for s in range(PRINT_WINDOW):
        worker_sdk.step(s, loss=float(s))
    expected = parameter_sum([model]).item()
    with torch.no_grad():
        for param in model.parameters():  # after the grid step: not in the checksum
            param.add_(1.0)
    for s in range(PRINT_WINDOW, 21):
        worker_sdk.step(s, loss=float(s))  # not armed: kept nowhere
    rt.prints.arm(21)  # what a save of step 20 does (Runtime._next_saves)
    [sent] = _prints(channel)
    assert sent.first == 0
    assert sent.losses == tuple(float(s) for s in range(PRINT_WINDOW))
    assert sent.params_step == PRINT_WINDOW - 1
    assert sent.params == struct.unpack("<q", struct.pack("<d", expected))[0]
    assert (rt.prints.base, rt.prints.until, rt.prints.params_at) == (21, 37, 31)


def test_the_checksum_samples_every_parameter_and_changes_with_any() -> None:
    """Two modules built alike sum alike; one element changed in a large parameter (in the
    sample) changes the sum; a sharded parameter is read as this rank's shard."""
    torch.manual_seed(1)
    a = nn.Linear(64, 64)
    torch.manual_seed(1)
    b = nn.Linear(64, 64)
    assert torch.equal(parameter_sum([a]), parameter_sum([b]))
    with torch.no_grad():
        b.weight.view(-1)[0] += 1e-3
    assert not torch.equal(parameter_sum([a]), parameter_sum([b]))
    assert parameter_sum([]).item() == 0.0


def test_an_unsupervised_rank_never_arms() -> None:
    """Without a channel (or at rank PRINT_RANKS and above) nothing is kept or sent."""
    prints = StepPrints([nn.Linear(2, 2)], None)
    prints.arm(0)
    assert (prints.base, prints.until) == (0, 0)
    prints.flush()
