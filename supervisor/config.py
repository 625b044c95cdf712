"""job.toml -> a frozen, validated :class:`JobConfig`.

Every problem is collected in one pass and reported with its dotted key
(``restart.backoff``, ``job.command[1]``); unknown sections and keys are rejected with the
list of valid ones. :func:`preflight` checks the machine (programs, directories) just before
a start. The section dataclasses document every key; durations are seconds or strings like
"90s", "5m", "1h30m" (see :mod:`supervisor.durations`).
"""

from __future__ import annotations

import difflib
import json
import os
import re
import shlex
import shutil
import stat
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Final, TypeVar

from supervisor.durations import EXPECTED_DURATION, format_duration, parse_duration
from worker_sdk import layout

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

#: Marker file that :func:`preflight` puts into a new, empty checkpoint directory.
CHECKPOINT_MARKER: Final = layout.MARKER
_JOB_NAME: Final = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}", re.ASCII)
_ENV_NAME: Final = re.compile(r"[A-Za-z_][A-Za-z0-9_]*", re.ASCII)
_BARE_KEY: Final = re.compile(r"[A-Za-z0-9_-]+", re.ASCII)
# torchrun flags (dashes for underscores) rvsup passes itself; "rdzv-" covers every rdzv flag.
_RENDEZVOUS: Final = "rvsup sets up the rendezvous of every attempt"
_OWNED_FLAGS: Final[dict[str, str]] = {
    "nnodes": "rvsup sets it from launch.nnodes",
    "nproc-per-node": "rvsup sets it from launch.nproc_per_node",
    "max-restarts": "rvsup does the restarts itself (see [restart])",
    "rdzv-": _RENDEZVOUS,
    "standalone": _RENDEZVOUS,
    "node-rank": "rvsup assigns the node ranks",
    "no-python": "rvsup derives it from job.command",
}
_T = TypeVar("_T")


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem: the dotted key it is about ("" for the file itself) and what is wrong."""

    key: str
    message: str

    def __str__(self) -> str:
        return f"{self.key}: {self.message}" if self.key else self.message


class ConfigError(Exception):
    """job.toml cannot be used; ``str()`` is one ``<path>: <key>: <message>`` line per issue."""

    def __init__(self, issues: Iterable[ConfigIssue], path: str | os.PathLike[str]) -> None:
        self.issues: tuple[ConfigIssue, ...] = tuple(issues)
        self.path = Path(path)
        super().__init__("\n".join(f"{self.path}: {issue}" for issue in self.issues))

    def __reduce__(self) -> tuple[type[ConfigError], tuple[tuple[ConfigIssue, ...], Path]]:
        return ConfigError, (self.issues, self.path)


class FrozenEnv(Mapping[str, str]):
    """A read-only, hashable mapping of environment variable names to values."""

    __slots__ = ("_items",)

    def __init__(self, items: Mapping[str, str] | Iterable[tuple[str, str]] = ()) -> None:
        self._items = dict(items)

    def __getitem__(self, key: str) -> str:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __hash__(self) -> int:
        return hash(frozenset(self._items.items()))

    def __repr__(self) -> str:
        return f"FrozenEnv({self._items!r})"


@dataclass(frozen=True, slots=True)
class JobSection:
    """``[job]``: what runs and where (the only required section).

    - ``name`` (required): 1 to 64 characters of ``A-Z a-z 0-9 _ . -``, not starting with
      ``.`` or ``-``; names the run.
    - ``command`` (required): what torchrun runs on every rank, an array of strings; a
      string is split like a shell would (quotes honoured, nothing expanded).
    - ``workdir`` (default ``"."``): where the command runs; relative to job.toml's folder.
      ``~`` is expanded in every path.
    - ``run_dir`` (default ``"runs/<name>"``, relative to workdir): events.jsonl, rank logs,
      the control socket, diagnostics.
    - ``checkpoint_dir`` (default ``"checkpoints/<name>"``, relative to workdir): must be
      owned by you and writable by nobody else (checkpoints are unpickled), and hold only
      what rvsup wrote.
    - ``env`` (default ``{}``): extra environment for every rank; values must be strings
      (write ``OMP_NUM_THREADS = "4"``); ``RVSUP_*`` names are reserved.
    """

    name: str
    command: tuple[str, ...]
    workdir: Path
    run_dir: Path
    checkpoint_dir: Path
    env: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class LaunchSection:
    """``[launch]``: how torchrun is started.

    - ``nproc_per_node`` (default ``"auto"``: the GPUs visible, else 1): ranks per node, >= 1.
    - ``nnodes`` (default ``"auto"``: from the Slurm allocation, else 1): nodes, >= 1.
    - ``torchrun_args`` (default ``[]``): extra torchrun arguments; the flags rvsup sets
      itself (``--nnodes``, ``--nproc-per-node``, ``--max-restarts``, ``--rdzv-*``,
      ``--standalone``, ``--node-rank``, ``--no-python``) are rejected.
    - ``term_timeout`` (default ``"5s"``, >= 0): SIGTERM -> SIGKILL deadline when tearing down.
    - ``stop_timeout`` (default ``"60s"``, > 0): deadline for a coordinated checkpoint + stop.
    """

    nproc_per_node: int | None
    nnodes: int | None
    torchrun_args: tuple[str, ...]
    term_timeout_s: float
    stop_timeout_s: float


@dataclass(frozen=True, slots=True)
class CheckpointSection:
    """``[checkpoint]``: when the SDK saves; whichever of the two comes first.

    - ``every_steps`` (default 500): every N finished steps; 0 disables.
    - ``every`` (default ``"30m"``): at most this long apart; ``0``, ``"off"`` or ``false``
      disables (``every_s`` is then None).
    - ``keep_last`` (default 3, >= 1): committed checkpoints kept; older ones are pruned.
    """

    every_steps: int
    every_s: float | None
    keep_last: int


@dataclass(frozen=True, slots=True)
class HeartbeatSection:
    """``[heartbeat]``: liveness of the ranks.

    - ``interval`` (default ``"1s"``, > 0 and <= 60s): how often each rank reports.
    - ``startup_timeout`` (default ``"10m"``, > 0): launch -> first finished step.
    - ``hang_timeout`` (default ``"auto"``: learnt from observed step times, then None):
      no progress for this long while processes live is a hang; > the interval.
    - ``hang_timeout_max`` (default ``"30m"``, > 0): ceiling of the automatic hang timeout.
    - ``transport`` (default ``"auto"``): ``"auto"``, ``"ipc"`` or ``"tcp"``.
    """

    interval_s: float
    startup_timeout_s: float
    hang_timeout_s: float | None
    hang_timeout_max_s: float
    transport: str


@dataclass(frozen=True, slots=True)
class RestartSection:
    """``[restart]``: the retry budget, for the whole job across allocations.

    - ``max_restarts`` (default 5, >= 0): restarts charged before giving up; preemptions
      are never charged.
    - ``backoff`` (default ``"5s"``, >= 0): first delay, doubled each time, with jitter.
    - ``backoff_max`` (default ``"5m"``, >= backoff): the longest delay.
    - ``max_no_progress`` (default 2, >= 1): restarts in a row without a new checkpoint
      before giving up.
    - ``on_oom`` (default ``"restart"``): ``"restart"`` or ``"fail"``.
    - ``on_node_failure`` (default ``"restart"``): ``"restart"`` or ``"fail"``.
    """

    max_restarts: int
    backoff_s: float
    backoff_max_s: float
    max_no_progress: int
    on_oom: str
    on_node_failure: str


@dataclass(frozen=True, slots=True)
class SlurmSection:
    """``[slurm]``: behaviour inside a Slurm allocation.

    - ``requeue`` (default ``"auto"``): ``"auto"``, ``"always"`` or ``"never"`` requeue the
      allocation on preemption / time limit; ``true`` / ``false`` mean always / never.
    - ``stop_before_end`` (default ``"5m"``, >= 0; 0 disables): checkpoint and stop this
      long before the time limit.
    """

    requeue: str
    stop_before_end_s: float


@dataclass(frozen=True, slots=True)
class JobConfig:
    """The whole resolved job.toml; ``path`` is its absolute path."""

    path: Path
    job: JobSection
    launch: LaunchSection
    checkpoint: CheckpointSection
    heartbeat: HeartbeatSection
    restart: RestartSection
    slurm: SlurmSection


_SECTIONS: Final[dict[str, type]] = {
    "job": JobSection,
    "launch": LaunchSection,
    "checkpoint": CheckpointSection,
    "heartbeat": HeartbeatSection,
    "restart": RestartSection,
    "slurm": SlurmSection,
}
# The TOML keys of each section: its field names, less the "_s" (seconds) suffix.
_SECTION_KEYS: Final = {
    name: tuple(item.name.removesuffix("_s") for item in fields(cls))
    for name, cls in _SECTIONS.items()
}


class _InvalidValueError(ValueError):
    """Raised by a converter; the message says what is wrong with the value."""


def _describe(value: object) -> str:
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


def _unknown(what: str, name: str, valid: Iterable[str]) -> str:
    """Message for an unknown section or key, with the valid ones and a close match."""
    choices = sorted(valid)
    message = f"unknown {what}; valid {what}s: {', '.join(choices)}"
    close = difflib.get_close_matches(name, choices, n=1)
    return f"{message}; did you mean {close[0]!r}?" if close else message


class _Table:
    """One section of job.toml being read; every problem goes to the shared issue list."""

    def __init__(self, issues: list[ConfigIssue], section: str, table: Mapping[str, Any]) -> None:
        self.section, self.table, self._issues = section, table, issues
        self.failed: set[str] = set()
        for key in table:
            if key not in _SECTION_KEYS[section]:
                self.report(key, _unknown("key", key, _SECTION_KEYS[section]))

    def report(self, key: str, message: str) -> None:
        self.failed.add(key)
        self._issues.append(ConfigIssue(f"{self.section}.{key}", message))

    def ok(self, *keys: str) -> bool:
        """True when none of ``keys`` had a problem (cross-key checks need good values)."""
        return self.failed.isdisjoint(keys)

    def read(self, key: str, default: object, convert: Callable[[Any], _T]) -> _T:
        """Convert ``key``'s value (or ``default``); on a problem, report it, use the default."""
        try:
            return convert(self.table.get(key, default))
        except _InvalidValueError as exc:
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
            self.report(key, f"expected an array of strings, got {_describe(value)}")
            return None
        for index, item in enumerate(value):
            if not isinstance(item, str):
                self.report(f"{key}[{index}]", f"expected a string, got {_describe(item)}")
            elif "\0" in item:
                self.report(f"{key}[{index}]", "must not contain a NUL character")
        return None if any(k.startswith(f"{key}[") for k in self.failed) else tuple(value)


def _integer(minimum: int) -> Callable[[Any], int]:
    def convert(value: Any) -> int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise _InvalidValueError(f"expected an integer, got {_describe(value)}")
        if value < minimum:
            raise _InvalidValueError(f"must be at least {minimum}, got {value}")
        return value

    return convert


def _auto_count(value: Any) -> int | None:
    if value == "auto":
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise _InvalidValueError(f'expected "auto" or an integer, got {_describe(value)}')
    if value < 1:
        raise _InvalidValueError(f"must be at least 1, got {value}")
    return value


def _duration(*, positive: bool = False, maximum: float | None = None) -> Callable[[Any], float]:
    def convert(value: Any) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise _InvalidValueError(f"{EXPECTED_DURATION}, got {_describe(value)}")
        try:
            seconds = parse_duration(value)
        except ValueError as exc:
            raise _InvalidValueError(str(exc)) from exc
        if positive and seconds <= 0:
            raise _InvalidValueError("must be greater than 0")
        if maximum is not None and seconds > maximum:
            limit, got = format_duration(maximum), format_duration(seconds)
            raise _InvalidValueError(f"must be at most {limit}, got {got}")
        return seconds

    return convert


def _duration_or(
    word: str, *, off: bool = False, positive: bool = False
) -> Callable[[Any], float | None]:
    """A duration, or ``word`` meaning None; with ``off``, also ``false`` and 0 mean None."""
    durations = _duration(positive=positive)

    def convert(value: Any) -> float | None:
        if value == word or (off and value is False):
            return None
        try:
            seconds = durations(value)
        except _InvalidValueError as exc:
            either = f'expected "{word}" or a duration'
            raise _InvalidValueError(str(exc).replace("expected a duration", either, 1)) from exc
        return None if off and seconds == 0 else seconds

    return convert


def _choice(*choices: str, booleans: tuple[str, str] | None = None) -> Callable[[Any], str]:
    """One of ``choices``; ``booleans`` maps TOML true and false to two of them."""

    def convert(value: Any) -> str:
        if booleans is not None and isinstance(value, bool):
            return booleans[0] if value else booleans[1]
        if isinstance(value, str) and value in choices:
            return value
        listed = ", ".join(f'"{choice}"' for choice in choices)
        text = value.lower() if isinstance(value, str) else ""
        close = difflib.get_close_matches(text, choices, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else ""
        raise _InvalidValueError(f"expected one of {listed}, got {_describe(value)}{hint}")

    return convert


def _job_name(value: Any) -> str:
    if not isinstance(value, str):
        raise _InvalidValueError(f"expected a string, got {_describe(value)}")
    if not _JOB_NAME.fullmatch(value):
        raise _InvalidValueError(
            "must be 1 to 64 characters of A-Z a-z 0-9 _ . - not starting with . or -, "
            f"got {value!r}"
        )
    return value


def _path_text(value: Any) -> str:
    if not isinstance(value, str):
        raise _InvalidValueError(f"expected a string (a path), got {_describe(value)}")
    if not value or "\0" in value:
        raise _InvalidValueError("must be a non-empty path without NUL characters")
    return value


def _resolve(base: Path, text: str) -> Path:
    return Path(os.path.abspath(os.path.join(base, os.path.expanduser(text))))


def _owned_flag_reason(arg: str) -> str | None:
    """Why rvsup owns the torchrun flag ``arg`` (argparse abbreviations included), or None."""
    if not arg.startswith("--"):
        return None
    name = arg[2:].split("=", 1)[0].replace("_", "-")
    for flag, reason in _OWNED_FLAGS.items():
        exact = name.startswith(flag) if flag.endswith("-") else name == flag
        if exact or (len(name) >= 3 and flag.startswith(name)):
            return reason
    return None


def _read_job(t: _Table, base: Path) -> JobSection:
    for key in ("name", "command"):
        if key not in t.table:
            t.report(key, "required")
    name = t.read("name", "job", _job_name)
    command = t.strings("command") if "command" in t.table else None
    if command == ():
        t.report("command", "must not be empty")
    elif command and not command[0]:
        t.report("command[0]", "must not be empty")
    workdir = _resolve(base, t.read("workdir", ".", _path_text))
    run_dir = _resolve(workdir, t.read("run_dir", f"runs/{name}", _path_text))
    checkpoint_dir = _resolve(workdir, t.read("checkpoint_dir", f"checkpoints/{name}", _path_text))
    if t.ok("run_dir", "checkpoint_dir") and run_dir.is_relative_to(checkpoint_dir):
        t.report("run_dir", "must be outside job.checkpoint_dir, which holds only checkpoints")
    raw_env = t.table.get("env", {})
    env: dict[str, str] = {}
    if not isinstance(raw_env, Mapping):
        t.report("env", f"expected a table, got {_describe(raw_env)}")
        raw_env = {}
    for var, value in raw_env.items():
        if not _ENV_NAME.fullmatch(var):
            t.report(
                f"env.{var}", "not a valid variable name (letters, digits, _; no leading digit)"
            )
        elif var.startswith("RVSUP_"):
            t.report(f"env.{var}", "RVSUP_* variables are set by rvsup")
        elif not isinstance(value, str) or "\0" in value:
            t.report(f"env.{var}", f"expected a string (in quotes), got {_describe(value)}")
        else:
            env[var] = value
    return JobSection(name, command or (), workdir, run_dir, checkpoint_dir, FrozenEnv(env))


def _read_launch(t: _Table) -> LaunchSection:
    nproc_per_node = t.read("nproc_per_node", "auto", _auto_count)
    nnodes = t.read("nnodes", "auto", _auto_count)
    args = t.strings("torchrun_args") or ()
    for index, arg in enumerate(args):
        reason = _owned_flag_reason(arg)
        if reason is not None:
            t.report(f"torchrun_args[{index}]", f"{arg!r} is not allowed: {reason}")
    term_timeout = t.read("term_timeout", "5s", _duration())
    stop_timeout = t.read("stop_timeout", "60s", _duration(positive=True))
    return LaunchSection(nproc_per_node, nnodes, args, term_timeout, stop_timeout)


def _read_checkpoint(t: _Table) -> CheckpointSection:
    return CheckpointSection(
        every_steps=t.read("every_steps", 500, _integer(0)),
        every_s=t.read("every", "30m", _duration_or("off", off=True)),
        keep_last=t.read("keep_last", 3, _integer(1)),
    )


def _read_heartbeat(t: _Table) -> HeartbeatSection:
    interval = t.read("interval", "1s", _duration(positive=True, maximum=60.0))
    startup_timeout = t.read("startup_timeout", "10m", _duration(positive=True))
    hang = t.read("hang_timeout", "auto", _duration_or("auto", positive=True))
    hang_max = t.read("hang_timeout_max", "30m", _duration(positive=True))
    transport = t.read("transport", "auto", _choice("auto", "ipc", "tcp"))
    if hang is not None and hang <= interval and t.ok("interval", "hang_timeout"):
        longer = f"must be longer than heartbeat.interval ({format_duration(interval)})"
        t.report("hang_timeout", longer)
    return HeartbeatSection(interval, startup_timeout, hang, hang_max, transport)


def _read_restart(t: _Table) -> RestartSection:
    max_restarts = t.read("max_restarts", 5, _integer(0))
    backoff = t.read("backoff", "5s", _duration())
    backoff_max = t.read("backoff_max", "5m", _duration())
    max_no_progress = t.read("max_no_progress", 2, _integer(1))
    on_oom = t.read("on_oom", "restart", _choice("restart", "fail"))
    on_node_failure = t.read("on_node_failure", "restart", _choice("restart", "fail"))
    if backoff_max < backoff and t.ok("backoff", "backoff_max"):
        minimum, got = format_duration(backoff), format_duration(backoff_max)
        t.report("backoff_max", f"must be at least restart.backoff ({minimum}), got {got}")
    return RestartSection(
        max_restarts, backoff, backoff_max, max_no_progress, on_oom, on_node_failure
    )


def _read_slurm(t: _Table) -> SlurmSection:
    always_never = ("always", "never")
    return SlurmSection(
        requeue=t.read("requeue", "auto", _choice("auto", *always_never, booleans=always_never)),
        stop_before_end_s=t.read("stop_before_end", "5m", _duration()),
    )


def parse_config(data: Mapping[str, Any], path: Path) -> JobConfig:
    """Validate already-parsed job.toml ``data``; ``path`` is where it came from.

    Raises :class:`ConfigError` listing every problem found.
    """
    issues: list[ConfigIssue] = []
    tables: dict[str, Mapping[str, Any]] = {key: {} for key in _SECTION_KEYS}
    for section, value in data.items():
        if section not in _SECTION_KEYS:
            issues.append(ConfigIssue(section, _unknown("section", section, _SECTION_KEYS)))
        elif not isinstance(value, Mapping):
            issues.append(ConfigIssue(section, f"expected a table, got {_describe(value)}"))
        else:
            tables[section] = value
    absolute = Path(os.path.abspath(path))
    job = _read_job(_Table(issues, "job", tables["job"]), absolute.parent)
    launch = _read_launch(_Table(issues, "launch", tables["launch"]))
    checkpoint = _read_checkpoint(_Table(issues, "checkpoint", tables["checkpoint"]))
    heartbeat = _read_heartbeat(_Table(issues, "heartbeat", tables["heartbeat"]))
    restart = _read_restart(_Table(issues, "restart", tables["restart"]))
    slurm = _read_slurm(_Table(issues, "slurm", tables["slurm"]))
    if issues:
        raise ConfigError(issues, path)
    return JobConfig(absolute, job, launch, checkpoint, heartbeat, restart, slurm)


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


def _toml(value: str | int | tuple[str, ...] | Mapping[str, str]) -> str:
    """One TOML value (string, integer, array of strings or inline table of strings)."""
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False).replace("\x7f", "\\u007f")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(_toml(item) for item in value) + "]"
    pairs = (f"{k if _BARE_KEY.fullmatch(k) else _toml(k)} = {_toml(v)}" for k, v in value.items())
    return "{ " + ", ".join(pairs) + " }" if value else "{}"


def render_config(cfg: JobConfig) -> str:
    """The resolved configuration as TOML that :func:`load_config` reads back unchanged."""
    blocks = []
    for section in fields(cfg)[1:]:
        lines = [f"[{section.name}]"]
        values = getattr(cfg, section.name)
        for item in fields(values):
            value = getattr(values, item.name)
            key = item.name.removesuffix("_s")  # every float is a duration in seconds
            if value is None:
                value = "off" if key == "every" else "auto"
            elif isinstance(value, float):
                value = format_duration(value)
            elif isinstance(value, Path):
                value = str(value)
            lines.append(f"{key} = {_toml(value)}")
        blocks.append("\n".join(lines))
    return "\n\n".join(blocks) + "\n"


def _private_dir_problem(directory: Path) -> str | None:
    """Create ``directory`` (0700) if missing; say why it cannot hold rvsup's files, or None."""
    try:
        if not directory.exists():
            directory.mkdir(mode=0o700, parents=True)
            directory.chmod(0o700)
    except OSError as exc:
        return f"cannot create it: {exc.strerror or exc}"
    try:
        info = directory.stat()
        if not stat.S_ISDIR(info.st_mode):
            return "is not a directory"
        if info.st_uid != os.geteuid():
            return f"is owned by uid {info.st_uid}, not by you (uid {os.geteuid()})"
        if info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
            return "is writable by other users; chmod go-w it"
        if not os.access(directory, os.W_OK | os.X_OK):
            return "is not writable by you"
        fd, probe = tempfile.mkstemp(prefix=".rvsup-probe-", dir=directory)
        os.close(fd)
        os.unlink(probe)
    except OSError as exc:
        return f"is not usable: {exc.strerror or exc}"
    return None


def _checkpoint_dir_problem(directory: Path) -> str | None:
    """Refuse a checkpoint directory holding foreign entries; mark a new, empty one as rvsup's."""
    try:
        names = sorted(os.listdir(directory))
        foreign = [name for name in names if not layout.is_rvsup_entry(name)]
        if foreign:
            more = f" and {len(foreign) - 3} more" if len(foreign) > 3 else ""
            return (
                f"holds files rvsup did not write ({', '.join(foreign[:3])}{more}); "
                "use an empty directory or one rvsup created"
            )
        if not names:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
            fd = os.open(directory / CHECKPOINT_MARKER, flags, 0o600)
            try:
                os.write(fd, b"rvsup checkpoint directory: only rvsup writes here\n")
            finally:
                os.close(fd)
    except OSError as exc:
        return f"is not usable: {exc.strerror or exc}"
    return None


def preflight(cfg: JobConfig, *, torchrun: str = "torchrun") -> list[ConfigIssue]:
    """Check the machine before a start: programs, workdir, run and checkpoint directories.

    Returns the problems found (raises nothing). Creates missing run and checkpoint
    directories (0700) and the checkpoint marker file; never deletes or changes anything else.
    """
    issues: list[ConfigIssue] = []
    job = cfg.job
    if shutil.which(torchrun) is None:
        issues.append(
            ConfigIssue(
                "launch", f"{torchrun} not found on PATH; install torch in this environment"
            )
        )
    if not job.workdir.is_dir():
        what = "is not a directory" if job.workdir.exists() else "does not exist"
        issues.append(ConfigIssue("job.workdir", f"{job.workdir} {what}"))
    program = job.command[0]
    on_path = os.sep not in program and shutil.which(program, path=job.env.get("PATH")) is not None
    if not on_path and not (job.workdir / program).is_file():
        issues.append(
            ConfigIssue("job.command[0]", f"{program!r} not found on PATH or in {job.workdir}")
        )
    for key, directory in (
        ("job.run_dir", job.run_dir),
        ("job.checkpoint_dir", job.checkpoint_dir),
    ):
        if directory.is_relative_to(job.workdir) and not job.workdir.is_dir():
            continue  # do not create the missing workdir as a side effect
        problem = _private_dir_problem(directory)
        if problem is None and key == "job.checkpoint_dir":
            problem = _checkpoint_dir_problem(directory)
        if problem is not None:
            issues.append(ConfigIssue(key, f"{directory} {problem}"))
    return issues
