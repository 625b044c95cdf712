"""Durations as people write them in job.toml ("90s", "5m", "1h30m") and back.

A duration is either a number of seconds (an int or a float, not a bool) or a string of one
or more ``<number><unit>`` parts with units in decreasing order: ``d`` (days), ``h``, ``m``,
``s`` and ``ms``; a plain number string ("0", "1.5") is seconds. Parsing is exact (rational
arithmetic), so :func:`format_duration` output always parses back to the same float.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal
from fractions import Fraction
from typing import Final

__all__ = ["EXPECTED_DURATION", "format_duration", "parse_duration"]

#: The start of the message for a value that is not a duration at all.
EXPECTED_DURATION: Final = "expected a duration like 90s, 5m, 2h or a number of seconds"
_UNIT_SECONDS: Final[dict[str, Fraction]] = {
    "d": Fraction(86400),
    "h": Fraction(3600),
    "m": Fraction(60),
    "s": Fraction(1),
    "ms": Fraction(1, 1000),
}
_UNIT_ORDER: Final = ("d", "h", "m", "s", "ms")
_NUMBER: Final = r"(?:\d+(?:\.\d+)?|\.\d+)"
_PLAIN_SECONDS: Final = re.compile(_NUMBER, re.ASCII)
# "ms" before "m": "5ms" is five milliseconds, not five minutes followed by a stray "s".
_PART: Final = re.compile(rf"\s*({_NUMBER})\s*(ms|d|h|m|s)", re.ASCII)


def parse_duration(value: object) -> float:
    """Return ``value`` in seconds; raise :class:`ValueError` saying what is wrong with it.

    Accepts a non-negative finite int or float, or a string such as "90s", "5m", "2h",
    "1h30m", "500ms", "1.5s", "2d" or "0".
    """
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"{EXPECTED_DURATION}, got {type(value).__name__} {value!r}")
    if isinstance(value, str):
        return _parse_text(value)
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"must be a finite number of seconds, got {value!r}")
    if value < 0:
        raise ValueError("must not be negative")
    try:
        return float(value)
    except OverflowError:
        raise ValueError("is too large") from None


def _parse_text(text: str) -> float:
    """Parse the string form of a duration."""
    stripped = text.strip()
    negative = stripped.startswith("-")
    magnitude = _parse_magnitude(stripped[1:] if negative else stripped, text)
    if negative and magnitude:
        raise ValueError("must not be negative")
    return _to_float(magnitude, text)


def _parse_magnitude(body: str, text: str) -> Fraction:
    """Exact seconds of an unsigned duration string; ``text`` is what the user wrote."""
    if _PLAIN_SECONDS.fullmatch(body):
        return Fraction(body)
    total = Fraction(0)
    position = 0
    previous_rank = -1
    while position < len(body):
        part = _PART.match(body, position)
        if part is None:
            break
        rank = _UNIT_ORDER.index(part.group(2))
        if rank <= previous_rank:
            raise ValueError(f"units must appear once each, largest first (1h30m), got {text!r}")
        total += Fraction(part.group(1)) * _UNIT_SECONDS[part.group(2)]
        previous_rank = rank
        position = part.end()
    if previous_rank < 0 or position < len(body):
        raise ValueError(f"{EXPECTED_DURATION}, got {text!r}")
    return total


def _to_float(seconds: Fraction, text: str) -> float:
    """Round an exact number of seconds to the nearest float; refuse what does not fit."""
    try:
        result = float(seconds)
    except OverflowError:
        raise ValueError(f"is too large, got {text!r}") from None
    if not math.isfinite(result):
        raise ValueError(f"is too large, got {text!r}")
    return result


def format_duration(seconds: float) -> str:
    """Format seconds for people: 5400 -> "1h30m", 90 -> "1m30s", 0.5 -> "0.5s", 0 -> "0s".

    The result parses back (:func:`parse_duration`) to exactly ``seconds`` when it is a
    finite, non-negative number.
    """
    if not math.isfinite(seconds):
        return str(seconds)
    if seconds < 0:
        return "-" + format_duration(-seconds)
    # The shortest decimal that rounds to this float, split without any rounding.
    exact = Decimal(repr(float(seconds)))
    whole = int(exact)
    minutes_total, whole_seconds = divmod(whole, 60)
    hours_total, minutes = divmod(minutes_total, 60)
    days, hours = divmod(hours_total, 24)
    parts = [
        f"{count}{unit}" for count, unit in ((days, "d"), (hours, "h"), (minutes, "m")) if count
    ]
    seconds_part = whole_seconds + (exact - whole)
    if seconds_part or not parts:
        text = format(seconds_part.normalize(), "f") if seconds_part else "0"
        parts.append(f"{text}s")
    return "".join(parts)
