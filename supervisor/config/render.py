"""A resolved :class:`JobConfig` back to TOML (what ``rvsup validate`` prints), which
:func:`supervisor.config.load.load_config` reads back unchanged."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Final

from supervisor.config.durations import format_duration
from supervisor.config.model import JobConfig, toml_key

__all__ = ["BARE_KEY", "render_config"]

BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)
"""A TOML key written without quotes."""
_OFF_KEYS: Final = frozenset({"every", "listen", "textfile"})
"""Keys whose None job.toml writes ``"off"`` (the others' is ``"auto"``)."""


def _toml(value: str | int | float | tuple[str, ...] | Mapping[str, str]) -> str:
    """One TOML value (string, boolean, integer, array of strings or inline table of strings)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    pairs = (f"{k if BARE_KEY.fullmatch(k) else _toml(k)} = {_toml(v)}" for k, v in value.items())
    return "{ " + ", ".join(pairs) + " }" if value else "{}"


def render_config(cfg: JobConfig) -> str:
    """The resolved configuration as TOML that :func:`load_config` reads back unchanged."""
    blocks = []
    for section in fields(cfg)[1:]:
        lines = [f"[{section.name}]"]
        values = getattr(cfg, section.name)
        for item in fields(values):
            value = getattr(values, item.name)
            # every float is a duration in seconds
            key = toml_key(item.name)
            if value is None:
                value = "off" if key in _OFF_KEYS else "auto"
            elif isinstance(value, float) and item.name.endswith("_s"):
                value = format_duration(value)
            elif isinstance(value, Path):
                value = str(value)
            lines.append(f"{key} = {_toml(value)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"
