"""How an attempt ended: the values an :class:`~supervisor.attempt.Attempt` hands back."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from supervisor.rules import culprits
from supervisor.rules.observation import Anomaly, Observation, RankReport

__all__ = ["AttemptResult", "Ending", "Evidence", "Outcome"]


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


@dataclass(slots=True)
class Evidence:
    """What an attempt gathers toward its ending, before the rules classify it."""

    reports: list[RankReport] = field(default_factory=list)  # the ranks' own FAILURE messages
    anomaly: Anomaly | None = None  # the training went wrong (a rollback follows)
    first_sign_t: float | None = None  # monotonic: when the failure was first seen
    noticed_at: float | None = None  # wall clock of the same moment
    silent: tuple[int, ...] = ()  # the ranks a hang is blamed on
    hang_silence_s: float | None = None
    verdict: culprits.Verdict | None = None  # who hung the group, from the stacks
    steps_final: bool = False  # the last steps were fixed when a hang was caught

    def noticed(self, now: float, wall: float, *, first: bool = False) -> None:
        """The failure is seen at ``now`` (``first``: unless an earlier sign was)."""
        if first and self.first_sign_t is not None:
            return
        self.first_sign_t = now
        self.noticed_at = wall
