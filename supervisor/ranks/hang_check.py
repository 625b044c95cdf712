"""One attempt's hang check, run at every tick: a silence (:mod:`.silence`) judged stuck or busy
(:mod:`.slow`), with the early native stacks it asks the process tree for and the slow phases it
logs. It says when a silence is a hang, and collects and judges the stacks once one is.
"""

from __future__ import annotations

from pathlib import Path

from supervisor.config.model import HeartbeatSection
from supervisor.process import native
from supervisor.process.diagnostics import read_flights, read_stacks, read_stopped
from supervisor.process.tree import ProcessTree
from supervisor.ranks import slow
from supervisor.ranks.channel import RankTable
from supervisor.ranks.silence import Hung, SilenceWatch
from supervisor.ranks.slow import SlowWatch
from supervisor.record.events import EventLog
from supervisor.rules import culprits

__all__ = ["HangCheck"]


class HangCheck:
    """The hang check of one attempt started at ``t0`` (see the module docstring)."""

    def __init__(
        self,
        hb: HeartbeatSection,
        ranks: RankTable,
        tree: ProcessTree,
        events: EventLog,
        *,
        world_size: int,
        diag_dir: Path,
        t0: float,
    ) -> None:
        self.hb = hb
        self.tree = tree
        self.events = events
        self.diag_dir = diag_dir
        self.world_size = world_size
        self.silence = SilenceWatch(
            hb,
            ranks,
            world_size=world_size,
            t0=t0,
            # early native stacks; the hang rule's evidence window
            lead_s=max(native.LEAD_S if hb.native_stacks else 0.0, slow.LEAD_S),
        )
        self.slow = SlowWatch(
            diag_dir, cap_s=hb.hang_timeout_max_s, idle_cap_s=hb.hang_timeout_idle_s
        )

    def check(self, now: float) -> Hung | None:
        """The silence found, when it is to be declared a hang now; else None (no silence, not
        yet, or busy ranks: a slow phase, logged when it ends)."""
        found = self.silence.check(now, finishing=self.tree.any_left_cleanly())
        if found is None:
            self.tree.hang_averted()
            self.close_phase(now, finished=True)
            return None
        phase = self.slow.phase
        if self.hb.native_stacks and self.slow.native_due(now, native.LEAD_S):
            self.tree.foresee_hang(self.diag_dir)  # the native stacks, while the hang is confirmed
        stuck = self.slow.review(
            now,
            hung=bool(found.ranks),
            silent_s=max(s.silent_s for s in found.silences),
            review_s=self.silence.timeout_s or self.hb.startup_timeout_s,
            pids=self.tree.rank_pids(),
        )
        if stuck is None:
            if self.slow.phase is not None and phase is None:
                self.tree.hang_averted()  # busy: native stacks taken early are stale
            return None
        return found

    def close_phase(self, now: float, *, finished: bool) -> None:
        """Log the slow phase in progress, if any (``finished``: steps resumed)."""
        event = self.slow.close(now, finished=finished)
        if event is not None:
            self.events.log(event)

    async def diagnose(self) -> tuple[str | None, culprits.Verdict | None]:
        """A hang was declared: the ranks' stacks collected (their directory; None if none were)
        and who hung the group, judged from them."""
        diagnostics = await self.tree.collect_stacks(
            self.diag_dir, native_stacks=self.hb.native_stacks
        )
        verdict = culprits.judge(
            read_stacks(self.diag_dir, self.world_size),
            read_stopped(self.diag_dir, self.world_size),
            read_flights(self.diag_dir, self.world_size),
        )
        return diagnostics, verdict
