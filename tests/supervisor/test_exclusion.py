"""Exclusion (supervisor/exclusion.py) with a fake allocation and fake health rounds: what is
checked, logged and excluded, and when the job must be requeued away or give up."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import pytest

from supervisor.exclusion import Exclusion, RequeueAway
from supervisor.record.events import EventLog
from supervisor.record.history_file import read
from supervisor.record.schema import Event, FailureDetected, HealthChecked, NodeExcluded
from supervisor.rules import budget as budgets
from supervisor.rules.budget import Budget
from supervisor.rules.health import Verdict
from tests.helpers.core_fakes import job_config


class FakeNodes:
    """An allocation of ``nodes`` of which the job needs ``needed``, at least ``minimum``."""

    def __init__(self, nodes: tuple[str, ...] | None, needed: int = 2, minimum: int = 2) -> None:
        self.nodes, self.needed, self.minimum = nodes, needed, minimum
        self.lost: set[str] = set()

    def usable_nodes(self) -> tuple[str, ...] | None:
        if self.nodes is None:
            return None
        return tuple(n for n in self.nodes if n not in self.lost)

    def lose(self, nodes: Iterable[str]) -> tuple[int, int] | None:
        if self.nodes is None:
            return None
        self.lost.update(nodes)
        usable = self.usable_nodes() or ()
        return min(len(usable), self.needed), self.minimum


class FakeHealth:
    """Rounds in which the nodes of ``bad`` fail their command."""

    def __init__(self, bad: Iterable[str] = ()) -> None:
        self.bad = set(bad)
        self.asked: list[tuple[str, ...]] = []

    def this_node(self) -> str:
        return "solo"

    async def check(self, nodes: tuple[str, ...], newest: Path | None) -> list[Verdict]:
        self.asked.append(nodes)
        return [
            Verdict(n, {"command": "exited with status 1"} if n in self.bad else {}, {})
            for n in nodes
        ]


def _crash_on(node: str) -> FailureDetected:
    return FailureDetected(
        kind="crash",
        ranks=(2,),
        exit_codes=(1,),
        signals=(),
        last_step=3,
        detail="rank 2 exited with code 1",
        diagnostics=None,
        detect_s=None,
        hang_timeout_s=None,
        noticed_at=None,
        nodes=(node,),
    )


class Setup:
    def __init__(self, tmp: Path, nodes: FakeNodes, health: FakeHealth, extra: str = "") -> None:
        self.cfg = job_config(tmp, extra)
        self.budget = Budget()
        self.events = EventLog(self.cfg.job.run_dir, "core", on_log=self._fold)
        self.nodes = nodes
        self.exclusion = Exclusion(
            self.cfg, events=self.events, nodes=nodes, health=health, budget=lambda: self.budget
        )

    def _fold(self, event: Event) -> None:
        self.budget = budgets.fold(self.budget, event)

    def round(
        self, when: str = "failure", requested: dict[str, str] | None = None
    ) -> RequeueAway | None:
        return asyncio.run(self.exclusion.round(when, None, requested))

    def logged(self, kind: type[Event]) -> list[Event]:
        self.events.close()
        return [e for e in read(self.events.path).events if isinstance(e, kind)]


Make = Callable[..., Setup]


@pytest.fixture
def make(tmp_path: Path) -> Iterator[Make]:
    """Builds Setups in folders of tmp_path; closes their event logs at the end."""
    made: list[Setup] = []

    def build(nodes: FakeNodes, health: FakeHealth, extra: str = "") -> Setup:
        folder = tmp_path / str(len(made))
        folder.mkdir()
        made.append(Setup(folder, nodes, health, extra))
        return made[-1]

    yield build
    for setup in made:
        setup.events.close()


def test_an_unhealthy_node_is_excluded_and_a_spare_takes_its_place(make: Make) -> None:
    """n1 fails its command: health_checked for every node, node_excluded for n1, and the job
    goes on with n2 and the spare n3; the next round checks only those."""
    health = FakeHealth(bad={"n1"})
    setup = make(FakeNodes(("n1", "n2", "n3")), health)
    assert setup.round("start") is None
    assert setup.nodes.usable_nodes() == ("n2", "n3")
    assert setup.round() is None
    assert health.asked == [("n1", "n2", "n3"), ("n2", "n3")]
    checked = setup.logged(HealthChecked)
    assert [(e.node, e.healthy, e.when) for e in checked] == [  # type: ignore[attr-defined]
        ("n1", False, "start"),
        ("n2", True, "start"),
        ("n3", True, "start"),
        ("n2", True, "failure"),
        ("n3", True, "failure"),
    ]
    (excluded,) = setup.logged(NodeExcluded)
    assert excluded == NodeExcluded(
        node="n1", reason="failed its health check: command: exited with status 1", failures=0
    )


def test_exclude_after_failures_then_too_few_nodes_requeues_away(make: Make) -> None:
    """One crash on n2 excludes nothing; the second does (exclude_after = 2), the spare
    steps in; then n3 fails its check and only n1 is left: requeue away from n2 and n3."""
    health = FakeHealth()
    setup = make(FakeNodes(("n1", "n2", "n3")), health)
    setup.events.log(_crash_on("n2"))
    assert setup.round() is None
    assert setup.budget.excluded == {}
    setup.events.log(_crash_on("n2"))
    assert setup.round() is None
    assert setup.budget.excluded == {"n2": "2 failures attributed to it"}
    health.bad = {"n3"}
    answer = setup.round()
    assert isinstance(answer, RequeueAway)
    assert answer.nodes == ("n2", "n3")
    assert "1 usable node left in this allocation" in answer.note


def test_the_history_s_exclusions_apply_before_any_check(make: Make) -> None:
    """A node excluded in an earlier allocation is left out of this one at once: never checked,
    and a job that cannot run without it is requeued away before any round."""
    health = FakeHealth()
    setup = make(FakeNodes(("n1", "n2", "n3")), health)
    setup.events.log(NodeExcluded(node="n3", reason="failed its health check", failures=0))
    assert setup.round("start") is None
    assert health.asked == [("n1", "n2")]
    small = make(FakeNodes(("n1", "n2")), FakeHealth())
    small.events.log(NodeExcluded(node="n2", reason="2 failures attributed to it", failures=2))
    answer = small.round("start")
    assert isinstance(answer, RequeueAway) and answer.nodes == ("n2",)


def test_exclusion_off_checks_but_excludes_nothing(make: Make) -> None:
    """health.exclude_after = 0: the failed check is logged, nothing is excluded."""
    setup = make(
        FakeNodes(("n1", "n2", "n3")),
        FakeHealth(bad={"n1", "n2"}),
        "[health]\nexclude_after = 0\n",
    )
    setup.events.log(_crash_on("n2"))
    setup.events.log(_crash_on("n2"))
    assert setup.round() is None
    assert setup.nodes.usable_nodes() == ("n1", "n2", "n3")
    assert setup.logged(NodeExcluded) == []


def test_outside_an_allocation_checks_are_logged_and_nothing_is_excluded(make: Make) -> None:
    """Without Slurm there is no other machine: failures attributed to it and a failed check
    are logged, nothing is excluded, and the job goes on (the restart budget decides)."""
    setup = make(FakeNodes(None), FakeHealth(bad={"solo"}))
    for _ in range(3):
        setup.events.log(_crash_on("solo"))
    assert setup.round("start") is None
    assert [e.healthy for e in setup.logged(HealthChecked)] == [False]  # type: ignore[attr-defined]
    assert setup.logged(NodeExcluded) == []


def test_a_check_failing_on_every_node_excludes_none(make: Make) -> None:
    """A command failing on all three nodes is the command's or the storage's problem, not the
    nodes': logged, nobody excluded, the job goes on."""
    setup = make(FakeNodes(("n1", "n2", "n3")), FakeHealth(bad={"n1", "n2", "n3"}))
    assert setup.round("start") is None
    assert setup.nodes.usable_nodes() == ("n1", "n2", "n3")
    assert setup.logged(NodeExcluded) == []


def test_disabled_checks_run_no_round(make: Make) -> None:
    """health.enabled = false: no round, no health_checked line."""
    health = FakeHealth(bad={"n1"})
    setup = make(FakeNodes(("n1", "n2")), health, "[health]\nenabled = false\n")
    assert setup.round("start") is None
    assert health.asked == []
    assert setup.logged(HealthChecked) == []


def test_a_stragglers_node_asked_for_is_excluded_once(make: Make) -> None:
    """A straggler's node the attempt asked to leave out ([health] exclude_stragglers) is
    excluded at the next round with the straggler's reason, once; a spare takes its place."""
    setup = make(FakeNodes(("n1", "n2", "n3")), FakeHealth())
    assert setup.round(requested={"n2": "rank 1 was a straggler"}) is None
    assert setup.round(requested={"n2": "rank 1 was a straggler again"}) is None
    excluded = setup.logged(NodeExcluded)
    assert excluded == [NodeExcluded(node="n2", reason="rank 1 was a straggler", failures=0)]
    assert setup.nodes.usable_nodes() == ("n1", "n3")
