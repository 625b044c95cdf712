"""One section of job.toml being read: each key converted (or its default used) and every
problem recorded with its dotted key, so that one pass reports them all (:mod:`.load`)."""

from __future__ import annotations

import json
import shlex
from collections.abc import Callable, Collection, Mapping
from typing import Any, TypeVar

from supervisor.config.model import ConfigIssue
from supervisor.config.render import BARE_KEY
from supervisor.config.values import InvalidValueError, describe, unknown_name

__all__ = ["Table", "shown"]

_T = TypeVar("_T")


def shown(key: str) -> str:
    """A key as TOML would write it: bare, or quoted when it holds other characters (a key with
    a line break must not break the one-line-per-problem report)."""
    return key if BARE_KEY.fullmatch(key) else json.dumps(key)  # ASCII: \u escapes


class Table:
    """One section of job.toml being read; every problem goes to the shared issue list."""

    def __init__(
        self,
        issues: list[ConfigIssue],
        section: str,
        table: Mapping[str, Any],
        keys: Collection[str],
    ) -> None:
        self.section, self.table, self._issues = section, table, issues
        self.failed: set[str] = set()
        for key in table:
            if key not in keys:
                self.report(shown(key), unknown_name("key", key, keys))

    def report(self, key: str, message: str) -> None:
        """Record a problem with ``key`` (relative to this section)."""
        self.failed.add(key)
        self._issues.append(ConfigIssue(f"{self.section}.{key}", message))

    def ok(self, *keys: str) -> bool:
        """True when none of ``keys`` had a problem (cross-key checks need good values)."""
        return self.failed.isdisjoint(keys)

    def read(self, key: str, default: object, convert: Callable[[Any], _T]) -> _T:
        """Convert ``key``'s value (or ``default``); on a problem, report it, use the default."""
        try:
            return convert(self.table.get(key, default))
        except InvalidValueError as exc:
            self.report(key, str(exc))
            return convert(default)

    def strings(self, key: str) -> tuple[str, ...] | None:
        """An array of strings, or one string split like a shell; None after a problem."""
        value = self.table.get(key, [])
        if isinstance(value, str):
            try:
                return tuple(shlex.split(value))
            except ValueError as exc:
                self.report(key, f"cannot split this string like a shell would: {exc}")
                return None
        if not isinstance(value, list):
            self.report(key, f"expected an array of strings, got {describe(value)}")
            return None
        for index, item in enumerate(value):
            if not isinstance(item, str):
                self.report(f"{key}[{index}]", f"expected a string, got {describe(item)}")
            elif "\0" in item:
                self.report(f"{key}[{index}]", "must not contain a NUL character")
        return None if any(k.startswith(f"{key}[") for k in self.failed) else tuple(value)
