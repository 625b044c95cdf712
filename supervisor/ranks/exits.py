"""How the ranks' scripts say they end (``EXITING``), and what the attempt makes of it.

A rank leaves for a stop (its checkpoint is committed) or because its script ended. Once every
rank's script ended, the interpreters have :data:`EXIT_GRACE_S` to exit; one that does not (gloo's
destructor waiting for the GIL, an atexit hook stuck) does not make the training a failure. A rank
that dies of a signal after its script ended is recorded (``exit_aborted``), not blamed.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

from supervisor.record.schema import ExitAborted, ExitStalled
from supervisor.rules import failures
from supervisor.rules.observation import RankExit, signal_name
from worker_sdk.contract import protocol as p

__all__ = ["EXIT_GRACE_S", "ExitBook"]

EXIT_GRACE_S = 10.0  # once every rank said the script ended, how long interpreters may take to exit
_ABORT_TAIL_LINES = 10  # of a rank's stderr, in exit_aborted


@dataclass(slots=True)
class ExitBook:
    """The ranks that said they leave, and why."""

    world_size: int
    left_for_stop: set[int] = field(default_factory=set)  # exited because a stop asked them
    ended: set[int] = field(default_factory=set)  # their script ended (EXITING "exit")
    all_ended_t: float | None = None  # when the last of them said so

    def exiting(self, rank: int, reason: str | None, now: float) -> None:
        if reason == p.ExitingReason.STOP.value:
            self.left_for_stop.add(rank)
        elif reason == p.ExitingReason.END.value:
            self.ended.add(rank)
            if len(self.ended) >= self.world_size and self.all_ended_t is None:
                self.all_ended_t = now

    def stalled(self, now: float, exits: Iterable[RankExit]) -> ExitStalled | None:
        """Every script ended :data:`EXIT_GRACE_S` ago, yet some interpreter has not exited:
        the ranks still there (the caller ends the attempt as a success)."""
        t = self.all_ended_t
        if t is None or now - t < EXIT_GRACE_S:
            return None
        gone = {e.rank for e in exits if e.rank is not None}
        stuck = tuple(sorted(r for r in self.ended if r not in gone))
        return ExitStalled(ranks=stuck, waited_s=now - t)

    def aborted(
        self,
        exits: tuple[RankExit, ...],
        steps: Mapping[int, int],
        stderr_tail: Callable[[int], str],
    ) -> list[ExitAborted]:
        """``exit_aborted`` for each rank that died of a signal after its script ended."""
        found = []
        for e in failures.aborted_after_end(exits, self.ended):
            assert e.rank is not None
            signum = e.signal if e.signal is not None else -1
            step = steps.get(e.rank)
            tail = stderr_tail(e.rank).strip().splitlines()[-_ABORT_TAIL_LINES:]
            found.append(
                ExitAborted(
                    rank=e.rank,
                    signal=signal_name(signum) if signum > 0 else f"exit code {e.exit_code}",
                    last_step=step if step is not None and step >= 0 else None,
                    stderr_tail="\n".join(tail),
                )
            )
        return found
