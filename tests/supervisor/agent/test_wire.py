"""The daemon's and the agents' messages in the daemon's terms (supervisor/agent/wire.py), and
the daemon's book of agents (supervisor/ranks/agents.py), from tables."""

from __future__ import annotations

import pytest

from supervisor.agent import wire
from supervisor.ranks.agents import NodeAgents, silence_limit
from supervisor.rules.stuck import RankEvidence, ThreadState
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

KEY = b"k" * 32
DUMP = 'Current thread 0x00007f (most recent call first):\n  File "train.py", line 9 in prepare\n'


def _through(body: m.Body, *, rank: int = -2, seq: int = 1, pid: int = 7) -> p.Message:
    frame = m.encode(KEY, body, rank=rank, attempt=1, pid=pid, seq=seq)
    assert len(frame) <= p.MAX_MESSAGE_BYTES
    return p.decode(KEY, frame)


def test_a_look_comes_back_as_the_evidence_it_carries() -> None:
    """A look's evidence (threads, CPU, state, stacks parsed into frames) survives the wire."""
    evidence = RankEvidence(
        3,
        state="R",
        cpu_s=0.6,
        window_s=0.75,
        wchan="",
        stack_read=True,
        threads=(ThreadState("pt_autograd_0", "S", "futex_wait_queue"),),
        collective="nccl:all_reduce (collective 21 of group 0)",
    )
    body = m.read(_through(wire.look_body(wire.Look(5, evidence, False, DUMP))))
    assert isinstance(body, m.NodeLook)
    look = wire.read_look(body)
    assert look is not None
    assert look.request == 5 and look.stacks == DUMP and not look.stopped
    assert look.evidence.frames[0].func == "prepare"
    assert look.evidence == RankEvidence(
        3,
        state="R",
        cpu_s=0.6,
        window_s=0.75,
        wchan="",
        frames=look.evidence.frames,
        stack_read=True,
        threads=evidence.threads,
        collective=evidence.collective,
    )


@pytest.mark.parametrize(
    "native", ["", "Thread 7 (idle): native\n    epoll_wait (libc.so.6)\n" * 2]
)
def test_a_look_with_huge_stacks_is_cut_to_fit_one_frame(native: str) -> None:
    """Stacks far larger than a message are cut (their head kept) so that the look still
    travels as one authenticated frame; native stacks travel with them (at most half the
    room: the Python stacks, which the rule reads, come first)."""
    huge = DUMP + 'Thread 0x1 (most recent call first):\n  File "x.py", line 1 in f\n' * 5000
    body = wire.look_body(wire.Look(1, RankEvidence(0, state="S"), True, huge, native))
    assert body.stacks and huge.startswith(body.stacks) and len(body.stacks) < len(huge)
    read = m.read(_through(body))
    assert isinstance(read, m.NodeLook) and read.stacks == body.stacks and read.stopped
    assert read.native == native
    both = wire.look_body(wire.Look(1, RankEvidence(0), False, huge, huge))
    assert both.native and huge.startswith(both.native) and len(both.stacks) >= len(both.native)
    assert m.read(_through(both)) == both


@pytest.mark.parametrize(
    ("ranks", "window", "expected"),
    [
        ("2:100,3:101", 0.75, wire.Ask(1, {2: 100, 3: 101}, 0.75)),
        ("", 0.75, wire.Ask(1, {}, 0.75)),
        ("2:100", 1e9, wire.Ask(1, {2: 100}, 0.0)),  # an absurd window: none
        ("2:x", 0.75, None),
        ("-1:100", 0.75, None),
        ("2", 0.75, None),
    ],
)
def test_a_request_is_read_only_when_well_formed(
    ranks: str, window: float, expected: wire.Ask | None
) -> None:
    """The ranks of a request are RANK:PID pairs of digits; anything else is no request."""
    body = m.read(_through(m.NodeAsk(1, ranks, window)))
    assert isinstance(body, m.NodeAsk)
    assert wire.read_ask(body) == expected


class Sent:
    def __init__(self) -> None:
        self.sent: list[tuple[bytes, m.Body, int]] = []

    def send(self, identity: bytes, body: m.Body, *, rank: int) -> None:
        self.sent.append((identity, body, rank))


def _beat(agents: NodeAgents, node: str, node_id: int, t: float, *, pid: int = 7) -> None:
    agents.heard(node.encode(), _through(m.NodeBeat(node), rank=p.agent_rank(node_id), pid=pid), t)


@pytest.mark.parametrize(
    ("beats", "now", "lost"),
    [
        ({"node1": 9.0, "node2": 9.0}, 10.0, []),
        ({"node1": 9.0, "node2": 6.9}, 10.0, ["node2"]),  # silent 3.1 s: lost
        ({"node1": 9.0, "node2": 7.1}, 10.0, []),  # 2.9 s: not yet
        ({"node1": 6.0, "node2": 6.0}, 10.0, []),  # the daemon's own node late too: it was held up
        ({"node2": 6.0, "node3": 9.5}, 10.0, ["node2"]),  # no own agent heard: others judge
    ],
)
def test_a_node_is_lost_when_its_agent_falls_silent(
    beats: dict[str, float], now: float, lost: list[str]
) -> None:
    """Silent for the limit (three 1 s beats, at least 3 s), an agent's node is lost, unless
    the daemon's own node's agent is as late."""
    agents = NodeAgents(Sent(), own_node="node1", interval_s=1.0)
    fast = NodeAgents(Sent(), own_node="node1", interval_s=0.2)
    assert fast.limit_s == 3.0 and "beats every 0.2 s" in _lost_after(fast)
    for i, (node, t) in enumerate(beats.items()):
        _beat(agents, node, i, t)
    assert agents.limit_s == silence_limit(1.0) == 3.0
    found = agents.silent(now)
    assert sorted(found) == lost
    assert all(
        how.startswith(
            f"its node agent sent nothing for {now - beats[node]:.1f} s (it beats"
            " every 1 s; lost after 3 s)"
        )
        for node, how in found.items()
    )


def _lost_after(agents: NodeAgents) -> str:
    """How a node whose agent beat once at 0 s is lost at 10 s."""
    _beat(agents, "node2", 1, 0.0)
    return agents.silent(10.0)["node2"]


def test_only_the_ranks_asked_about_are_taken_from_looks() -> None:
    """A request goes to the agents of the nodes named (not to a node without one); a look at
    a rank it did not ask about, or for another request, is not taken."""
    sent = Sent()
    agents = NodeAgents(sent, own_node="node1", interval_s=1.0)
    _beat(agents, "node2", 1, 0.0)
    request = agents.ask({"node2": {4: 40, 5: 50}, "node3": {6: 60}}, window_s=0.75)
    assert [(identity, rank) for identity, _, rank in sent.sent] == [(b"node2", p.agent_rank(1))]
    ask = sent.sent[0][1]
    assert isinstance(ask, m.NodeAsk) and ask.ranks == "4:40,5:50"
    for rank, req, seq in ((4, request, 2), (7, request, 3), (5, request + 1, 4)):
        look = wire.look_body(wire.Look(req, RankEvidence(rank, state="S"), False, ""))
        agents.heard(b"node2", _through(look, seq=seq), 1.0)
    assert list(agents.looks(request)) == [4] and not agents.answered(request)
    look = wire.look_body(wire.Look(request, RankEvidence(5, state="R"), False, ""))
    agents.heard(b"node2", _through(look, seq=5), 1.0)
    assert agents.answered(request)


def test_the_agents_status_says_their_beats_memory_and_oom_kills() -> None:
    """For ``rvsup status``: none without agents; with them, how many, the oldest beat, the
    node with the least memory available (one that said none is left out), the OOM kills."""
    agents = NodeAgents(Sent(), own_node="node1", interval_s=1.0)
    assert agents.status(0.0) is None
    for node_id, node, kills, memory in ((0, "node1", 0, 8 << 30), (1, "node2", 2, 3 << 30)):
        body = m.NodeBeat(node, oom_kills=kills, oom_host_wide="", memory_available=memory)
        agents.heard(node.encode(), _through(body, rank=p.agent_rank(node_id), pid=9), 10.0)
    agents.heard(b"n3", _through(m.NodeBeat("node3"), rank=p.agent_rank(2), pid=9), 10.5)
    assert agents.status(11.0) == {
        "count": 3,
        "oldest_beat_s": 1.0,
        "least_memory": ["node2", 3 << 30],
        "oom_kills": {"node2": [2, ""]},
    }
