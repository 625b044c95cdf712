"""Frozen dataclasses whose fields are JSON values: checked when built, read back tolerantly.

The field types this understands are the ones the history's events use (:mod:`.schema`):
``int``, ``float``, ``str``, ``bool``, ``tuple[T, ...]`` (a JSON list), ``Mapping[str, T]`` (a
JSON object) and ``T | None``. For each field, :func:`specs` derives from its type how a value
is read, what a reader assumes when the value is missing or invalid, and its JSON type's name:

- reading: an ``int`` also takes a string of digits, a ``str`` also a number; a bool is never
  a number; a list or map must hold valid items;
- missing or invalid: None for an optional field; ``""``, ``False``, ``()`` or ``{}`` for a
  string, flag, list or map; an ``int`` or ``float`` that is not optional is *required*.

Pure: no I/O.
"""

from __future__ import annotations

import types
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from typing import Any, Final, TypeAlias, Union, get_args, get_origin, get_type_hints

__all__ = ["INVALID", "FieldSpec", "normalised", "read_fields", "read_int", "specs", "to_json"]

INVALID: Final = object()
"""What a field's reader returns for a value it cannot take."""

_Read: TypeAlias = Callable[[object], object]  # a value, or INVALID


@dataclass(frozen=True, slots=True)
class FieldSpec:
    """How one field is read and described."""

    name: str
    read: _Read
    empty: Callable[[], object] | None
    """Makes the value a reader assumes when it is missing or invalid; None: required."""
    json_type: str
    """E.g. ``"int"``, ``"list of string"``, ``"float or null"``."""


def read_int(value: object) -> object:
    """An int, or a string of one, as an int; else :data:`INVALID`."""
    if isinstance(value, bool):
        return INVALID
    if isinstance(value, int):
        return value
    if isinstance(value, str):
        try:
            return int(value)
        except ValueError:
            return INVALID
    return INVALID


def _read_float(value: object) -> object:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return INVALID
    return float(value)


def _read_str(value: object) -> object:
    if isinstance(value, str):
        return str.__str__(value)  # a plain str, also for an enum member
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return INVALID


def _read_bool(value: object) -> object:
    return value if isinstance(value, bool) else INVALID


def _optional(read: _Read) -> _Read:
    return lambda value: None if value is None else read(value)


def _tuple_of(read: _Read) -> _Read:
    def read_all(value: object) -> object:
        if not isinstance(value, (list, tuple)):
            return INVALID
        items = tuple(read(item) for item in value)
        return INVALID if any(item is INVALID for item in items) else items

    return read_all


def _map_of(read: _Read) -> _Read:
    def read_all(value: object) -> object:
        if not isinstance(value, Mapping):
            return INVALID
        items = {key: read(item) for key, item in value.items()}
        bad = any(not isinstance(k, str) or v is INVALID for k, v in items.items())
        return INVALID if bad else items

    return read_all


_SCALARS: Final[Mapping[object, tuple[_Read, Callable[[], object] | None, str]]] = {
    int: (read_int, None, "int"),
    float: (_read_float, None, "float"),
    str: (_read_str, str, "string"),
    bool: (_read_bool, bool, "bool"),
}


def _spec(name: str, hint: Any) -> FieldSpec:
    origin, args = get_origin(hint), get_args(hint)
    if origin in (Union, types.UnionType) and type(None) in args:
        (inner,) = (a for a in args if a is not type(None))
        base = _spec(name, inner)
        return FieldSpec(name, _optional(base.read), lambda: None, f"{base.json_type} or null")
    if hint in _SCALARS:
        read, empty, json_type = _SCALARS[hint]
        return FieldSpec(name, read, empty, json_type)
    if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
        item = _spec(name, args[0])
        return FieldSpec(name, _tuple_of(item.read), tuple, f"list of {item.json_type}")
    if origin is Mapping and args[0] is str:
        item = _spec(name, args[1])
        return FieldSpec(name, _map_of(item.read), dict, f"map of {item.json_type}")
    raise TypeError(f"{name}: no JSON reading for {hint!r}")


_SPECS: dict[type, tuple[FieldSpec, ...]] = {}  # a memo: a class's fields never change


def specs(cls: type) -> tuple[FieldSpec, ...]:
    """The specs of a dataclass's fields, in declaration order."""
    found = _SPECS.get(cls)
    if found is None:
        hints = get_type_hints(cls)
        found = _SPECS[cls] = tuple(_spec(f.name, hints[f.name]) for f in fields(cls))
    return found


def normalised(obj: object, digits: Mapping[str, int]) -> dict[str, object]:
    """``obj``'s field values as its types want them (lists as tuples, ``str`` subclasses as
    ``str``, the floats named in ``digits`` rounded); a value of the wrong type is a TypeError."""
    out: dict[str, object] = {}
    for spec in specs(type(obj)):
        value = spec.read(getattr(obj, spec.name))
        if value is INVALID:
            raise TypeError(f"{type(obj).__name__}.{spec.name}: {getattr(obj, spec.name)!r}")
        if isinstance(value, float) and spec.name in digits:
            value = round(value, digits[spec.name])
        out[spec.name] = value
    return out


def read_fields(cls: type, obj: Mapping[str, Any]) -> dict[str, object] | None:
    """The values of ``cls``'s fields in ``obj`` (missing or invalid ones empty), or None when a
    required one is missing or invalid."""
    values: dict[str, object] = {}
    for spec in specs(cls):
        value = spec.read(obj[spec.name]) if spec.name in obj else INVALID
        if value is INVALID:
            if spec.empty is None:
                return None
            value = spec.empty()
        values[spec.name] = value
    return values


def to_json(obj: object) -> dict[str, object]:
    """``obj``'s fields in declaration order, tuples as lists and maps as dicts."""
    return {spec.name: _plain(getattr(obj, spec.name)) for spec in specs(type(obj))}


def _plain(value: object) -> object:
    """``value`` with every tuple a list and every map a dict, however deep."""
    if isinstance(value, tuple):
        return [_plain(item) for item in value]
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    return value
