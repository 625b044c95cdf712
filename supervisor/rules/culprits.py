"""Who hung the group: from each rank's dumped stacks, the ranks *not* waiting in a collective.

In a hang the healthy ranks wait inside a collective (an all-reduce, a barrier, DDP's gradient
reduction at the end of ``backward()``) for the rank that never comes; that one is elsewhere:
sleeping, looping, reading data, stopped. Each rank's stacks are faulthandler's text (see
:mod:`supervisor.process.diagnostics`); the thread that took the dump signal, ``Current thread``, is
the main thread the training loop runs in.

torch's flight recorder, where the ranks dumped one (c10d's JSON: per process group the last
collective each rank enqueued and completed), says the same from the other side: the ranks that
enqueued fewer collectives of a group than the others, which wait in the next one, never came.
It catches what stacks cannot: a rank blocked in a receive nobody sends is inside torch too.

Pure: text in, verdict out.
"""

from __future__ import annotations

import json
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

from supervisor.record.typed_json import read_int

__all__ = [
    "FlightStatus",
    "Frame",
    "Verdict",
    "collective_of",
    "flight_status",
    "flight_verdict",
    "judge",
    "main_thread",
    "stack_verdict",
    "under_way",
    "where",
]

_FRAME_RE: Final = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>\S+)')
_THREAD_RE: Final = re.compile(r"^(Current thread|Thread) 0x[0-9a-fA-F]+", re.MULTILINE)
# where a rank waits for the others: c10d's collectives, DDP/FSDP, autograd (DDP's reduction
# is awaited at the end of backward()), DCP's collectives
_WAITING_IN: Final = (
    "torch/distributed/",
    "torch/nn/parallel/distributed.py",
    "torch/autograd/",
)
_LIBRARY: Final = ("/site-packages/", "/dist-packages/", "/lib/python3")


@dataclass(frozen=True, slots=True)
class Frame:
    """One line of a dumped stack, innermost first."""

    file: str
    line: int
    func: str


@dataclass(frozen=True, slots=True)
class Verdict:
    """The ranks that are not in a collective while others wait in one."""

    culprits: tuple[int, ...]
    waiting: tuple[int, ...]
    detail: str


def main_thread(dump: str) -> list[Frame]:
    """The frames of the ``Current thread`` of the last dump in ``dump`` (innermost first);
    empty when there is none (a rank that could not answer)."""
    blocks: list[tuple[bool, list[Frame]]] = []
    for line in dump.splitlines():
        head = _THREAD_RE.match(line)
        if head is not None:
            blocks.append((head.group(1) == "Current thread", []))
            continue
        frame = _FRAME_RE.match(line)
        if frame is not None and blocks:
            blocks[-1][1].append(
                Frame(frame.group("file"), int(frame.group("line")), frame.group("func"))
            )
    current = [frames for is_current, frames in blocks if is_current]
    return current[-1] if current else []


def collective_of(frames: Sequence[Frame]) -> str | None:
    """The function a rank waits for the others in (the innermost such frame), or None."""
    for frame in frames:
        path = frame.file.replace("\\", "/")
        if any(part in path for part in _WAITING_IN):
            return frame.func
    return None


def where(frames: Sequence[Frame]) -> str:
    """The innermost frame of the user's code (else the innermost frame), as ``file:line in f``."""
    for frame in frames:
        if not any(part in frame.file for part in _LIBRARY):
            return f"{frame.file.rsplit('/', 1)[-1]}:{frame.line} in {frame.func}"
    if frames:
        f = frames[0]
        return f"{f.file.rsplit('/', 1)[-1]}:{f.line} in {f.func}"
    return "no stack"


def _cut_short(dump: str) -> bool:
    return bool(_THREAD_RE.search(dump)) and "Current thread" not in dump


def judge(
    dumps: Mapping[int, str],
    stopped: Collection[int] = (),
    flights: Mapping[int, str] | None = None,
) -> Verdict | None:
    """The culprits of a hang from every rank's stacks (rank -> text), the ranks found stopped
    and the flight recorders' dumps (rank -> JSON), or None when nothing singles anyone out.
    The stacks' culprits come first, then those only the flight recorders name; the detail
    says both."""
    by_stacks = stack_verdict(dumps, stopped)
    by_flight = flight_verdict(flights or {})
    if by_stacks is None or by_flight is None:
        return by_stacks or by_flight
    extra = tuple(r for r in by_flight.culprits if r not in by_stacks.culprits)
    return Verdict(
        by_stacks.culprits + extra,
        by_stacks.waiting,
        f"{by_stacks.detail}; {by_flight.detail}",
    )


def stack_verdict(dumps: Mapping[int, str], stopped: Collection[int] = ()) -> Verdict | None:
    """The culprits of a hang from every rank's dump (rank -> text) and the ranks found stopped
    by a signal, or None when they do not single anyone out (all wait in collectives, none
    does, or too few answered). A stopped rank is a culprit whatever its dump says: continued
    only to dump, it may have written it after the others were read, or only in part."""
    stopped = sorted(set(stopped))
    stacks = {rank: main_thread(text) for rank, text in dumps.items() if rank not in stopped}
    answered = {rank: frames for rank, frames in stacks.items() if frames}
    waiting = {r: c for r, f in answered.items() if (c := collective_of(f)) is not None}
    elsewhere = sorted(set(answered) - set(waiting))
    # no Python frame in the main thread, or no dump at all: it could not answer (stuck
    # outside Python); other threads but not the main one: a dump cut short (the main thread
    # comes last), which says nothing
    silent = sorted(r for r in set(stacks) - set(answered) if not _cut_short(dumps[r]))
    culprits = [*stopped, *elsewhere, *silent]
    if not waiting or not culprits:
        return None
    parts = (
        [f"rank {r} was stopped by a signal (SIGSTOP, SIGTSTP or a debugger)" for r in stopped]
        + [f"rank {r} is not in a collective ({where(answered[r])})" for r in elsewhere]
        + [f"rank {r} wrote no stack (stopped or stuck outside Python)" for r in silent]
    )
    names = sorted(set(waiting.values()))
    verb = "waits" if len(waiting) == 1 else "wait"
    ranks = ", ".join(str(r) for r in sorted(waiting))
    rank_word = "rank" if len(waiting) == 1 else "ranks"
    parts.append(f"{rank_word} {ranks} {verb} in {', '.join(names)}")
    return Verdict(tuple(culprits), tuple(sorted(waiting)), "; ".join(parts))


@dataclass(frozen=True, slots=True)
class FlightStatus:
    """One rank's flight recorder, for one process group."""

    enqueued: int  # the sequence number of the last collective it enqueued (-1: none)
    completed: int  # ... and of the last one that completed
    op: str  # the name of the last enqueued one (``gloo:all_reduce``); "" if not recorded

    def describe(self) -> str:
        done = "completed" if self.completed >= self.enqueued else "not completed"
        return f"{self.op}, {done}" if self.op else done


def flight_status(text: str) -> dict[str, FlightStatus]:
    """Per process group (its id), what one rank's flight-recorder dump says; empty for a dump
    that is not torch's JSON."""
    try:
        return _status_of(json.loads(text))
    except ValueError:
        return {}


def _status_of(doc: object) -> dict[str, FlightStatus]:
    """:func:`flight_status` of the parsed dump."""
    if not isinstance(doc, dict) or not isinstance(doc.get("pg_status"), dict):
        return {}
    names: dict[tuple[str, int], str] = {}
    for entry in doc.get("entries") or []:
        if not isinstance(entry, dict):
            continue
        group = entry.get("process_group")
        gid = str(group[0]) if isinstance(group, list) and group else ""
        seq = _int(entry.get("collective_seq_id"))
        if gid and seq is not None:
            names[gid, seq] = str(entry.get("profiling_name", ""))
    out: dict[str, FlightStatus] = {}
    for gid, status in doc["pg_status"].items():
        if not isinstance(status, dict):
            continue
        enqueued = _int(status.get("last_enqueued_collective"))
        completed = _int(status.get("last_completed_collective"))
        if enqueued is not None and completed is not None:
            out[str(gid)] = FlightStatus(enqueued, completed, names.get((str(gid), enqueued), ""))
    return out


def under_way(text: str) -> str:
    """The collective one rank's flight-recorder dump shows under way: enqueued, not completed
    (nor retired, nor at or below its group's last completed one), and running, as gloo's is once
    enqueued (it has no device queue) and an NCCL one is once the recorder saw its kernel begin
    (its state ``started``; one still queued behind a long kernel is not under way). Said as
    ``gloo:all_reduce (collective 21 of group 0)``; "" when none, or for a dump that is not
    torch's JSON. A rank whose host waits for it (CUDA's wait spins, ``Work.is_completed()`` in
    a loop) shows no collective in its Python stack."""
    try:
        doc = json.loads(text)
    except ValueError:
        return ""
    entries = doc.get("entries") if isinstance(doc, dict) else None
    done = {gid: st.completed for gid, st in _status_of(doc).items()}
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or entry.get("retired") is True:
            continue
        state, name = entry.get("state"), str(entry.get("profiling_name", ""))
        if state == "completed" or not (state == "started" or name.startswith("gloo:")):
            continue
        group, seq = entry.get("process_group"), _int(entry.get("collective_seq_id"))
        gid = str(group[0]) if isinstance(group, list) and group else "?"
        if seq is not None and gid in done and seq <= done[gid]:
            continue
        return f"{name} (collective {'?' if seq is None else seq} of group {gid})"
    return ""


def flight_verdict(flights: Mapping[int, str]) -> Verdict | None:
    """The culprits by the flight recorders (rank -> dump): in the first process group, in id
    order, where some ranks wait in a collective that others never enqueued, those others.
    None when no group shows that (or fewer than two ranks dumped)."""
    statuses = {rank: flight_status(text) for rank, text in flights.items()}
    groups = sorted({g for st in statuses.values() for g in st}, key=_group_order)
    for gid in groups:
        members = {r: st[gid] for r, st in statuses.items() if gid in st}
        if len(members) < 2:
            continue
        front = max(m.enqueued for m in members.values())
        waiting = sorted(r for r, m in members.items() if m.enqueued == front > m.completed)
        behind = sorted(r for r, m in members.items() if m.enqueued < front)
        if not waiting or not behind:
            continue
        parts = [
            f"rank {r} enqueued collective {members[r].enqueued} last ({members[r].describe()})"
            for r in behind
        ]
        ranks = ", ".join(str(r) for r in waiting)
        rank_word = "rank" if len(waiting) == 1 else "ranks"
        verb = "waits" if len(waiting) == 1 else "wait"
        parts.append(
            f"{rank_word} {ranks} {verb} in collective {front}{_ops(members, waiting)} of group {gid}"
        )
        return Verdict(tuple(behind), tuple(waiting), "flight recorder: " + "; ".join(parts))
    return None


def _ops(members: Mapping[int, FlightStatus], waiting: Sequence[int]) -> str:
    names = sorted({members[r].op for r in waiting if members[r].op})
    return f" ({', '.join(names)})" if names else ""


def _group_order(gid: str) -> tuple[int, str]:
    number = _int(gid)
    return (number if number is not None else 1 << 30, gid)


def _int(value: object) -> int | None:
    number = read_int(value)
    return number if isinstance(number, int) else None
