"""How an attempt ended: the values an :class:`~supervisor.attempt.Attempt` hands back,
:func:`result_of`, which builds them from what it gathered, and :func:`failure_event`, the
history's line for a failure once classified."""

from __future__ import annotations

import datetime
import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from supervisor.record.schema import FailureDetected
from supervisor.rules import culprits, hangs
from supervisor.rules.observation import (
    Anomaly,
    Divergence,
    Failure,
    Observation,
    RankReport,
    StopReason,
)

if TYPE_CHECKING:
    from supervisor.process.tree import ProcessTree
    from supervisor.ranks.silence import Hung

__all__ = [
    "AttemptResult",
    "Ending",
    "Evidence",
    "Outcome",
    "failure_event",
    "iso_utc",
    "result_of",
]


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
    diverged: Divergence | None = None  # a resume not exact, under resume_check = "fail"
    first_sign_t: float | None = None  # monotonic: when the failure was first seen
    noticed_at: float | None = None  # wall clock of the same moment
    silent: tuple[int, ...] = ()  # the ranks a hang is blamed on
    hang_silence_s: float | None = None
    verdict: culprits.Verdict | None = None  # who hung the group, from the stacks
    steps_final: bool = False  # the last steps were fixed when a hang was caught

    def hung(self, found: Hung, last_steps: Mapping[int, int], now: float, wall: float) -> None:
        """A hang was caught at ``now``: the ranks it is blamed on and their silence."""
        hung = found.ranks or tuple(s.rank for s in found.silences)
        self.silent, self.hang_silence_s = hangs.quiet_ranks(found.silences, hung, last_steps)
        self.noticed(now, wall)

    def noticed(self, now: float, wall: float, *, first: bool = False) -> None:
        """The failure is seen at ``now`` (``first``: unless an earlier sign was)."""
        if first and self.first_sign_t is not None:
            return
        self.first_sign_t = now
        self.noticed_at = wall


def result_of(
    ending: Ending,
    ev: Evidence,
    tree: ProcessTree,
    *,
    last_steps: dict[int, int],
    rank_nodes: dict[int, str],
    hang_timeout_s: float | None,
    stop_reason: StopReason | None,
    slow_note: str,
    stop_step: int | None,
    progressed: bool,
    diagnostics: str | None,
    lost: Mapping[str, str],
    node_oom_kills: Mapping[str, tuple[int, str]],
) -> AttemptResult:
    """The result of an attempt that ended so, from its evidence and its process tree's record
    (``last_steps``: each rank's last finished step; ``rank_nodes``: the ranks' hosts)."""
    verdict = ev.verdict or culprits.Verdict((), (), "")
    oom_kills, oom_kills_host_wide = tree.oom_kills()
    obs = Observation(
        exits=tree.exits,
        reports=tuple(ev.reports),
        launcher_exit=tree.launcher_rc,
        silent_ranks=ev.silent,
        hang_timeout_s=hang_timeout_s,
        last_steps=last_steps,
        stop_reason=stop_reason,
        stderr_tail=tree.stderr_tail() if ending is not Ending.SUCCEEDED else "",
        oom_kills=oom_kills,
        oom_kills_host_wide=oom_kills_host_wide,
        node_oom_kills=node_oom_kills,
        lost_nodes=dict(lost),
        hang_culprits=verdict.culprits,
        hang_evidence="; ".join(filter(None, [slow_note, verdict.detail])),
        rank_nodes=rank_nodes,
        anomaly=ev.anomaly,
        resume_diverged=ev.diverged,
    )
    return AttemptResult(
        outcome=ending.outcome,
        observation=obs,
        detect_s=ev.hang_silence_s if ending is Ending.HANG else None,
        diagnostics=diagnostics,
        progressed=progressed,
        last_step=max(last_steps.values()) if last_steps else None,
        stop_step=stop_step,
        noticed_at=ev.noticed_at,
    )


def failure_event(failure: Failure, result: AttemptResult) -> FailureDetected:
    """The ``failure_detected`` line of an attempt's failure, as classified."""
    return FailureDetected(
        kind=str(failure.kind),
        ranks=failure.ranks,
        exit_codes=failure.exit_codes,
        signals=failure.signals,
        last_step=failure.last_step,
        detail=failure.detail,
        diagnostics=result.diagnostics,
        detect_s=result.detect_s,
        hang_timeout_s=result.observation.hang_timeout_s,
        noticed_at=iso_utc(result.noticed_at),
        nodes=failure.nodes,
        node_ranks=failure.node_ranks,
    )


def iso_utc(wall: float | None) -> str | None:
    """Seconds since the epoch as the history's ISO-8601 UTC text (``...Z``)."""
    if wall is None:
        return None
    moment = datetime.datetime.fromtimestamp(wall, datetime.timezone.utc)
    return moment.isoformat().replace("+00:00", "Z")
