"""The lines of ``events.jsonl`` read back into the events of :mod:`.schema`.

Any line any version of rvsup wrote is taken: :func:`parse` gives its event (or None), and
:func:`parse_all` gives every line's :class:`Entry` with the number of lines it skipped, as
invalid (no event name, or a required field missing) or as unknown (an event a newer rvsup
wrote). The field rules are :mod:`.typed_json`'s.

Pure: no I/O and no clock (the rules import it).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final

from supervisor.record import typed_json
from supervisor.record.schema import EVENTS, Event

__all__ = ["Entry", "Parsed", "parse", "parse_all", "parse_entry"]


@dataclass(frozen=True, slots=True)
class Entry:
    """One line of ``events.jsonl`` read back: its common fields and its event."""

    timestamp: str | None
    """As written (ISO-8601 UTC); None if missing or not a string."""
    attempt: int | None
    """The attempt it belongs to (0: before the first); None if missing or not a number."""
    job: str | None
    """The job's name."""
    event: Event


@dataclass(frozen=True, slots=True)
class Parsed:
    """The events of many lines, and how many were skipped."""

    entries: tuple[Entry, ...]
    invalid: int
    """Lines without an event name or without a valid value for a required field."""
    unknown: int
    """Lines naming an event this version does not know (a newer rvsup wrote them)."""


_UNKNOWN: Final = "unknown"  # _parse's answer for an event name it does not know


def _parse(obj: Mapping[str, Any]) -> Event | str | None:
    name = obj.get("event")
    if not isinstance(name, str):
        return None
    cls = EVENTS.get(name)
    if cls is None:
        return _UNKNOWN
    values = typed_json.read_fields(cls, obj)
    return None if values is None else cls(**values)


def parse(obj: Mapping[str, Any]) -> Event | None:
    """The event of one line, or None: an unknown name, or a required field missing/invalid."""
    event = _parse(obj)
    return event if isinstance(event, Event) else None


def parse_entry(obj: Mapping[str, Any]) -> Entry | None:
    """The line with its common fields, or None when :func:`parse` gives None."""
    event = parse(obj)
    return None if event is None else _entry(obj, event)


def parse_all(objs: Iterable[Mapping[str, Any]]) -> Parsed:
    """Every line's entry, in order, with the number of invalid and unknown lines skipped."""
    entries: list[Entry] = []
    invalid = unknown = 0
    for obj in objs:
        event = _parse(obj)
        if isinstance(event, Event):
            entries.append(_entry(obj, event))
        elif event is None:
            invalid += 1
        else:
            unknown += 1
    return Parsed(tuple(entries), invalid, unknown)


def _entry(obj: Mapping[str, Any], event: Event) -> Entry:
    timestamp, job = obj.get("timestamp"), obj.get("job")
    attempt = typed_json.read_int(obj.get("attempt"))
    return Entry(
        timestamp=timestamp if isinstance(timestamp, str) else None,
        attempt=attempt if isinstance(attempt, int) else None,
        job=job if isinstance(job, str) else None,
        event=event,
    )
