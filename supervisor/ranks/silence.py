"""The ranks' silence, judged every tick: the hang timeout in force, who is hung, who nearly is.

:class:`SilenceWatch` applies the rule of :mod:`supervisor.rules.hangs` to the
:class:`~supervisor.ranks.channel.RankTable`: the automatic timeout from the step times, a cheap
pre-check that skips the per-rank work while nobody has been quiet for long (thousands of ranks,
ten times a second: it keeps the oldest last progress it found, a bound that holds until it is
itself too old or a rank is added, and only then looks at every rank again), and, where a
hang's native stacks are wanted, the ranks close enough to their limit for those stacks to be
taken ahead of the declaration (``lead_s``).
"""

from __future__ import annotations

from dataclasses import dataclass

from supervisor.config.model import HeartbeatSection
from supervisor.ranks.rank_table import RankTable
from supervisor.rules import hangs
from supervisor.rules.hangs import Silence

__all__ = ["Hung", "SilenceWatch"]


@dataclass(frozen=True, slots=True)
class Hung:
    """What a tick found: the hung ranks (none: only ``near``) and every rank's silence."""

    ranks: tuple[int, ...]
    silences: tuple[Silence, ...]
    near: bool  # some rank is within lead_s of its limit (always true when ``ranks``)


class SilenceWatch:
    """One attempt's hang check (see the module docstring); ``t0`` is its start."""

    def __init__(
        self,
        hb: HeartbeatSection,
        ranks: RankTable,
        *,
        world_size: int,
        t0: float,
        lead_s: float = 0.0,
    ) -> None:
        self._hb = hb
        self._ranks = ranks
        self._world_size = world_size
        self._t0 = t0
        self.lead_s = lead_s
        self.timeout_s: float | None = hb.hang_timeout_s
        """The hang timeout in force (None: the automatic one has seen no step yet)."""
        # no rank's last progress is older than this: a rank's only grows, a new rank's is now
        self._oldest = float("-inf")
        self._counted = 0  # ranks in the table when _oldest was found

    def restart_clock(self, t0: float) -> None:
        """The attempt started (again) at ``t0``: ranks not heard from are silent since then."""
        self._t0 = t0
        self._oldest = float("-inf")

    def check(self, now: float, *, finishing: bool) -> Hung | None:
        """None while nobody is within ``lead_s`` of a hang; ``finishing``: a rank already left
        cleanly, so the others get the longer allowance (they are ending, not hung)."""
        hb = self._hb
        if hb.hang_timeout_s is None:
            self.timeout_s = hangs.auto_timeout(
                self._ranks.step_times.percentile(hangs.PERCENTILE),
                interval_s=hb.interval_s,
                ceiling_s=hb.hang_timeout_max_s,
            )
        # the pre-check: nobody has been quiet for even the shortest allowance any rank can
        # get, less the lead
        shortest = min(self.timeout_s or hb.startup_timeout_s, hb.startup_timeout_s) - self.lead_s
        quiet_since = now - shortest
        complete = len(self._ranks.ranks) >= self._world_size
        if complete or now - self._t0 <= shortest:
            if self._oldest < quiet_since or self._counted != len(self._ranks.ranks):
                self._oldest = min((st.last_progress_t for st in self._ranks), default=now)
                self._counted = len(self._ranks.ranks)
            if self._oldest >= quiet_since:
                return None
        silences = self._ranks.silences(
            now, since=self._t0, world_size=self._world_size, finishing=finishing
        )
        timeout, startup = self.timeout_s, hb.startup_timeout_s
        hung = hangs.hung_ranks(silences, timeout_s=timeout, startup_timeout_s=startup)
        near = bool(hung) or bool(
            self.lead_s
            and hangs.hung_ranks(
                silences, timeout_s=timeout, startup_timeout_s=startup, margin_s=self.lead_s
            )
        )
        return Hung(hung, tuple(silences), near) if near else None
