"""The resume check's rule: does a resumed attempt compute what the attempts before it computed
at the same steps? Pure: the book that feeds it is :mod:`supervisor.ranks.resume_prints`.

The ranks send fingerprints of the steps after each resume and save
(:mod:`worker_sdk.runtime.step_prints`): the loss ``step()`` was given and, on a grid of steps,
a sampled checksum of the parameters. A resumed attempt redoes the steps from its resume step up
to where the attempt it replaces got; an exact resume repeats their values bit for bit. Where
the values do not repeat bit for bit by nature (CUDA without deterministic algorithms), they
are compared within :data:`TOLERANCE` instead, and the event says so.

:func:`compare_rank` compares one rank's values (those of the earlier attempts, and those the
resumed attempt sent so far), :func:`suspects` says what most likely made a resume differ and
what to change, from where it first did.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Final

from worker_sdk.contract.protocol import PRINT_WINDOW

__all__ = [
    "TOLERANCE",
    "Difference",
    "RankComparison",
    "RankPrints",
    "compare_rank",
    "suspects",
]

TOLERANCE: Final = 1e-3
"""Relative difference allowed where the values are not exact (CUDA, nondeterministic)."""
KEPT_STEPS: Final = 256
"""Steps of values kept per rank from the earlier attempts (the newest)."""


@dataclass(slots=True)
class RankPrints:
    """What one rank sent of its steps: the losses and parameter checksums by step, the last
    step sent, and whether every value was exact."""

    losses: dict[int, float] = field(default_factory=dict)
    params: dict[int, float] = field(default_factory=dict)
    reached: int = -1
    exact: bool = True

    def add(
        self,
        first: int,
        losses: tuple[float | None, ...],
        params: tuple[int, float] | None,
        exact: bool,
    ) -> None:
        """One message's values (``params``: a step and the checksum there)."""
        for i, loss in enumerate(losses):
            if loss is not None:
                self.losses[first + i] = loss
        if losses:
            self.reached = max(self.reached, first + len(losses) - 1)
        if params is not None:
            step, value = params
            self.params[step] = value
            self.reached = max(self.reached, step)
        self.exact = self.exact and exact

    def merge(self, newer: RankPrints) -> None:
        """Take a later attempt's values (they replace those of the same steps), keeping the
        newest :data:`KEPT_STEPS` steps of each kind."""
        for mine, theirs in ((self.losses, newer.losses), (self.params, newer.params)):
            mine.update(theirs)
            if len(mine) > KEPT_STEPS:
                for step in sorted(mine)[: len(mine) - KEPT_STEPS]:
                    del mine[step]
        self.reached = max(self.reached, newer.reached)
        self.exact = self.exact and newer.exact


@dataclass(frozen=True, slots=True)
class Difference:
    """The first value a resumed attempt computed otherwise: at ``step`` on ``rank``, the loss
    or the parameters' checksum (``what``), as before and as now."""

    step: int
    rank: int
    what: str  # "loss" | "parameters"
    before: float
    after: float


@dataclass(frozen=True, slots=True)
class RankComparison:
    """One rank's comparison so far: the values compared and their steps, the first difference,
    and whether every step the earlier attempts ran from the resume step on was reached."""

    values: int
    first_step: int | None
    last_step: int | None
    difference: Difference | None
    complete: bool
    exact: bool


def compare_rank(
    rank: int, before: RankPrints, after: RankPrints, resume_step: int
) -> RankComparison:
    """Compare what ``rank`` computed in the first :data:`PRINT_WINDOW` steps after resuming at
    ``resume_step`` (``after``: what it sent so far) with what the earlier attempts computed at
    the same steps (``before``). Every attempt fingerprinted those steps: the resumed one from
    its resume, the one before it from the save (or the resume) of the step before."""
    exact = before.exact and after.exact
    window = range(resume_step, resume_step + PRINT_WINDOW)
    steps: list[int] = []
    difference: Difference | None = None
    kinds = (("loss", before.losses, after.losses), ("parameters", before.params, after.params))
    for what, old, new in kinds:
        for step in sorted(s for s in new if s in window and s in old):
            steps.append(step)
            if _same(old[step], new[step], exact):
                continue
            if difference is None or step < difference.step:
                difference = Difference(step, rank, what, old[step], new[step])
            break
    overlap = [s for s in (*before.losses, *before.params) if s in window]
    complete = not overlap or after.reached >= max(overlap)
    return RankComparison(
        values=len(steps),
        first_step=min(steps, default=None),
        last_step=max(steps, default=None),
        difference=difference,
        complete=complete,
        exact=exact,
    )


def _same(old: float, new: float, exact: bool) -> bool:
    if exact:
        return old == new
    return math.isclose(old, new, rel_tol=TOLERANCE, abs_tol=TOLERANCE * 1e-3)


_AT_THE_RESUME: Final = (
    "the state loaded or the first batch: an object the step uses that resume() was not given "
    "(a scheduler, a sampler or data loader with a generator of its own), or data or weights "
    "built from an unseeded random generator"
)
_AT_THE_RESUME_FIX: Final = (
    "pass every stateful object to worker_sdk.resume(); seed torch, random and numpy before "
    "building the dataset and the model; see docs/resume-check.md"
)
_LATER: Final = (
    "state that changes between steps outside the checkpoint: random numbers drawn outside "
    "the steps (an evaluation, logging), gradients held across a save in buffers of a "
    "framework's own (FSDP1), an accumulation counter, a counter or buffer kept by the script"
)
_LATER_FIX: Final = (
    "keep evaluations from drawing on the training's random generators, call "
    "worker_sdk.step() once per optimizer step where a framework accumulates gradients or "
    "counts micro-batches itself, or pass the object holding that state to resume(); see "
    "docs/resume-check.md"
)


def suspects(difference: Difference, resume_step: int) -> tuple[str, str]:
    """What most likely made the resume differ, and what to change (docs/resume-check.md):
    at the resume step itself, what was loaded or the first batch; later, state that
    changes between steps outside the checkpoint."""
    if difference.step == resume_step:
        return _AT_THE_RESUME, _AT_THE_RESUME_FIX
    return _LATER, _LATER_FIX
