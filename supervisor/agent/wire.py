"""The daemon's and the agents' messages (:mod:`worker_sdk.contract.node_messages`) in the
daemon's own terms: a request as rank -> pid, a look as the hang rule's
:class:`~supervisor.rules.stuck.RankEvidence` with the stacks it was judged by.

Everything travels as a message of the contract, authenticated like every other (and, across
nodes, inside the channel's CurveZMQ). An agent's messages carry the rank field
``protocol.agent_rank(node_id)``, negative, so the channel never takes them for a rank's.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import NamedTuple

from supervisor.rules import culprits
from supervisor.rules.stuck import RankEvidence, ThreadState
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

__all__ = [
    "BEAT_TEXT_BYTES",
    "ENTRIES_MAX",
    "Ask",
    "Beat",
    "Look",
    "RankBeat",
    "ask_body",
    "beat_texts",
    "beats_text",
    "look_body",
    "read_ask",
    "read_beat",
    "read_beats",
    "read_look",
    "read_steps",
]

_THREADS_MAX = 2_000  # characters of a look's thread list
_ROOM = 512  # bytes a look leaves for the header, the MAC and JSON's quoting of its fields
#: What one NODE_BEAT's ``beats`` and ``steps`` hold together at most, in bytes (a frame holds
#: 16 KiB: the rest is the header, the MAC, the node's name and JSON's keys). A heartbeat's
#: entry takes 13 to ~95 bytes (its floats), a step's 4 to ~25.
BEAT_TEXT_BYTES = 12_000
#: The entries of either kind read from one beat at most (more than BEAT_TEXT_BYTES can hold).
ENTRIES_MAX = 1_024


class RankBeat(NamedTuple):
    """A rank's heartbeat (:class:`~worker_sdk.contract.messages.Heartbeat`'s fields) as its
    node's agent passed it on, ``age_s`` after the agent had it (a tuple of plain values: the
    daemon reads thousands a second)."""

    rank: int
    pid: int
    step: int
    longest_step_s: float
    loss: float | None
    comm_wait_s: float | None
    age_s: float

    @classmethod
    def of(cls, rank: int, pid: int, body: m.Heartbeat, age_s: float = 0.0) -> RankBeat:
        return cls(rank, pid, body.step, body.longest_step_s, body.loss, body.comm_wait_s, age_s)

    @property
    def body(self) -> m.Heartbeat:
        """The heartbeat message it stands for."""
        return m.Heartbeat(self.step, self.longest_step_s, self.loss, self.comm_wait_s)


class Beat(NamedTuple):
    """What one agent's beat carried: its ranks' heartbeats, and the exact last finished step
    of those whose step slot changed (rank -> step)."""

    ranks: list[RankBeat]
    steps: dict[int, int]


_new_beat: Callable[[tuple[int, int, int, float, float | None, float | None, float]], RankBeat]
_new_beat = functools.partial(tuple.__new__, RankBeat)
"""A RankBeat of its values, made in C (the daemon reads thousands a second)."""


def _beat_entry(b: RankBeat) -> str:
    return (
        f"{b.rank},{b.pid},{b.step},{b.longest_step_s!r},{round(b.age_s * 1000)},"
        f"{_opt(b.loss)},{_opt(b.comm_wait_s)}"
    )


def beats_text(beats: list[RankBeat]) -> str:
    """``NodeBeat.beats`` for ``beats`` (all in one text: see :func:`beat_texts`)."""
    return ";".join(map(_beat_entry, beats))


def beat_texts(beats: list[RankBeat], steps: Mapping[int, int]) -> list[tuple[str, str]]:
    """``beats`` and ``steps`` as the ``(beats, steps)`` texts of as few NODE_BEATs as hold
    them, each at most :data:`BEAT_TEXT_BYTES` and :data:`ENTRIES_MAX` entries of a kind
    (nothing: one pair of empty texts, the beat alone)."""
    entries = [(";", _beat_entry(b)) for b in beats]
    entries += [(",", f"{rank}:{step}") for rank, step in steps.items()]
    out: list[tuple[str, str]] = []
    parts: dict[str, list[str]] = {";": [], ",": []}
    size = 0
    for sep, entry in entries:
        full = size + len(entry) + 1 > BEAT_TEXT_BYTES or len(parts[sep]) == ENTRIES_MAX
        if full and size:
            out.append((";".join(parts[";"]), ",".join(parts[","])))
            parts, size = {";": [], ",": []}, 0
        parts[sep].append(entry)
        size += len(entry) + 1
    if size or not out:
        out.append((";".join(parts[";"]), ",".join(parts[","])))
    return out


def read_beat(body: m.NodeBeat) -> Beat:
    """What a NODE_BEAT carried (malformed entries left out)."""
    return Beat(
        read_beats(body.beats) if body.beats else [],
        read_steps(body.steps) if body.steps else {},
    )


def read_steps(text: str) -> dict[int, int]:
    """The steps in ``NodeBeat.steps``; a malformed entry is left out (at most
    :data:`ENTRIES_MAX` are read)."""
    out: dict[int, int] = {}
    for entry in text.split(",", ENTRIES_MAX)[:ENTRIES_MAX]:
        rank, _, step = entry.partition(":")
        try:
            r, s = int(rank), int(step)
        except ValueError:
            continue
        if r >= 0 and s >= -1:
            out[r] = s
    return out


def read_beats(text: str) -> list[RankBeat]:
    """The heartbeats in ``NodeBeat.beats``; a malformed entry is left out (at most
    :data:`ENTRIES_MAX` are read)."""
    out = []
    isfinite = math.isfinite
    for entry in text.split(";", ENTRIES_MAX)[:ENTRIES_MAX]:
        parts = entry.split(",")
        if len(parts) != 7:
            continue
        rank_, pid_, step_, longest_, age_, loss_, wait_ = parts
        try:
            rank, pid, step, age_ms, longest = (
                int(rank_),
                int(pid_),
                int(step_),
                int(age_),
                float(longest_),
            )
            loss = float(loss_) if loss_ else None
            wait = float(wait_) if wait_ else None
        except ValueError:
            continue
        if rank < 0 or pid <= 0 or not 0 <= age_ms <= 60_000 or not isfinite(longest):
            continue
        if (loss is not None and not isfinite(loss)) or (wait is not None and not isfinite(wait)):
            continue
        out.append(_new_beat((rank, pid, step, longest, loss, wait, age_ms / 1000)))
    return out


def _opt(value: float | None) -> str:
    return "" if value is None else repr(value)


@dataclass(frozen=True, slots=True)
class Ask:
    """The daemon asks an agent to look at ``ranks`` (rank -> pid) over ``window_s``; with
    ``dump``, to collect their stacks for a declared hang instead."""

    request: int
    ranks: dict[int, int]
    window_s: float
    dump: bool = False
    native: bool = False


@dataclass(frozen=True, slots=True)
class Look:
    """What an agent saw of one rank: the evidence, whether it was stopped (state T) when the
    stacks of a declared hang were collected, the stacks it wrote, and its native stacks (or
    why there are none; "" when not asked for)."""

    request: int
    evidence: RankEvidence
    stopped: bool
    stacks: str
    native: str = ""


def ask_body(ask: Ask) -> m.NodeAsk:
    ranks = ",".join(f"{rank}:{pid}" for rank, pid in sorted(ask.ranks.items()))
    return m.NodeAsk(ask.request, ranks, ask.window_s, ask.dump, ask.native)


def read_ask(body: m.NodeAsk) -> Ask | None:
    """The request, or None when it is not a well-formed one."""
    ranks: dict[int, int] = {}
    for item in filter(None, body.ranks.split(",")):
        rank, _, pid = item.partition(":")
        if not (rank.isdigit() and pid.isdigit()):
            return None
        ranks[int(rank)] = int(pid)
    window = body.window_s if 0.0 <= body.window_s <= 60.0 else 0.0
    return Ask(body.request, ranks, window, body.dump, body.native)


def look_body(look: Look) -> m.NodeLook:
    """One look as a message; its stacks cut short where the whole would exceed a frame."""
    e = look.evidence
    threads = "\n".join(f"{t.name}\t{t.state}\t{t.wchan}" for t in e.threads)[:_THREADS_MAX]
    body = m.NodeLook(
        look.request,
        e.rank,
        e.window_s,
        e.state,
        e.cpu_s,
        e.wchan,
        threads,
        e.stack_read,
        look.stopped,
        collective=e.collective,
    )
    room = p.MAX_MESSAGE_BYTES - p.HEADER.size - p.MAC_BYTES - _ROOM
    room -= len(json.dumps(m.fields(body)[4], separators=(",", ":")))
    native = _fit(look.native, room // 2)  # the Python stacks first: the rule reads them
    stacks = _fit(look.stacks, room - len(json.dumps(native)))
    return dataclasses.replace(body, stacks=stacks, native=native)


def _fit(text: str, room: int) -> str:
    """``text``, cut short until it takes at most ``room`` bytes in JSON."""
    while text and len(json.dumps(text)) > room:
        text = text[: len(text) * 3 // 4]
    return text


def read_look(body: m.NodeLook) -> Look | None:
    """The look, or None when it names no rank."""
    if body.of < 0:
        return None
    evidence = RankEvidence(
        body.of,
        state=body.state,
        cpu_s=body.cpu_s,
        window_s=body.window_s,
        wchan=body.wchan,
        frames=tuple(culprits.main_thread(body.stacks)),
        stack_read=body.stack_read,
        threads=tuple(_threads(body.threads)),
        collective=body.collective,
    )
    return Look(body.request, evidence, body.stopped, body.stacks, body.native)


def _threads(text: str) -> list[ThreadState]:
    out = []
    for line in text.splitlines():
        parts = line.split("\t")
        if len(parts) == 3:
            out.append(ThreadState(*parts))
    return out
