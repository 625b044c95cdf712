"""The node agents of a multi-node attempt, as the daemon hears them (:mod:`supervisor.agent`).

:class:`NodeAgents` keeps each node's agent's last beat, asks agents to look at their ranks and
keeps their answers. An agent heard once that then sends nothing for :func:`silence_limit` has
lost its node: the attempt ends in a node failure that says so, never a silent gap. Unless the
agent of the daemon's own node is just as late: then it is the daemon that was held up (its
loop stalled, the machine suspended), and no node is blamed. An agent that never started is
not lost this way: its node's ranks, which talk to the daemon through it, are then not heard
either, and ``startup_timeout`` judges their silence.

:class:`AgentLook` is the hang rule's look at the ranks of the other nodes
(:class:`supervisor.ranks.slow.RemoteLook`): it asks their agents and waits for their answers,
at most :data:`LOOK_GRACE_S` past the window.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

from supervisor.agent import wire
from supervisor.ranks.rank_table import RankTable
from supervisor.rules.stuck import RankEvidence
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

__all__ = [
    "LOOK_GRACE_S",
    "LOOK_WINDOW_S",
    "AgentLook",
    "AgentState",
    "NodeAgents",
    "silence_limit",
]

SILENCE_MIN_S = 3.0  # the shortest silence that loses an agent's node
LOOK_WINDOW_S = 0.75  # how long an agent looks at its ranks for the hang rule
LOOK_GRACE_S = 1.0  # how much longer than the window its answers are waited for
_POLL_S = 0.05


def silence_limit(interval_s: float) -> float:
    """How long an agent heard before may send nothing before its node counts as lost: three
    beats, at least :data:`SILENCE_MIN_S`."""
    return max(SILENCE_MIN_S, 3 * interval_s)


class AgentSender(Protocol):
    """What asking an agent needs of the rank channel."""

    def send(self, identity: bytes, body: m.Body, *, rank: int) -> None: ...


@dataclass(slots=True)
class AgentState:
    """One node's agent as last heard."""

    node: str
    node_id: int
    identity: bytes
    pid: int
    last_t: float
    oom_kills: int = -1  # its node's, since the agent started (-1: not known)
    oom_host_wide: str = ""  # why they are the host's count ("": the node's processes')
    memory_available: int = -1  # bytes (-1: not known)


class NodeAgents:
    """The agents of the current attempt (see the module docstring); ``own_node`` is the
    daemon's node, ``interval_s`` the agents' beat."""

    def __init__(self, channel: AgentSender, *, own_node: str, interval_s: float) -> None:
        self._channel = channel
        self.own_node = own_node
        self.interval_s = interval_s
        self.limit_s = silence_limit(interval_s)
        self.agents: dict[str, AgentState] = {}
        self._requests = 0
        self._asked: dict[int, set[int]] = {}  # request -> the ranks asked about
        self._looks: dict[int, dict[int, wire.Look]] = {}  # request -> rank -> look

    def heard(self, identity: bytes, msg: p.Message, now: float) -> wire.Beat:
        """An agent's message (``msg.rank`` < 0), authenticated; what a beat carries of its
        node's ranks (nothing for any other message)."""
        body = m.read(msg)
        if isinstance(body, m.NodeBeat) and body.node:
            st = self.agents.get(body.node)
            if st is None or st.pid != msg.pid:
                st = AgentState(body.node, -1 - msg.rank, identity, msg.pid, now)
                self.agents[body.node] = st
            st.identity, st.last_t = identity, now
            st.oom_kills, st.oom_host_wide = body.oom_kills, body.oom_host_wide
            st.memory_available = body.memory_available
            return wire.read_beat(body)
        if isinstance(body, m.NodeLook):
            look = wire.read_look(body)
            if look is not None and look.evidence.rank in self._asked.get(look.request, ()):
                self._looks[look.request][look.evidence.rank] = look
        return wire.Beat([], {})

    def oom_kills(self) -> dict[str, tuple[int, str]]:
        """The nodes whose agent counted OOM kills since it started, each with their count and
        why it is the host's ("" when it is the node's processes'). The daemon's own count is of
        its own group: under Slurm the ranks of its node are in that node's wrapper's group, which
        its node's agent counts."""
        return {
            node: (st.oom_kills, st.oom_host_wide)
            for node, st in self.agents.items()
            if st.oom_kills > 0
        }

    def status(self, now: float) -> dict[str, Any] | None:
        """The agents for ``rvsup status`` (None: there are none): how many beat, the oldest
        beat's age, the node with the least memory available, and the nodes with OOM kills."""
        if not self.agents:
            return None
        known = [st for st in self.agents.values() if st.memory_available >= 0]
        least = min(known, key=lambda st: st.memory_available, default=None)
        return {
            "count": len(self.agents),
            "oldest_beat_s": round(max(now - st.last_t for st in self.agents.values()), 3),
            "least_memory": None if least is None else [least.node, least.memory_available],
            "oom_kills": {node: list(counted) for node, counted in self.oom_kills().items()},
        }

    def silent(self, now: float) -> dict[str, str]:
        """The nodes whose agent fell silent, each with how that was established (empty while
        the daemon's own node's agent is as late: the daemon was held up)."""
        late = {node: now - st.last_t for node, st in self.agents.items()}
        found = {node: s for node, s in late.items() if s >= self.limit_s}
        if not found or self.own_node in found:
            return {}
        return {
            node: f"its node agent sent nothing for {s:.1f} s (it beats every "
            f"{self.interval_s:g} s; lost after {self.limit_s:g} s)"
            for node, s in found.items()
        }

    def ask(
        self,
        by_node: Mapping[str, Mapping[int, int]],
        *,
        window_s: float,
        dump: bool = False,
        native: bool = False,
    ) -> int:
        """Ask the agent of each node to look at its ranks (rank -> pid); the request's number.
        Nodes without an agent are not asked (their ranks stay unknown)."""
        self._requests += 1
        request = self._requests
        asked: set[int] = set()
        for node, ranks in by_node.items():
            st = self.agents.get(node)
            if st is None or not ranks:
                continue
            ask = wire.Ask(request, dict(ranks), window_s, dump=dump, native=native)
            self._channel.send(st.identity, wire.ask_body(ask), rank=p.agent_rank(st.node_id))
            asked |= set(ranks)
        self._asked[request] = asked
        self._looks[request] = {}
        return request

    def answered(self, request: int) -> bool:
        """Whether every rank asked about in ``request`` has been looked at."""
        return len(self._looks.get(request, {})) >= len(self._asked.get(request, ()))

    def looks(self, request: int) -> dict[int, wire.Look]:
        """The answers to ``request`` so far, by rank."""
        return dict(self._looks.get(request, {}))

    async def wait(self, request: int, timeout_s: float) -> dict[int, wire.Look]:
        """The answers to ``request`` once all are in, or once ``timeout_s`` has passed (the
        channel's receive loop must run meanwhile)."""
        deadline = time.monotonic() + timeout_s
        while not self.answered(request) and time.monotonic() < deadline:
            await asyncio.sleep(_POLL_S)
        return self.looks(request)


def remote_ranks(
    ranks: RankTable, agents: NodeAgents, local: Mapping[int, int]
) -> dict[str, dict[int, int]]:
    """The ranks on the other nodes that have an agent, by node (rank -> pid); ``local`` is
    pid -> rank of the daemon's own node's ranks."""
    mine = set(local.values())
    out: dict[str, dict[int, int]] = {}
    for st in ranks:
        if st.rank in mine or st.host == agents.own_node or st.host not in agents.agents:
            continue
        out.setdefault(st.host, {})[st.rank] = st.pid
    return out


class AgentLook:
    """The hang rule's look at the other nodes' ranks, through their agents; ``local`` gives
    the daemon's own node's ranks (pid -> rank)."""

    def __init__(
        self, agents: NodeAgents, ranks: RankTable, local: Callable[[], Mapping[int, int]]
    ) -> None:
        self._agents = agents
        self._ranks = ranks
        self._local = local
        self._request: int | None = None
        self._opened = 0.0

    def open(self, now: float) -> None:
        by_node = remote_ranks(self._ranks, self._agents, self._local())
        self._request = self._agents.ask(by_node, window_s=LOOK_WINDOW_S) if by_node else None
        self._opened = now

    def ready(self, now: float) -> bool:
        if self._request is None or self._agents.answered(self._request):
            return True
        return now >= self._opened + LOOK_WINDOW_S + LOOK_GRACE_S

    def evidence(self) -> list[RankEvidence]:
        if self._request is None:
            return []
        return [look.evidence for look in self._agents.looks(self._request).values()]
