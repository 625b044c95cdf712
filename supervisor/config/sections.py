"""The sections of job.toml, one reader each: every key converted, checked against the keys it
depends on, and its problems reported through the section's :class:`~.table.Table`
(``[metrics]`` is read beside its converters, in :mod:`.metrics`)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Final, cast, get_args

from supervisor.config.durations import format_duration
from supervisor.config.model import (
    AnomalySection,
    CheckpointSection,
    FrozenEnv,
    HealthSection,
    HeartbeatSection,
    JobSection,
    LaunchSection,
    RequeueMode,
    RestartSection,
    ResumeCheckMode,
    SlurmSection,
    Transport,
)
from supervisor.config.table import Table
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
)
from supervisor.rules.policy import OnFailure

__all__ = [
    "read_anomaly",
    "read_checkpoint",
    "read_health",
    "read_heartbeat",
    "read_job",
    "read_launch",
    "read_restart",
    "read_slurm",
]

_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)


def _resolve(base: Path, text: str) -> Path:
    """``text`` with ``~`` expanded, made absolute against ``base``."""
    return Path(os.path.abspath(os.path.join(base, os.path.expanduser(text))))


def read_job(t: Table, base: Path) -> JobSection:
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


def _read_torchrun(t: Table, base: Path) -> tuple[str, ...] | None:
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


def read_launch(t: Table, base: Path) -> LaunchSection:
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


def read_checkpoint(t: Table) -> CheckpointSection:
    return CheckpointSection(
        every_steps=t.read("every_steps", 500, integer(0)),
        every_s=t.read("every", "30m", duration_or("off", off=True)),
        keep_last=t.read("keep_last", 3, integer(1)),
        async_save=t.read("async", False, boolean),
        memory_every_steps=t.read("memory_every_steps", "auto", _steps_auto_or_off),
        memory_dir=t.read("memory_dir", "/dev/shm", path_text),
        resume_check=cast(
            ResumeCheckMode, t.read("resume_check", "warn", choice(*get_args(ResumeCheckMode)))
        ),
    )


def _steps_auto_or_off(value: Any) -> int | None:
    """``"auto"`` (None), ``"off"`` (0) or a number of steps >= 0 (0: off)."""
    if value == "off":
        return 0
    try:
        return count_or_auto(value)
    except InvalidValueError as exc:
        raise InvalidValueError(str(exc).replace('"auto"', '"auto", "off"', 1)) from exc


def read_heartbeat(t: Table) -> HeartbeatSection:
    interval = t.read("interval", "1s", duration(positive=True, maximum=60.0))
    startup_timeout = t.read("startup_timeout", "10m", duration(positive=True))
    hang = t.read("hang_timeout", "auto", duration_or("auto", positive=True))
    hang_max = t.read("hang_timeout_max", "30m", duration(positive=True))
    idle = t.read("hang_timeout_idle", "2m", duration(positive=True))
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
    if idle <= interval and t.ok("interval", "hang_timeout_idle"):
        longer = f"must be longer than heartbeat.interval ({format_duration(interval)})"
        t.report("hang_timeout_idle", longer)
    elif idle > hang_max and t.ok("hang_timeout_max", "hang_timeout_idle"):
        if "hang_timeout_idle" in t.table:
            maximum, got = format_duration(hang_max), format_duration(idle)
            message = f"must be at most heartbeat.hang_timeout_max ({maximum}), got {got}"
            t.report("hang_timeout_idle", message)
        idle = hang_max  # only the default is above it: a shorter hang_timeout_max lowers it
    return HeartbeatSection(
        interval, startup_timeout, hang, hang_max, transport, native_stacks, idle
    )


def read_restart(t: Table) -> RestartSection:
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


def read_slurm(t: Table) -> SlurmSection:
    requeue = choice(*get_args(RequeueMode), booleans=("always", "never"))
    return SlurmSection(
        requeue=cast(RequeueMode, t.read("requeue", "auto", requeue)),
        stop_before_end_s=t.read("stop_before_end", "5m", duration()),
    )


def read_anomaly(t: Table) -> AnomalySection:
    return AnomalySection(
        spike_factor=t.read("spike_factor", 10.0, positive_number),
        window=t.read("window", 50, integer(4)),
        patience=t.read("patience", 3, integer(1)),
        skip_steps=t.read("skip_steps", 1, integer(1)),
        max_rollbacks=t.read("max_rollbacks", 3, integer(0)),
        verify_every_steps=t.read("verify_every_steps", 0, integer(0)),
    )


def read_health(t: Table) -> HealthSection:
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
