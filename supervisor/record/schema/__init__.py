"""The history's events, defined once: one frozen dataclass per event of ``events.jsonl``.

A class's fields *are* the event's JSON fields (same names, same order); its ``NAME`` and ``LEVEL``
are the line's ``event`` and ``level``. The writer (``EventLog.log`` in
:mod:`supervisor.record.events`) accepts nothing else, and the readers
(:mod:`supervisor.record.history`, :mod:`supervisor.rules.budget`) fold these objects instead of
dictionaries. A line is the common fields ``timestamp``, ``event``, ``level``, ``job``, ``attempt``
plus :func:`to_json` of the event.

Building an event checks its values against the field types and normalises them (lists to tuples,
enum members to plain strings, the floats named in ``DIGITS`` rounded as written), so an event read
back compares equal to the one logged. Reading (:mod:`supervisor.record.entries`) takes any line
any version of rvsup wrote: a missing or malformed field is empty (None, ``""``, ``False``, ``()``,
``{}``), except a non-optional ``int``/``float``, which is required — without it the line is
skipped and counted as invalid (the rules: :mod:`supervisor.record.typed_json`); an event name this
version does not know is skipped and counted as unknown.

The classes live by topic in this package's modules (:mod:`.base`, :mod:`.lifecycle`,
:mod:`.checkpoints`, :mod:`.failures`, :mod:`.nodes`, :mod:`.processes`, :mod:`.memory`,
:mod:`.resumes`);
import them from here.

Pure: no I/O and no clock (the rules import it).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from typing import Final

from supervisor.record import typed_json
from supervisor.record.schema.base import Event, Level
from supervisor.record.schema.checkpoints import (
    CheckpointCommitted,
    CheckpointFailed,
    CheckpointLoaded,
    CheckpointSkipped,
    ColdStart,
)
from supervisor.record.schema.failures import (
    AnomalyDetected,
    FailureDetected,
    RolledBack,
)
from supervisor.record.schema.lifecycle import (
    AttemptStarted,
    JobGaveUp,
    JobStarted,
    JobStopped,
    JobSucceeded,
    RestartScheduled,
    StopRequested,
)
from supervisor.record.schema.memory import (
    MemoryDirRefused,
    MemorySnapshots,
    MemoryTierOff,
    SnapshotsSwept,
)
from supervisor.record.schema.nodes import (
    HealthChecked,
    NodeExcluded,
    SlowPhase,
    StragglerDetected,
)
from supervisor.record.schema.processes import (
    AttemptClosed,
    ExitAborted,
    ExitStalled,
    MessagesDropped,
    ProcessesEnded,
    ProcessesLeft,
    RequeueFailed,
    SupervisorError,
    TimeLeftUnknown,
)
from supervisor.record.schema.resumes import (
    ResumeDiverged,
    ResumeUnverified,
    ResumeVerified,
)

__all__ = [
    "EVENTS",
    "AnomalyDetected",
    "AttemptClosed",
    "AttemptStarted",
    "CheckpointCommitted",
    "CheckpointFailed",
    "CheckpointLoaded",
    "CheckpointSkipped",
    "ColdStart",
    "Event",
    "ExitAborted",
    "ExitStalled",
    "FailureDetected",
    "HealthChecked",
    "JobGaveUp",
    "JobStarted",
    "JobStopped",
    "JobSucceeded",
    "Level",
    "MemoryDirRefused",
    "MemorySnapshots",
    "MemoryTierOff",
    "MessagesDropped",
    "NodeExcluded",
    "ProcessesEnded",
    "ProcessesLeft",
    "RequeueFailed",
    "RestartScheduled",
    "ResumeDiverged",
    "ResumeUnverified",
    "ResumeVerified",
    "RolledBack",
    "SlowPhase",
    "SnapshotsSwept",
    "StopRequested",
    "StragglerDetected",
    "SupervisorError",
    "TimeLeftUnknown",
    "describe",
    "to_json",
]


_CLASSES: Final = (
    JobStarted,
    AttemptStarted,
    CheckpointCommitted,
    CheckpointFailed,
    CheckpointSkipped,
    CheckpointLoaded,
    ResumeVerified,
    ResumeDiverged,
    ResumeUnverified,
    ColdStart,
    FailureDetected,
    HealthChecked,
    NodeExcluded,
    AnomalyDetected,
    RolledBack,
    RestartScheduled,
    StopRequested,
    JobSucceeded,
    JobGaveUp,
    JobStopped,
    ExitStalled,
    ExitAborted,
    SlowPhase,
    StragglerDetected,
    ProcessesEnded,
    ProcessesLeft,
    MessagesDropped,
    RequeueFailed,
    TimeLeftUnknown,
    SupervisorError,
    AttemptClosed,
    MemorySnapshots,
    MemoryTierOff,
    MemoryDirRefused,
    SnapshotsSwept,
)
EVENTS: Final[Mapping[str, type[Event]]] = types.MappingProxyType(
    {cls.NAME: cls for cls in _CLASSES}
)
"""Every event, by name, in the order docs/events.md lists them."""


# ---------------------------------------------------------------- writing


def to_json(event: Event) -> dict[str, object]:
    """The event's fields as a line holds them, in declaration order (tuples as lists)."""
    return typed_json.to_json(event)


def describe() -> str:
    """The events as a Markdown table (docs/events.md's summary): name, level, meaning, fields and
    types."""
    lines = ["| event | level | what | fields |", "|---|---|---|---|"]
    for name, cls in EVENTS.items():
        first_paragraph = (cls.__doc__ or "").strip().split("\n\n")[0]
        doc = " ".join(first_paragraph.split()).replace("``", "`")
        specs = ", ".join(f"`{s.name}` ({s.json_type})" for s in typed_json.specs(cls))
        lines.append(f"| `{name}` | {cls.LEVEL} | {doc} | {specs} |")
    return "\n".join(lines)
