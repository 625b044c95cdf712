"""Before a silence is declared a hang: is the group stuck, or is a rank busy? (the noisy edge)

:class:`SlowWatch` gathers, over a window that opens about a second before the ranks' timeout
runs out, the evidence :func:`supervisor.rules.stuck.judge_silence` judges: each local rank's
process state, CPU time and wait channel (:mod:`supervisor.process.activity`) at both ends of the
window, and its Python stacks (faulthandler's dump on ``protocol.DUMP_SIGNAL``, asked for at the
window's start, only of ranks that handle that signal, and not into a stacks file grown past
16 MB, which a job that keeps coming close to its timeout would otherwise fill). A stuck group
is declared hung at its timeout, as before. A busy one opens a *slow phase*: its silence is
judged again every timeout and is declared a hang once it has lasted ``hang_timeout_max``, or
once its ranks have used no CPU, waiting on their own (:attr:`Busy.working` false at every
review), for ``hang_timeout_idle``; when the ranks finish a step again, the phase is over and
recorded (``slow_phase``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from supervisor.process import evidence_window
from supervisor.process.evidence_window import Window
from supervisor.record.schema import SlowPhase
from supervisor.rules.stuck import Busy, RankEvidence, Stuck, judge_silence

__all__ = ["LEAD_S", "MIN_WINDOW_S", "Phase", "RemoteLook", "SlowWatch"]

LEAD_S = 1.0  # the window opens this long before the timeout runs out
MIN_WINDOW_S = 0.5  # a window opened late (the first tick found the ranks hung) lasts this long
HINT = 'wrap it in `with worker_sdk.phase("...")`: declared phases get startup_timeout'


class RemoteLook(Protocol):
    """The same look at the ranks of the other nodes, taken by their node agents."""

    def open(self, now: float) -> None:
        """Ask every agent to look at its ranks now."""

    def ready(self, now: float) -> bool:
        """Whether every agent asked has answered (or is given up on)."""

    def evidence(self) -> list[RankEvidence]:
        """The answers' evidence (a rank whose agent did not answer is left out: unknown)."""


@dataclass
class Phase:
    """A silence judged busy, until the ranks finish a step again or it lasts too long."""

    start_t: float  # when the silence began (the ranks' last progress)
    ranks: tuple[int, ...]
    where: str
    detail: str
    review_t: float  # when it is judged again
    cap_t: float  # when it is a hang whatever it looks like
    idle_t: float | None = None  # since when no rank was seen working (None: one works)
    idle_cap_s: float = float("inf")

    @property
    def hang_t(self) -> float:
        """When it is a hang: at its cap, or ``hang_timeout_idle`` into an idle wait."""
        return self.cap_t if self.idle_t is None else min(self.cap_t, self.idle_t + self.idle_cap_s)


class SlowWatch:
    """One attempt's judge of silences (see the module docstring); ``diag_dir`` is where the
    ranks write their stacks, ``cap_s`` is ``hang_timeout_max``, ``idle_cap_s``
    ``hang_timeout_idle``."""

    def __init__(
        self,
        diag_dir: Path,
        *,
        cap_s: float,
        idle_cap_s: float | None = None,
        remote: RemoteLook | None = None,
    ) -> None:
        self._diag_dir = diag_dir
        self._cap_s = cap_s
        self._idle_cap_s = cap_s if idle_cap_s is None else min(idle_cap_s, cap_s)
        self._remote = remote
        self._window: Window | None = None
        self.phase: Phase | None = None
        self.note = ""  # a hang that was a busy phase until cap_s: says so (the failure's detail)

    def review(
        self,
        now: float,
        *,
        hung: bool,
        silent_s: float,
        review_s: float,
        pids: Mapping[int, int],
    ) -> Stuck | None:
        """Called on every tick where some rank is near or past its limit (``hung``): a
        :class:`Stuck` when the silence is to be declared a hang now, else None (not yet, or the
        group is busy). ``silent_s`` is the longest silence, ``pids`` the local ranks."""
        phase = self.phase
        if phase is not None:
            if now >= phase.hang_t:
                if now >= phase.cap_t:
                    lasted = f"{self._cap_s:g}s"
                    self.note = (
                        f"{_who(phase.ranks)} ran for hang_timeout_max ({lasted}) without a"
                        f" finished step ({phase.where})"
                    )
                else:
                    self.note = (
                        f"{_who(phase.ranks)} waited on {'its' if len(phase.ranks) == 1 else 'their'}"
                        f" own, using no CPU, for hang_timeout_idle ({self._idle_cap_s:g}s)"
                        f" without a finished step ({phase.where})"
                    )
                return Stuck(phase.ranks, self.note)
            if now < phase.review_t - LEAD_S:
                return None
            hung = now >= phase.review_t
        if self._window is None:
            self._window = evidence_window.open_window(self._diag_dir, pids, now)
            if self._remote is not None:
                self._remote.open(now)
            return None
        if not hung or now - self._window.t0 < MIN_WINDOW_S:
            return None
        if self._remote is not None and not self._remote.ready(now):
            return None
        seen = evidence_window.evidence(self._diag_dir, self._window, now)
        if self._remote is not None:
            seen += self._remote.evidence()
        verdict = judge_silence(seen)
        self._window = None
        if isinstance(verdict, Stuck):
            return verdict
        self._extend(verdict, now, silent_s=silent_s, review_s=review_s)
        return None

    def status(self, now: float) -> dict[str, Any] | None:
        """The slow phase in progress, for ``rvsup status`` (None: none is)."""
        phase = self.phase
        if phase is None:
            return None
        return {
            "ranks": list(phase.ranks),
            "where": phase.where,
            "detail": phase.detail,
            "silent_s": round(now - phase.start_t, 1),
            "hang_at_s": round(phase.hang_t - phase.start_t, 1),
            "bound": "hang_timeout_max" if phase.idle_t is None else "hang_timeout_idle",
        }

    def native_due(self, now: float, lead_s: float) -> bool:
        """Whether native stacks are worth taking ahead of a declaration now: not inside a busy
        phase, except within ``lead_s`` of its cap."""
        return self.phase is None or now >= self.phase.cap_t - lead_s

    def close(self, now: float, *, finished: bool) -> SlowPhase | None:
        """The silence ended (``finished``: the ranks finished a step again; else the attempt
        ends inside it): the phase's event, if one was open."""
        self._window = None
        phase, self.phase = self.phase, None
        if phase is None:
            return None
        return SlowPhase(
            ranks=phase.ranks,
            where=phase.where,
            seconds=now - phase.start_t,
            finished=finished,
            detail=phase.detail,
            hint=HINT,
        )

    def _extend(self, verdict: Busy, now: float, *, silent_s: float, review_s: float) -> None:
        phase = self.phase
        if phase is None:
            start = now - silent_s
            self.phase = Phase(
                start_t=start,
                ranks=verdict.ranks,
                where=verdict.where,
                detail=verdict.detail,
                review_t=now + review_s,
                cap_t=start + self._cap_s,
                idle_t=None if verdict.working else start,  # idle since the silence began
                idle_cap_s=self._idle_cap_s,
            )
            return
        phase.review_t = now + review_s
        if verdict.working:
            phase.idle_t = None
        elif phase.idle_t is None:
            phase.idle_t = now  # it worked at the last review: idle since then at most


def _who(ranks: tuple[int, ...]) -> str:
    if not ranks:
        return "the ranks"
    return ("rank " if len(ranks) == 1 else "ranks ") + ", ".join(str(r) for r in ranks)
