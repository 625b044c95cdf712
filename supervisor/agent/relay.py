"""The agent's relay between its node's ranks and the daemon: what goes up now, what waits for
the next beat, and which rank a frame from the daemon is for.

A rank's messages are checked (the job's key, this attempt, a rank's own number) and passed on
as they are, the rank's own MAC and sequence number included, so the daemon checks them as it
checks a rank connected to it directly. Only heartbeats wait: each rank's newest one is held
until the agent's next beat, which carries them all (:class:`~worker_sdk.contract.messages.NodeBeat`):
one message per node per interval instead of one per rank. A rank's messages keep their order:
anything else it sends first sends its held heartbeat on as it is, and so does a second
heartbeat before the beat (nothing it said is lost). The daemon answers a rank through the
agent's connection; the relay hands the answer to the connection that rank's messages came from.
The beat also carries the exact last finished step of each rank whose step slot moved since the
last beat (the agent reads the slots: they are on its node, and a heartbeat is rate-limited).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass

from supervisor.agent import wire
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

__all__ = ["Relay"]


@dataclass(frozen=True, slots=True)
class _Held:
    frame: bytes
    beat: wire.RankBeat
    at: float  # monotonic: when the agent got it


class Relay:
    """One attempt's relay (see the module docstring); frames are checked with ``key``."""

    def __init__(self, key: bytes, attempt: int) -> None:
        self._key = key
        self.attempt = attempt
        self._held: dict[int, _Held] = {}  # rank -> its newest heartbeat, not sent yet
        self._routes: dict[int, bytes] = {}  # rank -> the connection its messages come from
        self._steps_sent: dict[int, int] = {}  # rank -> the step slot's value last sent
        self.dropped = 0
        self.exit_passed = False  # a rank's exit report went up since the last beat

    @property
    def ranks(self) -> Collection[int]:
        """The ranks of this node heard so far (whose step slots the agent reads)."""
        return self._routes.keys()

    def from_rank(self, identity: bytes, frame: bytes, now: float) -> list[bytes]:
        """A frame from a rank of this node: the frames to send the daemon now (none: held or
        dropped)."""
        try:
            msg = p.decode(self._key, frame)
        except p.BadMessageError:
            self.dropped += 1
            return []
        if msg.attempt != self.attempt or msg.rank < 0 or msg.kind >= p.Kind.NODE_BEAT:
            self.dropped += 1
            return []
        if msg.kind is p.Kind.RANK_EXIT:  # sent by the rank's parent: not its connection
            self.exit_passed = True
        else:
            self._routes[msg.rank] = identity
        held = self._held.pop(msg.rank, None)
        out = [] if held is None else [held.frame]
        if msg.kind is p.Kind.HEARTBEAT:
            body = m.read(msg)
            assert isinstance(body, m.Heartbeat)
            self._held[msg.rank] = _Held(frame, wire.RankBeat.of(msg.rank, msg.pid, body), now)
        else:
            out.append(frame)
        return out

    def beats(self, now: float, slots: Mapping[int, int] | None = None) -> list[tuple[str, str]]:
        """The held heartbeats, each with its age, and the ranks' step ``slots`` (rank -> step)
        that changed since the last beat, as ``NodeBeat`` ``(beats, steps)`` texts (one pair
        per message: :func:`~supervisor.agent.wire.beat_texts`); they are no longer held."""
        held, self._held = self._held, {}
        self.exit_passed = False
        beats = [h.beat._replace(age_s=max(now - h.at, 0.0)) for h in held.values()]
        sent = self._steps_sent
        moved = {r: s for r, s in (slots or {}).items() if sent.get(r) != s}
        sent.update(moved)
        return wire.beat_texts(beats, moved)

    def to_rank(self, msg: p.Message) -> bytes | None:
        """The connection of the rank the daemon's ``msg`` is for (None: no rank of this node
        has said anything yet)."""
        return self._routes.get(msg.rank)
