"""Converters for single job.toml values, and the wording of the messages about them.

Each converter takes the raw TOML value and returns the typed one, or raises
:class:`InvalidValueError` whose message says what is wrong (``expected an integer, got
string '5'``); :mod:`supervisor.config` attaches the dotted key.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from supervisor.config.durations import EXPECTED_DURATION, format_duration, parse_duration

__all__ = [
    "InvalidValueError",
    "auto_count",
    "boolean",
    "choice",
    "describe",
    "duration",
    "duration_or",
    "integer",
    "job_name",
    "owned_flag_reason",
    "path_text",
    "positive_number",
    "unknown_name",
]

_JOB_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", re.ASCII)
# torchrun flags (dashes for underscores) rvsup passes itself; "rdzv-" covers every rdzv flag.
_RENDEZVOUS: Final = "rvsup sets up the rendezvous of every attempt"
_OWNED_FLAGS: Final[dict[str, str]] = {
    "nnodes": "rvsup sets it from launch.nnodes",
    "nproc-per-node": "rvsup sets it from launch.nproc_per_node",
    "max-restarts": "rvsup does the restarts itself (see [restart])",
    "rdzv-": _RENDEZVOUS,
    "standalone": _RENDEZVOUS,
    "master-addr": _RENDEZVOUS,
    "master-port": _RENDEZVOUS,
    "node-rank": "rvsup assigns the node ranks",
    "no-python": "rvsup derives it from job.command",
}


class InvalidValueError(ValueError):
    """Raised by a converter; the message says what is wrong with the value."""


def describe(value: object) -> str:
    """Name a TOML value for a message: "string '5'", "boolean true", "an array"."""
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, int | float):
        text = repr(value)
        return f"{'integer' if isinstance(value, int) else 'float'} {text}"
    if isinstance(value, str):
        text = repr(value)
        return f"string {text if len(text) <= 60 else text[:56] + '...' + text[0]}"
    if isinstance(value, Mapping):
        return "a table"
    if isinstance(value, list | tuple):
        return "an array"
    return f"{type(value).__name__} {value}"


def unknown_name(what: str, name: str, valid: Iterable[str]) -> str:
    """Message for an unknown section or key, with the valid ones and a close match."""
    choices = sorted(valid)
    message = f"unknown {what}; valid {what}s: {', '.join(choices)}"
    close = difflib.get_close_matches(name, choices, n=1)
    return f"{message}; did you mean {close[0]!r}?" if close else message


def integer(minimum: int) -> Callable[[Any], int]:
    """An integer (not a boolean) of at least ``minimum``."""

    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise InvalidValueError(f"expected an integer, got {describe(value)}")
        if value < minimum:
            raise InvalidValueError(f"must be at least {minimum}, got {value}")
        return value

    return convert


def positive_number(value: Any) -> float:
    """A number (integer or float, not a boolean) above 0."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidValueError(f"expected a number, got {describe(value)}")
    if not value > 0 or value == float("inf"):
        raise InvalidValueError(f"must be a finite number above 0, got {value}")
    return float(value)


def auto_count(value: Any) -> int | None:
    """``"auto"`` (None) or a count of at least 1."""
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidValueError(f'expected "auto" or an integer, got {describe(value)}')
    if value < 1:
        raise InvalidValueError(f"must be at least 1, got {value}")
    return value


def duration(*, positive: bool = False, maximum: float | None = None) -> Callable[[Any], float]:
    """A duration in seconds (>= 0; > 0 with ``positive``; at most ``maximum`` if given)."""

    def convert(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise InvalidValueError(f"{EXPECTED_DURATION}, got {describe(value)}")
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise InvalidValueError(str(exc)) from exc
        if positive and seconds <= 0:
            raise InvalidValueError("must be greater than 0")
        if maximum is not None and seconds > maximum:
            limit, got = format_duration(maximum), format_duration(seconds)
            raise InvalidValueError(f"must be at most {limit}, got {got}")
        return seconds

    return convert


def duration_or(
    word: str, *, off: bool = False, positive: bool = False
) -> Callable[[Any], float | None]:
    """A duration, or ``word`` meaning None; with ``off``, also ``false`` and 0 mean None."""
    durations = duration(positive=positive)

    def convert(value: Any) -> float | None:
        if value == word or (off and value is False):
            return None
        try:
            seconds = durations(value)
        except InvalidValueError as exc:
            either = f'expected "{word}" or a duration'
            raise InvalidValueError(str(exc).replace("expected a duration", either, 1)) from exc
        return None if off and seconds == 0 else seconds

    return convert


_SIZE = re.compile(r"(\d+(?:\.\d+)?)\s*([KMGT]?)(i?)B?", re.ASCII | re.IGNORECASE)
_SIZE_POWERS: Final = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4}
EXPECTED_SIZE: Final = 'expected a size: bytes, or a string like "512M", "10GiB"'


def size(value: Any) -> int:
    """A size in bytes: an integer >= 0, or a string like ``"512M"``, ``"10GiB"``, ``"1.5T"``
    (K, M, G, T are powers of 1024 with or without ``i``, as ``df -h`` and Slurm mean them)."""
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise InvalidValueError(f"{EXPECTED_SIZE}, got {describe(value)}")
    if isinstance(value, int):
        if value < 0:
            raise InvalidValueError(f"must be at least 0, got {value}")
        return value
    match = _SIZE.fullmatch(value.strip())
    if match is None:
        raise InvalidValueError(f"{EXPECTED_SIZE}, got {describe(value)}")
    number, unit = float(match.group(1)), match.group(2).upper()
    return int(number * 1024 ** _SIZE_POWERS[unit])


def size_or_auto(value: Any) -> int | None:
    """``"auto"`` (None) or a :func:`size`."""
    if value == "auto":
        return None
    try:
        return size(value)
    except InvalidValueError as exc:
        raise InvalidValueError(
            str(exc).replace("expected a size", 'expected "auto" or a size', 1)
        ) from exc


def count_or_auto(value: Any) -> int | None:
    """``"auto"`` (None) or an integer >= 0."""
    if value == "auto":
        return None
    try:
        return integer(0)(value)
    except InvalidValueError as exc:
        either = 'expected "auto" or an integer'
        raise InvalidValueError(str(exc).replace("expected an integer", either, 1)) from exc


def boolean(value: Any) -> bool:
    """TOML true or false (not a string or a number)."""
    if not isinstance(value, bool):
        raise InvalidValueError(f"expected true or false, got {describe(value)}")
    return value


def choice(*choices: str, booleans: tuple[str, str] | None = None) -> Callable[[Any], str]:
    """One of ``choices``; ``booleans`` maps TOML true and false to two of them."""

    def convert(value: Any) -> str:
        if booleans is not None and isinstance(value, bool):
            return booleans[0] if value else booleans[1]
        if isinstance(value, str) and value in choices:
            return value
        listed = ", ".join(f'"{option}"' for option in choices)
        text = value.lower() if isinstance(value, str) else ""
        close = difflib.get_close_matches(text, choices, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise InvalidValueError(f"expected one of {listed}, got {describe(value)}{hint}")

    return convert


def job_name(value: Any) -> str:
    """A job name: 1 to 64 of ``A-Z a-z 0-9 _ . -``, not starting with ``.`` or ``-``."""
    if not isinstance(value, str):
        raise InvalidValueError(f"expected a string, got {describe(value)}")
    if not _JOB_NAME.fullmatch(value):
        raise InvalidValueError(
            "must be 1 to 64 characters of A-Z a-z 0-9 _ . - not starting with . or -, "
            f"got {value!r}"
        )
    return value


def path_text(value: Any) -> str:
    """A non-empty path string without NUL characters (resolved later)."""
    if not isinstance(value, str):
        raise InvalidValueError(f"expected a string (a path), got {describe(value)}")
    if not value or "\0" in value:
        raise InvalidValueError("must be a non-empty path without NUL characters")
    return value


def owned_flag_reason(arg: str) -> str | None:
    """Why rvsup owns the torchrun flag ``arg`` (argparse abbreviations included), or None."""
    if not arg.startswith("--"):
        return None
    name = arg[2:].split("=", 1)[0].replace("_", "-")
    for flag, reason in _OWNED_FLAGS.items():
        exact = name.startswith(flag) if flag.endswith("-") else name == flag
        if exact or (len(name) >= 3 and flag.startswith(name)):
            return reason
    return None
