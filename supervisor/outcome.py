"""How an attempt ended: the values an :class:`~supervisor.attempt.Attempt` hands back."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from supervisor.rules.observation import Observation

__all__ = ["AttemptResult", "Ending", "Outcome"]


class Outcome(enum.Enum):
    """How an attempt ended, as the supervisor acts on it."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"


class Ending(enum.Enum):
    """Why the observation ended (a hang is a failure found by silence, not by an exit)."""

    SUCCEEDED = "succeeded"
    FAILED = "failed"
    HANG = "hang"
    STOPPED = "stopped"

    @property
    def outcome(self) -> Outcome:
        """What the supervisor acts on: a hang is a failure."""
        return {Ending.SUCCEEDED: Outcome.SUCCEEDED, Ending.STOPPED: Outcome.STOPPED}.get(
            self, Outcome.FAILED
        )


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """What an attempt saw, handed to ``rules.policy.decide`` through its observation."""

    outcome: Outcome
    observation: Observation
    detect_s: float | None  # hangs: how long the most silent rank had been silent when caught
    diagnostics: str | None
    progressed: bool
    last_step: int | None
    stop_step: int | None  # the checkpoint committed by a stop, if any
    noticed_at: float | None  # wall-clock time of the first sign of the failure (for the history)
