"""The replicas' fingerprint and who differs from the majority (worker_sdk/runtime/replicas.py)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from worker_sdk.runtime.replicas import SAMPLE, ReplicaCheck, divergent, fingerprint


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([7, 7, 7, 7], ()),
        ([7, 7, 8, 7], (2,)),
        ([7, 9, 8, 7, 7], (1, 2)),
        ([7, 8], (0, 1)),  # two ranks that disagree: no majority, both named
        ([7, 7, 8, 8], (0, 1, 2, 3)),
        ([5], ()),
    ],
)
def test_divergent_table(values: list[int], expected: tuple[int, ...]) -> None:
    """The ranks whose fingerprint is not the majority's; every rank when there is none."""
    assert divergent(values) == expected


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(300, 100), nn.Linear(100, 3))


def test_fingerprint_sees_one_flipped_bit_within_a_stride_of_checks() -> None:
    """Equal replicas give equal fingerprints; one flipped bit anywhere is seen by one of
    ``stride`` consecutive checks (the sample's offset moves by one each time)."""
    a, b = _model(), _model()
    assert fingerprint([a], 0) == fingerprint([b], 0)
    weight = next(b.parameters())
    stride = max(1, weight.numel() // SAMPLE)
    assert stride > 1
    with torch.no_grad():
        weight.view(-1)[stride + 3 :][:1].view(torch.int32).bitwise_xor_(1 << 20)
    seen = [fingerprint([a], k) != fingerprint([b], k) for k in range(stride)]
    assert seen.count(True) == 1 and seen[3]


@pytest.mark.parametrize(
    ("every", "last_finished", "first"), [(10, -1, 9), (10, 25, 29), (10, 29, 39), (1, 4, 5)]
)
def test_checks_fall_on_agreed_steps(every: int, last_finished: int, first: int) -> None:
    """The first check after a (re)start is at the next step s with (s + 1) % every == 0:
    every rank computes the same one from the step it resumed at."""
    assert ReplicaCheck(every, [], last_finished).next_step == first
