"""job.toml -> a frozen, validated :class:`JobConfig` (and back to TOML: :mod:`.render`).

Every problem is collected in one pass and reported with its dotted key
(``restart.backoff``, ``job.command[1]``); unknown sections and keys are rejected with the
list of valid ones. The schema (the section dataclasses, which document every key) lives in
:mod:`supervisor.config.model`, each section's reader in :mod:`supervisor.config.sections`, the
reading of one section (its keys, its problems) in :mod:`supervisor.config.table`, the
converters of single values in :mod:`supervisor.config.values`, and :func:`preflight`, which
checks the machine (programs, directories) just before a start, in
:mod:`supervisor.config.preflight`, and :func:`render_config` in :mod:`supervisor.config.render`;
this module re-exports them.
Durations are seconds or strings like "90s", "5m", "1h30m" (see :mod:`supervisor.config.durations`).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, Final

from supervisor.config import sections
from supervisor.config.metrics import MetricsSection, read_metrics
from supervisor.config.model import (
    AnomalySection,
    CheckpointSection,
    ConfigError,
    ConfigIssue,
    FrozenEnv,
    HealthSection,
    HeartbeatSection,
    JobConfig,
    JobSection,
    LaunchSection,
    RestartSection,
    SlurmSection,
    toml_key,
)
from supervisor.config.preflight import CHECKPOINT_MARKER, preflight
from supervisor.config.render import render_config
from supervisor.config.table import Table, shown
from supervisor.config.values import describe, unknown_name

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

__all__ = [
    "CHECKPOINT_MARKER",
    "CheckpointSection",
    "ConfigError",
    "ConfigIssue",
    "FrozenEnv",
    "HealthSection",
    "HeartbeatSection",
    "JobConfig",
    "JobSection",
    "LaunchSection",
    "RestartSection",
    "SlurmSection",
    "load_config",
    "parse_config",
    "preflight",
    "render_config",
]

_SECTIONS: Final[dict[str, type]] = {
    "job": JobSection,
    "launch": LaunchSection,
    "checkpoint": CheckpointSection,
    "heartbeat": HeartbeatSection,
    "restart": RestartSection,
    "slurm": SlurmSection,
    "anomaly": AnomalySection,
    "health": HealthSection,
    "metrics": MetricsSection,
}
# The TOML keys of each section: its field names, less the "_s" (seconds) suffix.
_SECTION_KEYS: Final = {
    name: tuple(toml_key(item.name) for item in fields(cls)) for name, cls in _SECTIONS.items()
}


def _table(issues: list[ConfigIssue], tables: Mapping[str, Mapping[str, Any]], name: str) -> Table:
    """Section ``name`` to read; its unknown keys are reported at once."""
    return Table(issues, name, tables[name], _SECTION_KEYS[name])


def parse_config(data: Mapping[str, Any], path: Path) -> JobConfig:
    """Validate already-parsed job.toml ``data``; ``path`` is where it came from.

    Raises :class:`ConfigError` listing every problem found.
    """
    issues: list[ConfigIssue] = []
    tables: dict[str, Mapping[str, Any]] = {key: {} for key in _SECTION_KEYS}
    for section, value in data.items():
        if section not in _SECTION_KEYS:
            message = unknown_name("section", shown(section), _SECTION_KEYS)
            issues.append(ConfigIssue(shown(section), message))
        elif not isinstance(value, Mapping):
            issues.append(ConfigIssue(section, f"expected a table, got {describe(value)}"))
        else:
            tables[section] = value
    absolute = Path(os.path.abspath(path))
    job = sections.read_job(_table(issues, tables, "job"), absolute.parent)
    launch = sections.read_launch(_table(issues, tables, "launch"), absolute.parent)
    checkpoint = sections.read_checkpoint(_table(issues, tables, "checkpoint"))
    heartbeat = sections.read_heartbeat(_table(issues, tables, "heartbeat"))
    restart = sections.read_restart(_table(issues, tables, "restart"))
    slurm = sections.read_slurm(_table(issues, tables, "slurm"))
    anomaly = sections.read_anomaly(_table(issues, tables, "anomaly"))
    health = sections.read_health(_table(issues, tables, "health"))
    metrics = read_metrics(_table(issues, tables, "metrics"), job.workdir)
    if issues:
        raise ConfigError(issues, path)
    return JobConfig(
        absolute, job, launch, checkpoint, heartbeat, restart, slurm, anomaly, health, metrics
    )


def load_config(path: str | os.PathLike[str]) -> JobConfig:
    """Read and validate job.toml; raises :class:`ConfigError` for any problem, file ones too."""
    try:
        with open(path, "rb") as file:
            data = tomllib.load(file)
    except OSError as exc:
        raise ConfigError([ConfigIssue("", f"cannot read: {exc.strerror or exc}")], path) from exc
    except tomllib.TOMLDecodeError as exc:
        text = " ".join(str(exc).split())
        raise ConfigError([ConfigIssue("", f"invalid TOML: {text}")], path) from exc
    except UnicodeDecodeError as exc:
        message = f"invalid TOML: not UTF-8 text (byte {exc.start})"
        raise ConfigError([ConfigIssue("", message)], path) from exc
    return parse_config(data, Path(path))
