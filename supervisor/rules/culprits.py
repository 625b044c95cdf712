"""Who hung the group: from each rank's dumped stacks, the ranks *not* waiting in a collective.

In a hang the healthy ranks wait inside a collective (an all-reduce, a barrier, DDP's gradient
reduction at the end of ``backward()``) for the rank that never comes; that one is elsewhere:
sleeping, looping, reading data, stopped. Each rank's stacks are faulthandler's text (see
:mod:`supervisor.ranks.diagnostics`); the thread that took the dump signal, ``Current thread``, is
the main thread the training loop runs in. Pure: text in, verdict out.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Final

__all__ = ["Frame", "Verdict", "collective_of", "judge", "main_thread", "where"]

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


def judge(dumps: Mapping[int, str], stopped: Collection[int] = ()) -> Verdict | None:
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
