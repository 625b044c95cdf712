"""The base of every event of ``events.jsonl``: :class:`Event` and its :data:`Level`.

Building an event checks and normalises its values (:mod:`supervisor.record.typed_json`); the
package's docstring (:mod:`supervisor.record.schema`) says what an event is. Pure.
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar, Literal, TypeAlias

from supervisor.record import typed_json

__all__ = ["Event", "Level"]

Level: TypeAlias = Literal["info", "warning", "error"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """The base of every event; not an event itself."""

    NAME: ClassVar[str]
    """The ``event`` of the line."""
    LEVEL: ClassVar[Level]
    """The ``level`` of the line."""
    DIGITS: ClassVar[Mapping[str, int]] = types.MappingProxyType({})
    """Float fields rounded when written, to this many decimal places."""

    def __post_init__(self) -> None:
        """Check every value against its field's type and normalise it (module docstring)."""
        for name, value in typed_json.normalised(self, self.DIGITS).items():
            object.__setattr__(self, name, value)
