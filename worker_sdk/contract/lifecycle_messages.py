"""The messages of a rank's life: it started, it is alive, it entered a phase, it fails, it
leaves, and (from its waiting parent) how its process ended. Read and written by
:mod:`.messages`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from .protocol import Kind

__all__ = ["Exiting", "Failure", "Heartbeat", "Hello", "Phase", "RankExit"]


@dataclass(frozen=True, slots=True)
class Hello:
    """A rank started: where it runs, where its output goes, the step it resumes at."""

    KIND: ClassVar = Kind.HELLO
    step: int  # the step it starts at
    host: str | None
    local_rank: int | None = None
    world_size: int | None = None
    total_steps: int | None = None  # above 0, when the script gave resume() one
    stdout: str | None = None  # the files holding its output
    stderr: str | None = None


@dataclass(frozen=True, slots=True)
class Heartbeat:
    """Alive at ``step`` (the last finished one)."""

    KIND: ClassVar = Kind.HEARTBEAT
    step: int
    longest_step_s: float = 0.0  # since the previous heartbeat
    loss: float | None = None  # of ``step``, finite, when the script passes one to step()
    comm_wait_s: float | None = None  # DDP's all-reduce wait of a sampled step (stragglers)


@dataclass(frozen=True, slots=True)
class Failure:
    """The rank is dying of an exception (``kind``: "oom" or "exception")."""

    KIND: ClassVar = Kind.FAILURE
    step: int
    kind: str
    type: str
    message: str


@dataclass(frozen=True, slots=True)
class Phase:
    """The script entered (``begin``) or left a declared phase."""

    KIND: ClassVar = Kind.PHASE
    step: int
    name: str | None
    begin: bool


@dataclass(frozen=True, slots=True)
class Exiting:
    """The rank leaves cleanly (``reason``: an :class:`~.protocol.ExitingReason` value)."""

    KIND: ClassVar = Kind.EXITING
    step: int
    reason: str | None


@dataclass(frozen=True, slots=True)
class RankExit:
    """From the rank's waiting parent: how the rank process ended. A well-formed report has
    ``pid``, ``host`` and exactly one of ``code`` and ``signal``; ``pid`` reads as None when
    ``code`` or ``signal`` is not an integer (the report is malformed)."""

    KIND: ClassVar = Kind.RANK_EXIT
    pid: int | None
    code: int | None
    signal: int | None
    host: str | None
    last_step: int | None = None  # from its step slot
