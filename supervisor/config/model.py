"""The job.toml schema: frozen section dataclasses that document every key, and config errors.

:mod:`supervisor.config` reads job.toml into these; durations are seconds or strings like
"90s", "5m", "1h30m" (see :mod:`supervisor.config.durations`). A TOML key is its field's name less
the ``_s`` (seconds) suffix.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

from supervisor.config.metrics import MetricsSection
from supervisor.rules.anomalies import AnomalyPolicy
from supervisor.rules.policy import RestartPolicy

__all__ = [
    "CheckpointSection",
    "ConfigError",
    "ConfigIssue",
    "FrozenEnv",
    "HealthSection",
    "HeartbeatSection",
    "JobConfig",
    "JobSection",
    "LaunchSection",
    "MetricsSection",
    "RequeueMode",
    "RestartSection",
    "SlurmSection",
    "Transport",
    "toml_key",
]

Transport: TypeAlias = Literal["auto", "ipc", "tcp"]
"""How ranks reach the daemon: ``auto`` is IPC on one node, TCP across nodes."""
RequeueMode: TypeAlias = Literal["auto", "always", "never"]
ResumeCheckMode: TypeAlias = Literal["warn", "fail", "off"]
"""Whether a stopped allocation is requeued; ``auto``: if Slurm says it can be."""

_KEYWORD_KEYS = {"async_save": "async"}
"""Fields whose TOML key is a Python keyword."""


def toml_key(field_name: str) -> str:
    """The job.toml key of a section's field: its name less the ``_s`` (seconds) suffix, or the
    keyword it stands for (``async_save`` is ``async``)."""
    return _KEYWORD_KEYS.get(field_name, field_name.removesuffix("_s"))


@dataclass(frozen=True, slots=True)
class ConfigIssue:
    """One problem: the dotted key it is about ("" for the file itself) and what is wrong."""

    key: str
    message: str

    def __str__(self) -> str:
        text = f"{self.key}: {self.message}" if self.key else self.message
        return _one_line(text)


def _one_line(text: str) -> str:
    """``text`` with unprintable characters escaped (a key or value from the file that holds a
    line break must not split a problem's line)."""
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in text)


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
      the control socket, diagnostics; owned by you, and no folder above it writable by
      another user (docs/security.md).
    - ``checkpoint_dir`` (default ``"checkpoints/<name>"``, relative to workdir): must be
      owned by you and writable by nobody else, as every folder above it (checkpoints are
      loaded from it), and hold only what rvsup wrote.
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
      ``--standalone``, ``--master-addr``, ``--master-port``, ``--node-rank``, ``--no-python``)
      are rejected.
    - ``term_timeout`` (default ``"5s"``, >= 0): SIGTERM -> SIGKILL deadline when tearing down.
    - ``stop_timeout`` (default ``"60s"``, > 0): deadline for a coordinated checkpoint + stop.
    - ``warm_standby`` (default ``true``): keep a torchrun that has already imported itself
      waiting while an attempt runs, so that a single-node restart does not pay for the import
      again (seconds). It runs on the job's interpreter, forked from the zygote when there is
      one (else started cold, costing that idle process's memory); there is none when
      ``torchrun`` names a wrapper whose interpreter rvsup cannot tell. With a zygote, the
      first attempt's torchrun is such a standby too, forked once the zygote has imported.
    - ``torchrun`` (default ``"auto"``): the torchrun of the job's environment, when
      rvsup cannot derive it: a path (``"/venv/bin/torchrun"``; relative to job.toml's folder,
      ``~`` expanded; a bare name is looked up on PATH) or a command line, an array of strings
      whose first one is such a path or name (``["/venv/bin/python", "-m",
      "torch.distributed.run"]``). Stored as that command line. ``"auto"``: the ``torchrun``
      beside ``job.command[0]`` when that is a Python interpreter, else that interpreter with
      ``-m torch.distributed.run``; when the command is not Python, ``torchrun`` on the PATH of
      ``[job] env`` or rvsup's (see :mod:`supervisor.config.torchrun`).
    - ``min_nnodes`` (default ``"auto"``: ``nnodes``, never fewer): after a node failure with no spare node
      left in the allocation, go on with as many nodes as are left if that is at least this many
      (torchrun's ``--nnodes=MIN:MAX`` in spirit); the checkpoint is resharded onto fewer ranks.
    - ``zygote`` (default ``true``): fork every rank from a process per node that imported torch
      once (:mod:`supervisor.process.zygote`), so that starts and restarts do not pay for the
      interpreter and the imports again; ranks it cannot start as a cold exec would start them
      (another interpreter, interpreter options, import-time variables that differ) start
      cold, with a ``cold_start`` event. On several nodes the zygotes are a Slurm step.
    - ``preload`` (default ``[]``): more modules for the zygote to import (the model's code, a
      tokenizer), from the script's folder and ``sys.path``; a module that fails to import, or
      that starts threads or initialises CUDA while importing, makes every rank start cold.
    """

    nproc_per_node: int | None
    nnodes: int | None
    torchrun_args: tuple[str, ...]
    term_timeout_s: float
    stop_timeout_s: float
    warm_standby: bool = True
    torchrun: tuple[str, ...] | None = None
    min_nnodes: int | None = None
    zygote: bool = True
    preload: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class CheckpointSection:
    """``[checkpoint]``: when the SDK saves; whichever of the two comes first.

    - ``every_steps`` (default 500): every N finished steps; 0 disables.
    - ``every`` (default ``"30m"``): at most this long apart; ``0``, ``"off"`` or ``false``
      disables.
    - ``keep_last`` (default 3, >= 1): committed checkpoints kept; older ones are pruned, but
      the one a rollback for a loss anomaly not yet confirmed may need (docs/anomalies.md).
    - ``async`` (default false): training blocks only while the state is copied to shared
      memory; a background process per rank writes, fsyncs and commits.
    - ``memory_every_steps`` (default ``"auto"``): the memory tier (docs/memory-tier.md):
      between storage checkpoints, a snapshot of every rank's state in host shared memory every
      N steps, from which a restart resumes when it is newer than storage's newest; ``"auto"``
      picks N so that snapshots block ``step()`` for at most 1 % of the training time (every
      step when the state is small); ``"off"`` (or 0) disables it. Where the node's memory (the
      job's memory cgroup, the host) or ``memory_dir`` has no room for the snapshots, the tier
      pauses, with an event, and tries again later in the attempt. On several nodes every node
      keeps a copy of every snapshot, so that a lost node's ranks resume from another node's
      memory.
    - ``memory_dir`` (default ``"/dev/shm"``): the tmpfs the snapshots live in, which must
      exist; it may be shared with other users if sticky, as ``/dev/shm`` is (the job's own
      private directory is made inside it and removed at the job's end).
    - ``resume_check`` (default ``"warn"``): every resume is checked against the attempt it
      replaces (docs/resume-check.md): the losses ``step()`` is given and a sampled checksum
      of the parameters, at the steps the resumed attempt redoes. ``"warn"``: a difference is
      a ``resume_diverged`` event and the job goes on; ``"fail"``: the job stops there (exit
      3); ``"off"``: nothing is compared.
    """

    every_steps: int
    every_s: float | None
    keep_last: int
    async_save: bool = False
    memory_every_steps: int | None = None  # None: "auto"; 0: off
    memory_dir: str = "/dev/shm"
    resume_check: ResumeCheckMode = "warn"


@dataclass(frozen=True, slots=True)
class HeartbeatSection:
    """``[heartbeat]``: liveness of the ranks.

    - ``interval`` (default ``"1s"``, > 0 and <= 60s): how often each rank reports.
    - ``startup_timeout`` (default ``"10m"``, > 0): launch -> first finished step.
    - ``hang_timeout`` (default ``"auto"``: learnt from observed step times):
      no progress for this long while processes live is a hang; > the interval.
    - ``hang_timeout_max`` (default ``"30m"``, or ``hang_timeout`` where that is longer; >
      the interval and >= a configured ``hang_timeout``): the ceiling of the automatic hang
      timeout, and the longest a silence may last while ranks outside collectives work or
      wait on their own (evaluating alone, a sleep in a hook) and the others wait for them.
    - ``transport`` (default ``"auto"``: IPC on one node, TCP across nodes): ``"auto"``,
      ``"ipc"`` or ``"tcp"``.
    - ``native_stacks`` (default true): a hang's diagnostics include every rank's native
      (C/C++) stacks where py-spy is installed. py-spy needs about a second a rank (at most
      3 s), paid while the hang is confirmed: from 2 s before the timeout runs out, so that the
      restart does not wait for it; false never runs it.
    - ``hang_timeout_idle`` (default ``"2m"``, or ``hang_timeout_max`` where that is shorter;
      > the interval and <= ``hang_timeout_max``): the longest a silence may last while the
      ranks outside collectives use no CPU and wait on their own (a sleep, a socket, a pipe, a
      data loader), from when none of them was last seen working: a rank asleep forever
      outside any collective is a hang after this long, not after ``hang_timeout_max``. Why
      2 minutes: long enough for a hook that sleeps or a socket that waits in a healthy job
      (the waits measured in benchmarks' figure 10 last seconds), short enough that a dead
      service costs minutes, not half an hour. A hook that really waits longer: wrap it in
      ``worker_sdk.phase()`` (a declared phase gets ``startup_timeout``) or raise this key.
    """

    interval_s: float
    startup_timeout_s: float
    hang_timeout_s: float | None
    hang_timeout_max_s: float
    transport: Transport
    native_stacks: bool = True
    hang_timeout_idle_s: float = 120.0


RestartSection: TypeAlias = RestartPolicy
"""``[restart]``: the retry budget (keys documented on
:class:`supervisor.rules.policy.RestartPolicy`, which the restart rule applies as it is)."""


@dataclass(frozen=True, slots=True)
class SlurmSection:
    """``[slurm]``: behaviour inside a Slurm allocation.

    - ``requeue`` (default ``"auto"``: if Slurm says the job can be requeued): ``"auto"``,
      ``"always"`` or ``"never"`` requeue the allocation on preemption / time limit; ``true`` /
      ``false`` mean always / never.
    - ``stop_before_end`` (default ``"5m"``, >= 0; 0 disables): checkpoint and stop this
      long before the time limit.
    """

    requeue: RequeueMode
    stop_before_end_s: float


@dataclass(frozen=True, slots=True)
class HealthSection:
    """``[health]``: checks of every node before the first attempt and after each failure, and
    the exclusion of bad nodes (docs/health.md).

    - ``enabled`` (default true): false runs no check (exclusion by failures still applies).
    - ``command`` (default ``[]``): a program run on every node (array of strings, or a
      string split like a shell); exit 0 is healthy, anything else unhealthy with its output
      (Slurm's ``HealthCheckProgram`` / LBNL NHC convention).
    - ``timeout`` (default ``"60s"``, > 0): a check still running then is killed with its
      process group and counts as unhealthy.
    - ``checkpoint_free`` (default ``"auto"``: the newest checkpoint's size): the free space
      the checkpoint directory must have (it must be writable in any case); a size
      (``"20G"``; 0: writable is enough).
    - ``shm_free`` (default ``"auto"``: with ``checkpoint.async``, a node's share of the
      newest checkpoint; else not checked): free space ``/dev/shm`` must have.
    - ``memory_free`` (default ``"1G"``): memory available (``MemAvailable``) a node must have.
    - ``gpus`` (default ``"auto"``: the allocation's GPUs per node, else not checked): GPUs
      ``nvidia-smi`` must list; skipped where there is no ``nvidia-smi``; 0 disables.
    - ``exclude_after`` (default 2, >= 0): failures attributed to a node before it is
      excluded; a node failing a health check is excluded at once; 0 turns exclusion off,
      stragglers' nodes included (checks are still run and logged).
    - ``exclude_stragglers`` (default false): when a rank is named a straggler
      (``straggler_detected``), its node is excluded at the next restart (docs/stragglers.md),
      unless ``exclude_after`` is 0.
    """

    enabled: bool = True
    command: tuple[str, ...] = ()
    timeout_s: float = 60.0
    checkpoint_free: int | None = None
    shm_free: int | None = None
    memory_free: int = 1 << 30
    gpus: int | None = None
    exclude_after: int = 2
    exclude_stragglers: bool = False

    @property
    def stragglers_excluded(self) -> bool:
        """Whether a straggler's node is excluded at the next restart: asked for, and
        exclusion not turned off (``exclude_after = 0``)."""
        return self.exclude_stragglers and self.exclude_after > 0


AnomalySection: TypeAlias = AnomalyPolicy
"""``[anomaly]``: the loss rules and the rollbacks (keys documented on
:class:`supervisor.rules.anomalies.AnomalyPolicy`)."""


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
    anomaly: AnomalySection = field(default_factory=AnomalyPolicy)
    health: HealthSection = field(default_factory=HealthSection)
    metrics: MetricsSection = field(default_factory=MetricsSection)
