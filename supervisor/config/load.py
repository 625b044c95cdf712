"""job.toml -> a frozen, validated :class:`JobConfig` (and back to TOML: :mod:`.render`).

Every problem is collected in one pass and reported with its dotted key
(``restart.backoff``, ``job.command[1]``); unknown sections and keys are rejected with the
list of valid ones. The schema (the section dataclasses, which document every key) lives in
:mod:`supervisor.config.model`, the converters of single values in
:mod:`supervisor.config.values`, and :func:`preflight`, which checks the machine (programs,
directories) just before a start, in :mod:`supervisor.config.preflight`, and
:func:`render_config` in :mod:`supervisor.config.render`; this module re-exports them.
Durations are seconds or strings like "90s", "5m", "1h30m" (see :mod:`supervisor.config.durations`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from collections.abc import Callable, Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any, Final, TypeVar, cast, get_args

from supervisor.config.durations import format_duration
from supervisor.config.metrics import read_metrics
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
    MetricsSection,
    RequeueMode,
    RestartSection,
    SlurmSection,
    Transport,
    toml_key,
)
from supervisor.config.preflight import CHECKPOINT_MARKER, preflight
from supervisor.config.render import BARE_KEY, render_config
from supervisor.config.values import (
    InvalidValueError,
    auto_count,
    boolean,
    choice,
    count_or_auto,
    describe,
    duration,
    duration_or,
    integer,
    job_name,
    owned_flag_reason,
    path_text,
    positive_number,
    size,
    size_or_auto,
    unknown_name,
)
from supervisor.rules.policy import OnFailure

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

_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_T = TypeVar("_T")

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


def _shown(key: str) -> str:
    """A key as TOML would write it: bare, or quoted when it holds other characters (a key with
    a line break must not break the one-line-per-problem report)."""
    return key if BARE_KEY.fullmatch(key) else json.dumps(key)  # ASCII: \u escapes


class _Table:
    """One section of job.toml being read; every problem goes to the shared issue list."""

    def __init__(self, issues: list[ConfigIssue], section: str, table: Mapping[str, Any]) -> None:
        self.section, self.table, self._issues = section, table, issues
        self.failed: set[str] = set()
        for key in table:
            if key not in _SECTION_KEYS[section]:
                self.report(_shown(key), unknown_name("key", key, _SECTION_KEYS[section]))

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


def _resolve(base: Path, text: str) -> Path:
    """``text`` with ``~`` expanded, made absolute against ``base``."""
    return Path(os.path.abspath(os.path.join(base, os.path.expanduser(text))))


def _read_job(t: _Table, base: Path) -> JobSection:
    for key in ("name", "command"):
        if key not in t.table:
            t.report(key, "required")
    name = t.read("name", "job", job_name)
    command = t.strings("command") if "command" in t.table else None
    if command == ():
        t.report("command", "must not be empty")
    elif command and not command[0]:
        t.report("command[0]", "must not be empty")
    workdir = _resolve(base, t.read("workdir", ".", path_text))
    run_dir = _resolve(workdir, t.read("run_dir", f"runs/{name}", path_text))
    checkpoint_dir = _resolve(workdir, t.read("checkpoint_dir", f"checkpoints/{name}", path_text))
    if t.ok("run_dir", "checkpoint_dir") and run_dir.is_relative_to(checkpoint_dir):
        t.report("run_dir", "must be outside job.checkpoint_dir, which holds only checkpoints")
    raw_env = t.table.get("env", {})
    env: dict[str, str] = {}
    if not isinstance(raw_env, Mapping):
        t.report("env", f"expected a table, got {describe(raw_env)}")
        raw_env = {}
    for var, value in raw_env.items():
        if not _ENV_NAME.fullmatch(var):
            t.report(
                f"env.{var}", "not a valid variable name (letters, digits, _; no leading digit)"
            )
        elif var.startswith("RVSUP_"):
            t.report(f"env.{var}", "RVSUP_* variables are set by rvsup")
        elif not isinstance(value, str) or "\0" in value:
            t.report(f"env.{var}", f"expected a string (in quotes), got {describe(value)}")
        else:
            env[var] = value
    return JobSection(name, command or (), workdir, run_dir, checkpoint_dir, FrozenEnv(env))


def _read_torchrun(t: _Table, base: Path) -> tuple[str, ...] | None:
    """``launch.torchrun``: "auto" (None), a path or name, or a command line; its program, when
    a path, made absolute against ``base`` (job.toml's folder)."""
    value = t.table.get("torchrun", "auto")
    if value == "auto":
        return None
    if isinstance(value, str):
        argv: tuple[str, ...] | None = (value,)
        if not value or "\0" in value:
            t.report("torchrun", "must be a non-empty path without NUL characters")
            return None
    elif isinstance(value, list):
        argv = t.strings("torchrun")
        if argv == ():
            t.report("torchrun", "must not be empty")
    else:
        expected = '"auto", a path to torchrun or an array of strings (its command line)'
        t.report("torchrun", f"expected {expected}, got {describe(value)}")
        return None
    if not argv:
        return None
    if not argv[0]:
        t.report("torchrun[0]", "must not be empty")
        return None
    program = argv[0]
    if os.sep in program or program.startswith("~"):
        program = str(_resolve(base, program))
    return (program, *argv[1:])


def _read_launch(t: _Table, base: Path) -> LaunchSection:
    nproc_per_node = t.read("nproc_per_node", "auto", auto_count)
    nnodes = t.read("nnodes", "auto", auto_count)
    args = t.strings("torchrun_args") or ()
    for index, arg in enumerate(args):
        reason = owned_flag_reason(arg)
        if reason is not None:
            t.report(f"torchrun_args[{index}]", f"{arg!r} is not allowed: {reason}")
    term_timeout = t.read("term_timeout", "5s", duration())
    stop_timeout = t.read("stop_timeout", "60s", duration(positive=True))
    warm_standby = t.read("warm_standby", True, boolean)
    torchrun = _read_torchrun(t, base)
    min_nnodes = t.read("min_nnodes", "auto", auto_count)
    zygote = t.read("zygote", True, boolean)
    preload = t.strings("preload") or ()
    for index, module in enumerate(preload):
        if not all(part.isidentifier() for part in module.split(".")):
            t.report(f"preload[{index}]", f"{module!r} is not a module name (a.b.c)")
    if (
        min_nnodes is not None
        and nnodes is not None
        and min_nnodes > nnodes
        and t.ok("nnodes", "min_nnodes")
    ):
        t.report("min_nnodes", f"must be at most launch.nnodes ({nnodes}), got {min_nnodes}")
    return LaunchSection(
        nproc_per_node,
        nnodes,
        args,
        term_timeout,
        stop_timeout,
        warm_standby,
        torchrun,
        min_nnodes,
        zygote,
        preload,
    )


def _read_checkpoint(t: _Table) -> CheckpointSection:
    return CheckpointSection(
        every_steps=t.read("every_steps", 500, integer(0)),
        every_s=t.read("every", "30m", duration_or("off", off=True)),
        keep_last=t.read("keep_last", 3, integer(1)),
        async_save=t.read("async", False, boolean),
        memory_every_steps=t.read("memory_every_steps", "off", _steps_auto_or_off),
        memory_dir=t.read("memory_dir", "/dev/shm", path_text),
    )


def _steps_auto_or_off(value: Any) -> int | None:
    """``"auto"`` (None), ``"off"`` (0) or a number of steps >= 0 (0: off)."""
    if value == "off":
        return 0
    try:
        return count_or_auto(value)
    except InvalidValueError as exc:
        raise InvalidValueError(str(exc).replace('"auto"', '"auto", "off"', 1)) from exc


def _read_heartbeat(t: _Table) -> HeartbeatSection:
    interval = t.read("interval", "1s", duration(positive=True, maximum=60.0))
    startup_timeout = t.read("startup_timeout", "10m", duration(positive=True))
    hang = t.read("hang_timeout", "auto", duration_or("auto", positive=True))
    hang_max = t.read("hang_timeout_max", "30m", duration(positive=True))
    transport = cast(Transport, t.read("transport", "auto", choice(*get_args(Transport))))
    native_stacks = t.read("native_stacks", True, boolean)
    if hang is not None and hang <= interval and t.ok("interval", "hang_timeout"):
        longer = f"must be longer than heartbeat.interval ({format_duration(interval)})"
        t.report("hang_timeout", longer)
    if hang_max <= interval and t.ok("interval", "hang_timeout_max"):
        longer = f"must be longer than heartbeat.interval ({format_duration(interval)})"
        t.report("hang_timeout_max", longer)
    elif hang is not None and hang_max < hang and t.ok("hang_timeout", "hang_timeout_max"):
        if "hang_timeout_max" in t.table:
            minimum, got = format_duration(hang), format_duration(hang_max)
            message = f"must be at least heartbeat.hang_timeout ({minimum}), got {got}"
            t.report("hang_timeout_max", message)
        hang_max = hang  # only the default is below it: a longer hang_timeout raises it
    return HeartbeatSection(interval, startup_timeout, hang, hang_max, transport, native_stacks)


def _read_restart(t: _Table) -> RestartSection:
    max_restarts = t.read("max_restarts", 5, integer(0))
    first_backoff = t.read("first_backoff", "0s", duration())
    backoff = t.read("backoff", "5s", duration())
    backoff_max = t.read("backoff_max", "5m", duration())
    max_no_progress = t.read("max_no_progress", 2, integer(1))
    on_failure = choice(*get_args(OnFailure))
    on_oom = cast(OnFailure, t.read("on_oom", "restart", on_failure))
    on_node_failure = cast(OnFailure, t.read("on_node_failure", "restart", on_failure))
    if backoff_max < backoff and t.ok("backoff", "backoff_max"):
        minimum, got = format_duration(backoff), format_duration(backoff_max)
        t.report("backoff_max", f"must be at least restart.backoff ({minimum}), got {got}")
    return RestartSection(
        max_restarts, backoff, backoff_max, max_no_progress, on_oom, on_node_failure, first_backoff
    )


def _read_slurm(t: _Table) -> SlurmSection:
    requeue = choice(*get_args(RequeueMode), booleans=("always", "never"))
    return SlurmSection(
        requeue=cast(RequeueMode, t.read("requeue", "auto", requeue)),
        stop_before_end_s=t.read("stop_before_end", "5m", duration()),
    )


def _read_anomaly(t: _Table) -> AnomalySection:
    return AnomalySection(
        spike_factor=t.read("spike_factor", 10.0, positive_number),
        window=t.read("window", 50, integer(4)),
        patience=t.read("patience", 3, integer(1)),
        skip_steps=t.read("skip_steps", 1, integer(1)),
        max_rollbacks=t.read("max_rollbacks", 3, integer(0)),
        verify_every_steps=t.read("verify_every_steps", 0, integer(0)),
    )


def _read_health(t: _Table) -> HealthSection:
    command = t.strings("command")
    if command and not command[0]:
        t.report("command[0]", "must not be empty")
    return HealthSection(
        enabled=t.read("enabled", True, boolean),
        command=() if command is None else command,
        timeout_s=t.read("timeout", "60s", duration(positive=True)),
        checkpoint_free=t.read("checkpoint_free", "auto", size_or_auto),
        shm_free=t.read("shm_free", "auto", size_or_auto),
        memory_free=t.read("memory_free", "1G", size),
        gpus=t.read("gpus", "auto", count_or_auto),
        exclude_after=t.read("exclude_after", 2, integer(0)),
        exclude_stragglers=t.read("exclude_stragglers", False, boolean),
    )


def parse_config(data: Mapping[str, Any], path: Path) -> JobConfig:
    """Validate already-parsed job.toml ``data``; ``path`` is where it came from.

    Raises :class:`ConfigError` listing every problem found.
    """
    issues: list[ConfigIssue] = []
    tables: dict[str, Mapping[str, Any]] = {key: {} for key in _SECTION_KEYS}
    for section, value in data.items():
        if section not in _SECTION_KEYS:
            message = unknown_name("section", _shown(section), _SECTION_KEYS)
            issues.append(ConfigIssue(_shown(section), message))
        elif not isinstance(value, Mapping):
            issues.append(ConfigIssue(section, f"expected a table, got {describe(value)}"))
        else:
            tables[section] = value
    absolute = Path(os.path.abspath(path))
    job = _read_job(_Table(issues, "job", tables["job"]), absolute.parent)
    launch = _read_launch(_Table(issues, "launch", tables["launch"]), absolute.parent)
    checkpoint = _read_checkpoint(_Table(issues, "checkpoint", tables["checkpoint"]))
    heartbeat = _read_heartbeat(_Table(issues, "heartbeat", tables["heartbeat"]))
    restart = _read_restart(_Table(issues, "restart", tables["restart"]))
    slurm = _read_slurm(_Table(issues, "slurm", tables["slurm"]))
    anomaly = _read_anomaly(_Table(issues, "anomaly", tables["anomaly"]))
    health = _read_health(_Table(issues, "health", tables["health"]))
    metrics = read_metrics(_Table(issues, "metrics", tables["metrics"]), job.workdir)
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
