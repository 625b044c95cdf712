"""The agent's relay (supervisor/agent/relay.py), from tables: what goes up at once, what waits
for the beat, the order of a rank's messages, and where the daemon's answers go."""

from __future__ import annotations

import pytest

from supervisor.agent import wire
from supervisor.agent.relay import Relay
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

KEY = b"k" * 32


class Rank:
    """One rank's messages, numbered as its channel numbers them."""

    def __init__(self, rank: int, *, pid: int = 500, attempt: int = 1, key: bytes = KEY) -> None:
        self.rank, self.pid, self.attempt, self.key, self.seq = rank, pid, attempt, key, 0

    def frame(self, body: m.Body) -> bytes:
        self.seq += 1
        return m.encode(
            self.key, body, rank=self.rank, attempt=self.attempt, pid=self.pid, seq=self.seq
        )


def test_heartbeats_wait_for_the_beat_and_go_up_together_with_their_age() -> None:
    """Two ranks' heartbeats are held; the beat carries both, each with how long it was held,
    and nothing is held after it."""
    relay = Relay(KEY, attempt=1)
    r0, r1 = Rank(0, pid=500), Rank(1, pid=501)
    assert relay.from_rank(b"a", r0.frame(m.Heartbeat(7, 0.25, 1.5)), now=10.0) == []
    assert relay.from_rank(b"b", r1.frame(m.Heartbeat(7, 0.5, None, 0.01)), now=10.4) == []
    ((text, steps),) = relay.beats(now=11.0)
    assert steps == ""
    assert wire.read_beats(text) == [
        wire.RankBeat.of(0, 500, m.Heartbeat(7, 0.25, 1.5), 1.0),
        wire.RankBeat.of(1, 501, m.Heartbeat(7, 0.5, None, 0.01), 0.6),
    ]
    assert relay.beats(now=12.0) == [("", "")]  # the beat alone


def test_a_ranks_messages_keep_their_order_and_none_is_lost() -> None:
    """Anything else a rank sends goes up at once, after its held heartbeat (sent as it is);
    a second heartbeat before the beat sends the first one on as it is."""
    relay = Relay(KEY, attempt=1)
    r0 = Rank(0)
    first = r0.frame(m.Heartbeat(3, 0.1))
    assert relay.from_rank(b"a", first, now=1.0) == []
    begin = r0.frame(m.CheckpointBegin(3))
    assert relay.from_rank(b"a", begin, now=1.1) == [first, begin]
    second, third = r0.frame(m.Heartbeat(4, 0.1)), r0.frame(m.Heartbeat(5, 0.1))
    assert relay.from_rank(b"a", second, now=1.2) == []
    assert relay.from_rank(b"a", third, now=1.3) == [second]
    ((text, _),) = relay.beats(now=1.5)
    assert [b.step for b in wire.read_beats(text)] == [5]


@pytest.mark.parametrize(
    ("frame", "why"),
    [
        (Rank(0, key=b"x" * 32).frame(m.Heartbeat(1)), "another key"),
        (Rank(0, attempt=2).frame(m.Heartbeat(1)), "another attempt"),
        (m.encode(KEY, m.NodeBeat("node9"), rank=-3, attempt=1, pid=9, seq=1), "an agent's"),
        (m.encode(KEY, m.Heartbeat(1), rank=-1, attempt=1, pid=9, seq=1), "a negative rank"),
        (b"garbage", "not a message"),
    ],
)
def test_what_is_not_this_attempts_ranks_is_dropped(frame: bytes, why: str) -> None:
    """Frames that are not a message of one of this attempt's ranks go nowhere."""
    relay = Relay(KEY, attempt=1)
    assert relay.from_rank(b"a", frame, now=1.0) == [], why
    assert relay.beats(now=2.0) == [("", "")] and relay.dropped == 1


def test_the_daemons_answer_goes_to_the_connection_the_rank_spoke_from() -> None:
    """Answers go where the rank's own messages came from, not where its parent's exit report
    did; a rank that has said nothing gets nothing."""
    relay = Relay(KEY, attempt=1)
    r1 = Rank(1)
    relay.from_rank(b"rank-1", r1.frame(m.Sync(4)), now=1.0)
    relay.from_rank(b"parent", r1.frame(m.RankExit(500, 0, None, "node2", 4)), now=1.1)
    answer = p.decode(KEY, m.encode(KEY, m.Continue(), rank=1, attempt=1, pid=1, seq=0))
    assert relay.to_rank(answer) == b"rank-1"
    other = p.decode(KEY, m.encode(KEY, m.Continue(), rank=2, attempt=1, pid=1, seq=0))
    assert relay.to_rank(other) is None


def test_a_node_with_many_ranks_beats_in_several_messages() -> None:
    """More heartbeats and steps than one message holds, each entry as long as its values
    make it, are split: every one arrives, each part one authenticated frame."""
    relay = Relay(KEY, attempt=1)
    n = 400
    for r in range(n):
        beat = m.Heartbeat(10**12, 0.30000000000000004, -1.2345678901234567e-300, 1 / 3)
        relay.from_rank(b"x", Rank(100_000 + r, pid=4_000_000 + r).frame(beat), 0.0)
    slots = {100_000 + r: 10**12 + r for r in range(n)}
    texts = relay.beats(now=59.0, slots=slots)
    assert len(texts) > 1
    assert sum(len(wire.read_beats(b)) for b, _ in texts) == n
    assert {r: s for _, t in texts for r, s in wire.read_steps(t).items()} == slots
    for beats, steps in texts:
        frame = m.encode(KEY, m.NodeBeat("x" * 64, beats, steps), rank=-2, attempt=1, pid=9, seq=1)
        assert len(frame) <= p.MAX_MESSAGE_BYTES


def test_more_steps_than_one_beat_reads_are_split() -> None:
    """Short step entries (a few bytes each) are split at the count a beat is read up to, so
    that none is left unread."""
    steps = dict.fromkeys(range(3 * wire.ENTRIES_MAX), -1)
    texts = wire.beat_texts([], steps)
    assert len(texts) == 3
    assert {r: s for _, t in texts for r, s in wire.read_steps(t).items()} == steps


def test_a_step_slot_goes_up_when_it_moved() -> None:
    """The beat carries each heard rank's step slot once per value: a slot that did not move
    since the last beat is not sent again."""
    relay = Relay(KEY, attempt=1)
    relay.from_rank(b"a", Rank(0).frame(m.Hello(0, "node2")), now=1.0)
    relay.from_rank(b"b", Rank(1).frame(m.Hello(0, "node2")), now=1.0)
    assert sorted(relay.ranks) == [0, 1]
    assert relay.beats(now=2.0, slots={0: 4, 1: -1}) == [("", "0:4,1:-1")]
    assert relay.beats(now=3.0, slots={0: 4, 1: 2}) == [("", "1:2")]
    assert relay.beats(now=4.0, slots={0: 4, 1: 2}) == [("", "")]


@pytest.mark.parametrize(
    "entry",
    [
        "1,2,3,0.5,10,,",  # well formed: read
        "1,2,3,0.5,10,,,extra",
        "-1,2,3,0.5,10,,",
        "1,0,3,0.5,10,,",
        "1,2,3,nan,10,,",
        "1,2,3,0.5,99999999,,",
        "1,2,3,0.5,10,inf,",
        "a,2,3,0.5,10,,",
    ],
)
def test_a_malformed_beat_entry_is_left_out(entry: str) -> None:
    """Only a well-formed entry (ranks and pids positive, finite values, a plausible age) is
    read; the others are left out without raising."""
    read = wire.read_beats(f"{entry};5,6,7,0.1,1,,")
    assert [b.rank for b in read] == ([1, 5] if entry == "1,2,3,0.5,10,," else [5])


@pytest.mark.parametrize(
    ("text", "read"),
    [
        ("3:17,4:-1", {3: 17, 4: -1}),
        ("3:17,x:1,5:,:2,-1:4,6:-2,7:8:9", {3: 17}),
        ("", {}),
    ],
)
def test_malformed_step_entries_are_left_out(text: str, read: dict[int, int]) -> None:
    """Only "RANK:STEP" with a rank of 0 or more and a step of -1 (none yet) or more is read."""
    assert wire.read_steps(text) == read
