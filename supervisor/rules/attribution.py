"""Where a failure came from: the node(s) it is attributed to, as one pure rule.

:func:`nodes_of` is applied by :func:`supervisor.rules.failures.classify` to every failure it
makes; the ``nodes`` of ``failure_detected`` are its answer. The rule, by kind:

- ``node_failure``: the lost nodes.
- ``crash``: the culprit's node, the first rank of the failure (the one that failed first; the
  others are usually collateral, killed by the group's teardown).
- ``oom``: the nodes of every rank that ran out of memory.
- ``hang``: the nodes of the culprits the stacks named (ranks outside a collective while the
  others waited in one); a hang without a culprit names no node: every rank waited, and which
  node's network or GPU held them up cannot be told from here.
- ``replicas_diverged``: the nodes of the ranks whose parameters differ from the majority's
  (silent data corruption is a node's fault).
- ``nonfinite_loss``, ``loss_spike``: no node; the data or the model went wrong, not a machine
  (a node that corrupts values shows as diverged replicas).
- ``preempted``, ``timelimit``, ``stopped``: no node; nothing failed.

A rank's node is the one its exit was seen on, else the one its hello named; a rank known by
neither adds no node. :func:`ranks_on` names, for each attributed node, every rank known to
have run on it (``failure_detected.node_ranks``): what a user needs to find the node's GPUs and
logs. A failed health check names its node itself (``health_checked``), and is counted by
:mod:`supervisor.rules.health`.
"""

from __future__ import annotations

from collections.abc import Iterable

from supervisor.rules.observation import Failure, FailureKind, Observation

__all__ = ["nodes_of", "ranks_on"]


def nodes_of(failure: Failure, obs: Observation) -> tuple[str, ...]:
    """The nodes ``failure`` is attributed to, in the order of its ranks (module docstring)."""
    kind = failure.kind
    if kind is FailureKind.NODE_FAILURE:
        return failure.nodes
    if kind is FailureKind.CRASH:
        return _nodes(obs, failure.ranks[:1])
    if kind in (FailureKind.OOM, FailureKind.REPLICAS_DIVERGED):
        return _nodes(obs, failure.ranks)
    if kind is FailureKind.HANG:
        return _nodes(obs, obs.hang_culprits)
    return ()


def ranks_on(nodes: Iterable[str], obs: Observation) -> dict[str, tuple[int, ...]]:
    """Every rank known to have run on each of ``nodes`` (ascending; a node with none known
    maps to ``()``), by the same rule as :func:`nodes_of`."""
    node_of = dict(obs.rank_nodes)
    node_of.update({e.rank: e.node for e in obs.exits if e.rank is not None and e.node})
    return {
        node: tuple(sorted(rank for rank, where in node_of.items() if where == node))
        for node in nodes
    }


def _nodes(obs: Observation, ranks: Iterable[int]) -> tuple[str, ...]:
    seen_on = {e.rank: e.node for e in obs.exits if e.rank is not None and e.node}
    found: dict[str, None] = {}
    for rank in ranks:
        node = seen_on.get(rank) or obs.rank_nodes.get(rank)
        if node:
            found.setdefault(node)
    return tuple(found)
