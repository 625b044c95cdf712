"""nodes_of(): the node(s) each kind of failure is attributed to, from a table, and classify()
putting them on every failure."""

from __future__ import annotations

import signal

import pytest

from supervisor.rules.attribution import nodes_of, ranks_on
from supervisor.rules.failures import classify
from supervisor.rules.observation import (
    Failure,
    FailureKind,
    Observation,
    RankExit,
    RankReport,
    StopReason,
)

K = FailureKind
HOSTS = {0: "n1", 1: "n1", 2: "n2", 3: "n2"}


def killed(rank: int, node: str | None = None) -> RankExit:
    return RankExit(rank, 100 + rank, None, int(signal.SIGKILL), node)


def failure(kind: FailureKind, ranks: tuple[int, ...], nodes: tuple[str, ...] = ()) -> Failure:
    return Failure(kind, ranks, (), (), 10, "detail", nodes)


ROWS = {
    "crash-names-the-culprit-s-node-only": (
        failure(K.CRASH, (2, 0, 1)),
        Observation(rank_nodes=HOSTS),
        ("n2",),
    ),
    "the-node-an-exit-was-seen-on-wins": (
        failure(K.CRASH, (3,)),
        Observation(exits=(killed(3, "n9"),), rank_nodes=HOSTS),
        ("n9",),
    ),
    "a-rank-that-never-said-hello-adds-no-node": (
        failure(K.CRASH, (5,)),
        Observation(rank_nodes=HOSTS),
        (),
    ),
    "oom-names-every-oom-rank-s-node-once": (
        failure(K.OOM, (1, 2, 0)),
        Observation(rank_nodes=HOSTS),
        ("n1", "n2"),
    ),
    "hang-names-the-culprits-nodes": (
        failure(K.HANG, (3, 0, 1, 2)),
        Observation(hang_culprits=(3,), rank_nodes=HOSTS),
        ("n2",),
    ),
    "hang-without-a-culprit-names-no-node": (
        failure(K.HANG, (0, 1, 2, 3)),
        Observation(rank_nodes=HOSTS),
        (),
    ),
    "node-failure-keeps-the-lost-nodes": (
        failure(K.NODE_FAILURE, (2, 3), ("n2",)),
        Observation(lost_nodes={"n2": ""}, rank_nodes=HOSTS),
        ("n2",),
    ),
    "diverged-replicas-name-their-nodes": (
        failure(K.REPLICAS_DIVERGED, (3,)),
        Observation(rank_nodes=HOSTS),
        ("n2",),
    ),
    "a-nan-loss-names-no-node": (
        failure(K.NONFINITE_LOSS, (1,)),
        Observation(rank_nodes=HOSTS),
        (),
    ),
    "a-stop-names-no-node": (failure(K.PREEMPTED, ()), Observation(rank_nodes=HOSTS), ()),
}


@pytest.mark.parametrize(("f", "obs", "nodes"), list(ROWS.values()), ids=list(ROWS))
def test_nodes_of(f: Failure, obs: Observation, nodes: tuple[str, ...]) -> None:
    """Each kind of failure is attributed to the nodes the module's rule says."""
    assert nodes_of(f, obs) == nodes


def test_classify_attributes_every_failure() -> None:
    """classify() puts the attribution on the failure it makes: rank 2 killed on n2, rank 0
    collateral on n1 -> the crash is n2's; an OOM report of rank 1 -> n1; a stop -> none."""
    crash = Observation(exits=(killed(2, "n2"), killed(0, "n1")), rank_nodes=HOSTS)
    assert classify(crash).nodes == ("n2",)
    oom = Observation(
        reports=(RankReport(1, "oom", "OutOfMemoryError", "CUDA out of memory", 7),),
        rank_nodes=HOSTS,
    )
    assert classify(oom).nodes == ("n1",)
    stop = Observation(exits=(killed(2, "n2"),), stop_reason=StopReason.PREEMPTED)
    assert classify(stop).nodes == ()


RANKS_ON = {
    "every-rank-of-the-node-from-hellos": (("n2",), Observation(rank_nodes=HOSTS), {"n2": (2, 3)}),
    "an-exit-s-node-overrides-the-hello": (
        ("n1", "n9"),
        Observation(exits=(killed(1, "n9"),), rank_nodes=HOSTS),
        {"n1": (0,), "n9": (1,)},
    ),
    "a-node-with-no-known-rank": (("n7",), Observation(rank_nodes=HOSTS), {"n7": ()}),
    "no-node-no-map": ((), Observation(rank_nodes=HOSTS), {}),
}


@pytest.mark.parametrize(("nodes", "obs", "expected"), list(RANKS_ON.values()), ids=list(RANKS_ON))
def test_ranks_on(
    nodes: tuple[str, ...], obs: Observation, expected: dict[str, tuple[int, ...]]
) -> None:
    """ranks_on() maps each attributed node to every rank known to have run on it."""
    assert ranks_on(nodes, obs) == expected


def test_classify_names_the_ranks_on_the_attributed_nodes() -> None:
    """A crash of rank 2 on n2 names n2 and both of n2's ranks; a lost n2 too."""
    crash = Observation(exits=(killed(2, "n2"), killed(0, "n1")), rank_nodes=HOSTS)
    assert classify(crash).node_ranks == {"n2": (2, 3)}
    lost = Observation(lost_nodes={"n2": ""}, rank_nodes=HOSTS)
    assert classify(lost).node_ranks == {"n2": (2, 3)}
