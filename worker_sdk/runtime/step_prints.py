"""The resume check's part in a rank: fingerprints of the steps after each resume and save.

A restarted attempt redoes steps its predecessor already ran; when the resume is exact, it
computes the same values there. So after ``resume()`` and after each save (a checkpoint or a
memory snapshot) of step ``c``, the steps ``c + 1 .. c + WINDOW`` are *armed*:

- the loss ``step()`` is given at an armed step is kept (a reference: a tensor is read when
  sent, as the heartbeat reads the loss, so that no step waits for the device);
- at the one armed step ``g`` with ``(g + 1) % WINDOW == 0`` (a grid, so that every attempt
  takes it at the same step), a sampled checksum of the registered modules' parameters is
  computed where they live and read when sent.

What was kept goes to the supervisor (``STEP_PRINTS``) at heartbeats, at the next save and at
the end; it compares a resumed attempt's values with those of the attempts before it
(:mod:`supervisor.ranks.resume_prints`). Every attempt arms the steps after the checkpoint the
next one resumes from: it either saved that checkpoint or resumed from it. Only ranks below
:data:`~worker_sdk.contract.protocol.PRINT_RANKS` send.

The per-step cost is in ``worker_sdk.step``: with a loss, two comparisons and a store into a
list made once.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Final

import torch
from torch import nn

from worker_sdk.contract import messages as m
from worker_sdk.contract.protocol import PRINT_WINDOW as WINDOW
from worker_sdk.contract.training_messages import float_bits

from .replicas import sampled_sum

__all__ = ["WINDOW", "StepPrints", "loss_value", "parameter_sum"]

_SAMPLE: Final = 1024  # elements per parameter at most in a checksum
_NEVER: Final = 1 << 62


class StepPrints:
    """One rank's fingerprints; ``send`` is None where nothing is sent (unsupervised, or a rank
    at or above ``PRINT_RANKS``): nothing is ever armed then."""

    __slots__ = ("base", "modules", "params", "params_at", "send", "sent", "until", "values")

    def __init__(
        self, modules: Sequence[nn.Module], send: Callable[[m.StepPrints], object] | None
    ) -> None:
        self.send = send
        self.modules = list(modules)
        self.values: list[Any] = [None] * WINDOW  # step base + i at i
        self.base = 0  # the first step values[0] stands for
        self.until = 0  # armed: base <= step < until (read by worker_sdk.step)
        self.sent = 0  # values[:sent] went out
        self.params_at = _NEVER  # the step whose parameters are summed (the slow path)
        self.params: tuple[int, torch.Tensor] | None = None  # (step, sum) not yet read

    def arm(self, first: int) -> None:
        """Steps ``first .. first + WINDOW - 1`` are fingerprinted (after a resume that
        starts at ``first`` or a save of ``first - 1``); what was kept before goes out now."""
        if self.send is None:
            return
        self.flush()
        self.base, self.until, self.sent = first, first + WINDOW, 0
        for i in range(WINDOW):
            self.values[i] = None
        grid = (first + WINDOW) // WINDOW * WINDOW - 1  # the one step g with (g + 1) % W == 0
        self.params_at = grid if self.modules else _NEVER

    def take_params(self, step: int) -> None:
        """At ``params_at`` (the slow path): sum the parameters where they are; read later."""
        self.params_at = _NEVER
        if step < self.until:
            self.params = (step, parameter_sum(self.modules))

    def flush(self) -> None:
        """Send what was kept since the last time (reads a tensor loss and the checksum)."""
        if self.send is None:
            return
        top = WINDOW
        while top > self.sent and self.values[top - 1] is None:
            top -= 1
        losses = tuple(loss_value(v) for v in self.values[self.sent : top])
        params = self.params
        self.params = None
        if not losses and params is None:
            return
        first = self.base + self.sent
        self.sent = max(self.sent, top)
        bits = None if params is None else float_bits(float(params[1]))
        self.send(
            m.StepPrints(
                first,
                losses,
                None if params is None else params[0],
                bits,
                exact=exact(),
            )
        )


def exact() -> bool:
    """Whether a repeated computation gives the same bits here: CUDA was never used, or
    torch's deterministic algorithms are on (CPU kernels repeat themselves)."""
    used_cuda: bool = torch.cuda.is_initialized()  # type: ignore[no-untyped-call]
    return torch.are_deterministic_algorithms_enabled() or not used_cuda


def parameter_sum(modules: Sequence[nn.Module]) -> torch.Tensor:
    """The checksum: the float64 sum of a strided sample of every parameter this rank holds
    (:func:`~worker_sdk.runtime.replicas.sampled_sum`), left where it was computed."""
    return sampled_sum(modules, sample=_SAMPLE)


def loss_value(loss: Any) -> float | None:
    """A loss ``step()`` was given as a float (a tensor read now), None when it is none."""
    if loss is None:
        return None
    try:
        return loss if loss.__class__ is float else float(loss)
    except (TypeError, ValueError, RuntimeError):
        return None
