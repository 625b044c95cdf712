"""``events.jsonl`` read back into schema entries (:func:`read`), counting the lines it skipped;
the history's timestamps (:func:`parse_timestamp`, :func:`format_timestamp`).

:mod:`supervisor.record.history` folds what this reads into one row per attempt, and re-exports it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from supervisor.record.entries import Entry, parse_all
from supervisor.record.schema import Event

__all__ = ["History", "format_timestamp", "parse_timestamp", "read"]


@dataclass(frozen=True, slots=True)
class History:
    """``events.jsonl`` read back: its events, and what was skipped."""

    entries: tuple[Entry, ...]
    unreadable: int
    """Lines that are not JSON objects (a torn last line, a write in progress, is not counted)."""
    invalid: int
    """Lines of a known event without a valid value for a required field, or without a name."""
    unknown: int
    """Lines of events this version does not know (a newer rvsup wrote them)."""

    @property
    def events(self) -> tuple[Event, ...]:
        """The events alone, in order (what :func:`supervisor.rules.budget.budget_of` folds)."""
        return tuple(entry.event for entry in self.entries)

    @property
    def skipped(self) -> int:
        """Lines that could not be read: unreadable or invalid (unknown events are not)."""
        return self.unreadable + self.invalid


def read(path: Path) -> History:
    """The history in ``path``; a missing file is an empty history."""
    objects, unreadable = _read_objects(path)
    parsed = parse_all(objects)
    return History(parsed.entries, unreadable, parsed.invalid, parsed.unknown)


def _read_objects(path: Path) -> tuple[list[dict[str, Any]], int]:
    """The JSON objects of ``path``, and the number of lines that are not JSON objects.

    Blank lines are ignored. A last line without a newline that does not parse is a write
    in progress (or torn by a crash): it is skipped without being counted.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return [], 0
    lines = data.split(b"\n")
    torn_tail = not data.endswith(b"\n")
    objects: list[dict[str, Any]] = []
    skipped = 0
    for index, raw in enumerate(lines):
        if not raw.strip():
            continue
        try:
            value = json.loads(raw)
        except ValueError:  # includes UnicodeDecodeError
            value = None
        if isinstance(value, dict):
            objects.append(value)
        elif not (torn_tail and index == len(lines) - 1):
            skipped += 1
    return objects, skipped


def parse_timestamp(value: object) -> datetime | None:
    """An aware UTC datetime from an ISO-8601 string (a naive one is taken as UTC), else None."""
    if not isinstance(value, str):
        return None
    text = value[:-1] + "+00:00" if value.endswith(("Z", "z")) else value
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.tzinfo is None:
        return parsed.replace(tzinfo=timezone.utc)
    return parsed.astimezone(timezone.utc)


def format_timestamp(value: datetime) -> str:
    """The history's own format: ``"2026-11-22T19:03:01.123456Z"``."""
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
