"""Which nodes the next attempt may use: health rounds and the exclusion of bad nodes.

:class:`Exclusion` acts for :class:`supervisor.supervisor.Supervisor` before the first attempt
(``when="start"``) and after each failure (``"failure"``): it runs a health round on the nodes
the job may still use (:mod:`supervisor.process.health`), logs ``health_checked`` per node,
decides which nodes to exclude (:func:`supervisor.rules.health.to_exclude`: an unhealthy node,
a node with ``exclude_after`` failures attributed to it; a straggler's node the attempt asked
to leave out, with ``[health] exclude_stragglers``), logs ``node_excluded`` for each, and
tells the launcher to leave them out (a spare node takes their place). When too few nodes are
left for ``launch.min_nnodes``, the answer is to requeue the Slurm job away from every
excluded node, or to give up where it cannot be requeued. Excluded nodes come back from the
history (the budget's fold) at every start: they are left out from the first attempt on.

Outside a Slurm allocation there is nowhere else to run: the checks are run and logged, and
nothing is excluded (the restart budget decides, as before).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from supervisor.config.model import JobConfig
from supervisor.record.events import EventLog
from supervisor.record.schema import HealthChecked, NodeExcluded
from supervisor.rules.budget import Budget
from supervisor.rules.health import Verdict, node_faults, to_exclude

__all__ = ["Exclusion", "HealthSource", "NodeSource", "RequeueAway"]


class HealthSource(Protocol):
    """Health rounds (:class:`supervisor.process.health.HealthChecks`)."""

    def this_node(self) -> str: ...
    async def check(self, nodes: tuple[str, ...], newest: Path | None) -> list[Verdict]: ...


class NodeSource(Protocol):
    """The launcher's view of the allocation (:class:`supervisor.process.plan.Launches`)."""

    def usable_nodes(self) -> tuple[str, ...] | None: ...
    def lose(self, nodes: Iterable[str]) -> tuple[int, int] | None: ...


@dataclass(frozen=True, slots=True)
class RequeueAway:
    """Too few nodes are left here: requeue the job with ``nodes`` in its ExcNodeList."""

    nodes: tuple[str, ...]
    note: str


class Exclusion:
    """Health rounds and exclusion for one ``rvsup start`` (see the module docstring)."""

    def __init__(
        self,
        cfg: JobConfig,
        *,
        events: EventLog,
        nodes: NodeSource,
        health: HealthSource | None,
        budget: Callable[[], Budget],
    ) -> None:
        self.cfg = cfg
        self.events = events
        self.nodes = nodes
        self.health = health
        self._budget = budget

    async def round(
        self, when: str, newest: Path | None, requested: Mapping[str, str] | None = None
    ) -> RequeueAway | None:
        """Check, exclude, and say whether the job can go on here (None: it can).
        ``requested``: nodes to exclude and why (stragglers' nodes), on top of the rules'."""
        in_allocation = self.nodes.usable_nodes() is not None
        left = self.nodes.lose(self._budget().excluded)  # the history's exclusions first
        if left is not None and left[0] < left[1]:
            return self._too_few(left)
        unhealthy = await self._checked(when, newest)
        if not in_allocation:
            return None
        budget = self._budget()
        exclude_after = self.cfg.health.exclude_after
        failures = budget.node_failures
        for node, reason, count in to_exclude(unhealthy, failures, budget.excluded, exclude_after):
            self.events.log(NodeExcluded(node=node, reason=reason, failures=count))
        for node, reason in (requested or {}).items():
            if node not in self._budget().excluded:
                count = failures.get(node, 0)
                self.events.log(NodeExcluded(node=node, reason=reason, failures=count))
        left = self.nodes.lose(self._budget().excluded)
        if left is not None and left[0] < left[1]:
            return self._too_few(left)
        return None

    async def _checked(self, when: str, newest: Path | None) -> dict[str, str]:
        """A health round's nodes at fault and why ({} when checks are off)."""
        if self.health is None or not self.cfg.health.enabled:
            return {}
        nodes = self.nodes.usable_nodes() or (self.health.this_node(),)
        verdicts = await self.health.check(nodes, newest)
        for verdict in verdicts:
            self.events.log(
                HealthChecked(
                    node=verdict.node,
                    healthy=verdict.healthy,
                    when=when,
                    failed=verdict.failed,
                    skipped=verdict.skipped,
                    seconds=verdict.seconds,
                )
            )
        return node_faults(verdicts)

    def _too_few(self, left: tuple[int, int]) -> RequeueAway:
        count, minimum = left
        excluded = tuple(self._budget().excluded)
        noun = "node" if minimum == 1 else "nodes"
        note = (
            f"{count} usable {'node' if count == 1 else 'nodes'} left in this allocation, the "
            f"job runs on at least {minimum} {noun}; requeued away from {', '.join(excluded)}"
        )
        return RequeueAway(excluded, note)
