"""The resume check's events: one per resume, its verdict (docs/resume-check.md)."""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.record.schema.base import Event

__all__ = ["ResumeDiverged", "ResumeUnverified", "ResumeVerified"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeVerified(Event):
    """The resumed attempt computed what the attempts before it computed at the same steps:
    the losses and parameter checksums of the steps it redid, rank by rank, are equal (bit for
    bit where ``exact``)."""

    NAME = "resume_verified"
    LEVEL = "info"
    resume_step: int
    """The step the attempt resumed at."""
    first_step: int
    """The first step compared."""
    last_step: int
    """The last step compared."""
    values: int
    """Values compared, over every rank (losses and parameter checksums)."""
    ranks: int
    """Ranks compared."""
    exact: bool
    """Compared bit for bit; false: within a relative 1e-3 (CUDA without deterministic
    algorithms does not repeat itself bit for bit)."""
    complete: bool
    """Every step the earlier attempts ran in the window after the resume was compared; false:
    the attempt ended before it got there."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeDiverged(Event):
    """The resumed attempt computed something else than the attempt it replaces at the same
    step: the resume was not exact. ``checkpoint.resume_check = "fail"`` stops the job."""

    NAME = "resume_diverged"
    LEVEL = "warning"
    resume_step: int
    """The step the attempt resumed at."""
    step: int
    """The first step whose value differs."""
    rank: int
    """The rank (the lowest, of those differing at that step)."""
    what: str
    """``loss`` or ``parameters`` (a sampled checksum of the registered modules)."""
    before: float
    """The value the earlier attempt computed."""
    after: float
    """The value the resumed attempt computed."""
    exact: bool
    """Compared bit for bit (else within a relative 1e-3)."""
    likely: str
    """What most likely differs, from where the difference first shows."""
    hint: str
    """What to change."""
    policy: str
    """``checkpoint.resume_check``: ``warn`` (the job goes on) or ``fail`` (it stops)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ResumeUnverified(Event):
    """A resume that could not be checked, and why (nothing redone, another world size, a
    rollback, no fingerprint, the earlier attempts under another ``rvsup start``)."""

    NAME = "resume_unverified"
    LEVEL = "info"
    resume_step: int
    """The step the attempt resumed at."""
    reason: str
    """Why it was not compared."""
