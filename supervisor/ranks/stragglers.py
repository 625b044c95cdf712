"""Stragglers as the ranks report them: heartbeats' ``comm_wait_s`` into the pure rule.

:class:`StragglerReports` feeds every heartbeat to :class:`supervisor.rules.stragglers.StragglerWatch`,
judges the windows once a second (:data:`JUDGE_EVERY_S`; a judgement sorts a window per rank),
and turns a newly named straggler into the history's ``straggler_detected``. A judgement costs
about 5 µs per rank (72 ms at 16,384 ranks with 20 samples each, timed in-process on this
project's 2-vCPU machine; 243 ms while each sample was an object of its own): above
:data:`RANKS_PER_SECOND` ranks the windows are judged once per that many ranks' worth of
seconds instead (every 4 s at 16,384), which keeps it near 2 % of a core; a
straggler is then named after two judgements :data:`~supervisor.rules.stragglers.CONFIRM_S`
apart, about 8 s after it is first found there instead of 5 s. With
``[health] exclude_stragglers`` on, the straggler's node is also kept in :attr:`to_exclude`,
for the next restart to leave out.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from supervisor.record.schema import StragglerDetected
from supervisor.rules.stragglers import StragglerWatch

__all__ = ["JUDGE_EVERY_S", "RANKS_PER_SECOND", "StragglerReports", "judge_every_s"]

JUDGE_EVERY_S: Final = 1.0
RANKS_PER_SECOND: Final = 4096


def judge_every_s(world_size: int) -> float:
    """How often the windows of ``world_size`` ranks are judged (the module docstring)."""
    return max(JUDGE_EVERY_S, world_size / RANKS_PER_SECOND)


class StragglerReports:
    """One attempt's stragglers; ``exclude``: ``[health] exclude_stragglers``."""

    def __init__(self, *, exclude: bool, watch: StragglerWatch | None = None) -> None:
        self.exclude = exclude
        self.watch = watch or StragglerWatch()
        self._next_t = 0.0
        self.to_exclude: dict[str, str] = {}
        """Node -> why: the nodes of stragglers named while ``exclude`` is on."""
        self.node: str | None = None
        """The node of the straggler named now."""

    def heard(self, rank: int, step: int, comm_wait_s: float | None, now: float) -> None:
        """A heartbeat of ``rank``: its step, and its wait when it carries one."""
        self.watch.observe(rank, now, step, comm_wait_s)

    def due(self, now: float) -> bool:
        """Whether :meth:`judge` is due (once per :func:`judge_every_s` of the ranks heard)."""
        return now >= self._next_t

    def judge(self, now: float, nodes: Mapping[int, str]) -> StragglerDetected | None:
        """At most once per :func:`judge_every_s` of the ranks heard: the event of a
        straggler newly named; ``nodes``: rank -> host."""
        if not self.due(now):
            return None
        self._next_t = now + judge_every_s(self.watch.ranks_heard)
        named = self.watch.judge(now)
        if self.watch.current is None:
            self.node = None
        if named is None:
            return None
        s = named.straggler
        self.node = nodes.get(s.rank)
        if self.exclude and self.node is not None:
            self.to_exclude[self.node] = (
                f"rank {s.rank} was a straggler: {s.slower:.1f}x slower, the others waited "
                f"{s.lost_per_step_s * 1000:.0f} ms per {s.step_s * 1000:.0f} ms step"
            )
        return StragglerDetected(
            rank=s.rank,
            node=self.node,
            slower=s.slower,
            lost_s=s.lost_s,
            lost_per_step_s=s.lost_per_step_s,
            step_s=s.step_s,
            window_s=named.window_s,
            samples=named.samples,
            exclude_node=self.exclude and self.node is not None,
        )

    def status(self, now: float) -> dict[str, Any] | None:
        """The straggler named now, for ``rvsup status``; None when there is none."""
        s, since = self.watch.current, self.watch.since
        if s is None or since is None:
            return None
        return {
            "rank": s.rank,
            "node": self.node,
            "slower": round(s.slower, 2),
            "lost_s": round(s.lost_s, 3),
            "lost_per_step_s": round(s.lost_per_step_s, 4),
            "step_s": round(s.step_s, 4),
            "since_s": round(now - since, 1),
            "exclude_node": self.exclude and self.node is not None,
        }
