"""The history's events, defined once: one frozen dataclass per event of ``events.jsonl``.

A class's fields *are* the event's JSON fields (same names, same order); its ``NAME`` and
``LEVEL`` are the line's ``event`` and ``level``. The writer (``EventLog.log`` in
:mod:`.events`) accepts nothing else, and the readers (:mod:`.history`,
:mod:`supervisor.rules.budget`) fold these objects instead of dictionaries. A line is the common
fields ``timestamp``, ``event``, ``level``, ``job``, ``attempt`` plus :func:`to_json` of the event.

Building an event checks its values against the field types and normalises them (lists to
tuples, enum members to plain strings, the floats named in ``DIGITS`` rounded as written), so an
event read back compares equal to the one logged. Reading (:mod:`.entries`) takes any line
any version of rvsup wrote: a missing or malformed field is empty (None, ``""``, ``False``,
``()``, ``{}``), except a non-optional ``int``/``float``, which is required — without it the
line is skipped and counted as invalid (the rules: :mod:`.typed_json`); an event name this
version does not know is skipped and counted as unknown.

Pure: no I/O and no clock (the rules import it).
"""

from __future__ import annotations

import types
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar, Final, Literal, TypeAlias

from supervisor.record import typed_json

__all__ = [
    "EVENTS",
    "AnomalyDetected",
    "AttemptClosed",
    "AttemptStarted",
    "CheckpointCommitted",
    "CheckpointFailed",
    "CheckpointLoaded",
    "CheckpointSkipped",
    "ColdStart",
    "Event",
    "ExitAborted",
    "ExitStalled",
    "FailureDetected",
    "HealthChecked",
    "JobGaveUp",
    "JobStarted",
    "JobStopped",
    "JobSucceeded",
    "Level",
    "MessagesDropped",
    "NodeExcluded",
    "ProcessesEnded",
    "ProcessesLeft",
    "RequeueFailed",
    "RestartScheduled",
    "RolledBack",
    "SlowPhase",
    "StopRequested",
    "StragglerDetected",
    "SupervisorError",
    "TimeLeftUnknown",
    "describe",
    "to_json",
]

Level: TypeAlias = Literal["info", "warning", "error"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Event:
    """The base of every event; not an event itself."""

    NAME: ClassVar[str]
    """The ``event`` of the line."""
    LEVEL: ClassVar[Level]
    """The ``level`` of the line."""
    DIGITS: ClassVar[Mapping[str, int]] = types.MappingProxyType({})
    """Float fields rounded when written, to this many decimal places."""

    def __post_init__(self) -> None:
        """Check every value against its field's type and normalise it (module docstring)."""
        for name, value in typed_json.normalised(self, self.DIGITS).items():
            object.__setattr__(self, name, value)


# ---------------------------------------------------------------- the events


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStarted(Event):
    """A ``rvsup start`` took the job over: the first start, a requeued allocation, a restart."""

    NAME = "job_started"
    LEVEL = "info"
    config: str
    """The job file the daemon read."""
    host: str
    """The host the daemon runs on."""
    pid: int
    """The daemon's process id."""
    slurm_job_id: str | None
    """``SLURM_JOB_ID``; None outside Slurm."""
    restart_count: int | None
    """``SLURM_RESTART_COUNT`` (times Slurm requeued the job); None outside Slurm."""
    restarts_used: int
    """Charged restarts the history showed at this start."""
    containment: str | None = None
    """How the job's processes are kept and ended: ``cgroup v2 (DIR)``, one group per
    attempt, or ``process tree (subreaper): WHY`` where no cgroup could be used."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptStarted(Event):
    """An attempt was launched; the line's ``attempt`` numbers it."""

    NAME = "attempt_started"
    LEVEL = "info"
    resume_step: int
    """The first step it runs: the loaded checkpoint's step + 1, or 0."""
    checkpoint: str | None
    """The checkpoint it resumes from; None when it starts from scratch."""
    launcher: tuple[str, ...]
    """The launcher's command line."""
    nnodes: int
    """Nodes it runs on."""
    nproc_per_node: int
    """Ranks per node."""
    slurm_job_id: str | None
    """``SLURM_JOB_ID``; None outside Slurm."""
    restart_count: int | None
    """``SLURM_RESTART_COUNT``; None outside Slurm."""
    resharded_from: int | None = None
    """The number of ranks that wrote the checkpoint it resumes from, when that differs from its
    own (the state is resharded); None otherwise."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointCommitted(Event):
    """A checkpoint was committed (renamed into place) during the attempt."""

    NAME = "checkpoint_committed"
    LEVEL = "info"
    DIGITS: ClassVar[Mapping[str, int]] = {"seconds": 4, "blocked_s": 4}
    step: int
    """The checkpoint's step."""
    path: str
    """Its directory."""
    seconds: float | None
    """From the start of the save to the commit; None when not measured."""
    bytes: int
    """Its size on disk."""
    source: str
    """Who saw the commit first: ``"sdk"`` (a rank's report), ``"watchdog"`` (the directory) or
    ``"found"`` (on disk at the next start: the attempt's supervisor was lost before it saw it)."""
    world_size: int | None = None
    """The number of ranks that wrote it."""
    format: int | None = None
    """Its manifest's format: 1 replicated state only, 2 with sharded state (``dcp/``)."""
    mode: str | None = None
    """``"sync"`` (training waited for the commit) or ``"async"`` (written in the background)."""
    blocked_s: float | None = None
    """How long the training loop was blocked by the save (async: while the state was staged)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointFailed(Event):
    """A save failed (on storage, or its background writer); nothing of it was committed,
    training went on."""

    NAME = "checkpoint_failed"
    LEVEL = "warning"
    step: int
    """The step whose checkpoint failed."""
    rank: int
    """The rank whose part failed."""
    reason: str
    """What went wrong (an exception, ENOSPC, the writer process killed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointSkipped(Event):
    """A torn or corrupt checkpoint was passed over on resume (the previous one was loaded)."""

    NAME = "checkpoint_skipped"
    LEVEL = "warning"
    path: str
    """The checkpoint skipped."""
    reason: str
    """What was wrong with it."""
    rank: int | None
    """The rank that found out; None if unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CheckpointLoaded(Event):
    """What the ranks loaded, as they report it; differs from attempt_started's when that one
    proved corrupt on reading."""

    NAME = "checkpoint_loaded"
    LEVEL = "info"
    resume_step: int
    """The first step the ranks run: the loaded checkpoint's step + 1, or 0."""
    checkpoint: str | None
    """The checkpoint loaded; None when the ranks start from scratch."""
    world_size: int | None = None
    """The number of ranks that wrote it; None when unknown or from scratch."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ColdStart(Event):
    """Ranks started cold instead of forked from the node's zygote, and why (another interpreter,
    an import-time variable that differs, an unsafe import, the zygote's death)."""

    NAME = "cold_start"
    LEVEL = "warning"
    ranks: tuple[int, ...]
    """The ranks concerned; empty: every rank of the node."""
    reason: str
    """One human sentence."""


@dataclass(frozen=True, slots=True, kw_only=True)
class FailureDetected(Event):
    """The attempt ended without success; ``kind`` says how."""

    NAME = "failure_detected"
    LEVEL = "error"
    DIGITS: ClassVar[Mapping[str, int]] = {"detect_s": 4}
    kind: str
    """``crash``, ``oom``, ``hang``, ``preempted``, ``timelimit``, ``node_failure``, ``stopped``."""
    ranks: tuple[int, ...]
    """The ranks implicated, the first failing (or furthest behind) first; may be empty."""
    exit_codes: tuple[int, ...]
    """Exit statuses of the implicated ranks that exited with a code."""
    signals: tuple[str, ...]
    """Names of the signals that killed implicated ranks, e.g. ``"SIGKILL"``."""
    last_step: int | None
    """The highest step any rank finished; None before the first."""
    detail: str
    """One human sentence."""
    diagnostics: str | None
    """The directory of the ranks' stacks (hangs); None if none were collected."""
    detect_s: float | None
    """From the first sign of the failure to its classification."""
    hang_timeout_s: float | None
    """The hang timeout in force; None when not known."""
    noticed_at: str | None
    """When the first sign was seen (ISO-8601 UTC)."""
    nodes: tuple[str, ...]
    """The nodes the failure is attributed to (``supervisor.rules.attribution``): the lost
    nodes, a crash's culprit's node, an OOM's nodes, a hang's culprits' nodes; none for a
    stop or a hang without a culprit."""
    node_ranks: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    """For each of ``nodes``, the ranks that ran on it (where to look for its GPUs and logs)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HealthChecked(Event):
    """A node's health checks ran (``[health]``): before the first attempt (``when``
    ``"start"``) or after a failure (``"failure"``); one line per node and round."""

    NAME = "health_checked"
    LEVEL = "info"
    DIGITS: ClassVar[Mapping[str, int]] = {"seconds": 3}
    node: str
    """The node checked."""
    healthy: bool
    """No check failed (a skipped check does not count)."""
    when: str
    """``"start"`` or ``"failure"``."""
    failed: Mapping[str, str]
    """Each failed check's name (``checkpoint_dir``, ``shm``, ``memory``, ``gpus``,
    ``command``) and why, with the command's output."""
    skipped: Mapping[str, str]
    """Each check that could not run here and why (no nvidia-smi, nothing configured)."""
    seconds: float
    """How long the round took on this node."""


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeExcluded(Event):
    """A node is excluded: no attempt of this job runs on it again, in this allocation or a
    requeued one (``supervisor.rules.health``)."""

    NAME = "node_excluded"
    LEVEL = "warning"
    node: str
    """Its host name."""
    reason: str
    """Why: a failed health check, or the failures attributed to it."""
    failures: int
    """Failures attributed to it so far."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AnomalyDetected(Event):
    """The training went wrong: a rank's loss was not finite or spiked above its baseline, or
    the DDP replicas' parameters differ; the attempt is ended and rolled back.
    """

    NAME = "anomaly_detected"
    LEVEL = "error"
    kind: str
    """``nonfinite_loss``, ``loss_spike`` or ``replicas_diverged``."""
    step: int
    """The step at which it was seen."""
    onset: int
    """The first step it may come from: checkpoints of this step or later are not trusted."""
    rank: int
    """The rank that reported the loss; the first that differs (``replicas_diverged``)."""
    value: float | None
    """The loss reported; None when not finite."""
    baseline: float | None
    """The median of the rank's recent losses (spikes); None for a non-finite loss."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RolledBack(Event):
    """The job goes back to a checkpoint from before an anomaly and skips the steps after it;
    the next attempt resumes past them.
    """

    NAME = "rolled_back"
    LEVEL = "warning"
    from_step: int
    """The step at which the anomaly was seen."""
    to_step: int | None
    """The checkpoint restored; None: the start (no checkpoint before the onset)."""
    resume_step: int
    """The step the next attempt starts at."""
    skipped_steps: int
    """Steps never trained on: from the restored checkpoint's next step to ``resume_step``."""
    onset: int
    """Checkpoints of this step or later were discarded."""
    discarded: tuple[int, ...]
    """The steps of the checkpoints discarded."""
    rollbacks_left: int
    """Rollbacks left in the budget after this one."""
    note: str
    """One human sentence."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RestartScheduled(Event):
    """The next attempt starts after a backoff."""

    NAME = "restart_scheduled"
    LEVEL = "warning"
    DIGITS: ClassVar[Mapping[str, int]] = {"backoff_s": 3}
    backoff_s: float
    """The delay before the next attempt."""
    restarts_left: int
    """Restarts left in the budget after this one."""
    charged: bool
    """The restart uses one from the budget."""
    deterministic: bool
    """The previous charged failure had the same kind, ranks and step."""
    note: str
    """One human sentence."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StopRequested(Event):
    """A stop was asked for: the ranks checkpoint at a common step, then exit."""

    NAME = "stop_requested"
    LEVEL = "info"
    reason: str
    """``preempted``, ``timelimit`` or ``stopped``."""
    source: str
    """Who asked: a signal's name, ``rvsup stop``, the time limit."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobSucceeded(Event):
    """The training ended: exit 0."""

    NAME = "job_succeeded"
    LEVEL = "info"
    last_step: int | None
    """The last step finished; None if unknown."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobGaveUp(Event):
    """The job ends without success: exit 3."""

    NAME = "job_gave_up"
    LEVEL = "error"
    reason: str
    """Why: the budget is spent, no progress, a failure configured to end the job."""


@dataclass(frozen=True, slots=True, kw_only=True)
class JobStopped(Event):
    """This allocation's run ended on a stop: exit 75, requeued where possible."""

    NAME = "job_stopped"
    LEVEL = "warning"
    reason: str
    """``preempted``, ``timelimit``, ``stopped``, or ``excluded`` (requeued away from the excluded
    nodes, docs/health.md)."""
    requeued: bool
    """The Slurm job was requeued."""
    step: int | None
    """The stop's checkpoint; None when the stop committed none."""
    note: str
    """One human sentence, or empty."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SlowPhase(Event):
    """Ranks went longer than the hang timeout without a finished step, but were working (or
    waiting on their own) while the others waited for them, so it was not taken for a hang:
    one line per such phase, when steps resume (or the attempt ends inside it)."""

    NAME = "slow_phase"
    LEVEL = "warning"
    DIGITS: ClassVar[Mapping[str, int]] = {"seconds": 3}
    ranks: tuple[int, ...]
    """The ranks that were busy, outside collectives."""
    where: str
    """Where the first of them was, ``train.py:90 in main``."""
    seconds: float
    """From the ranks' last finished step to the end of the phase."""
    finished: bool
    """True when steps resumed; false when the attempt ended inside the phase."""
    detail: str
    """What each silent rank was doing."""
    hint: str
    """What to do about it (declare the phase with ``worker_sdk.phase()``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerDetected(Event):
    """One rank makes the others wait: in DDP's gradient all-reduce or FSDP's all-gathers and
    reduce-scatters, the other ranks wait for it a share of every step (at least 20 %) over a
    recent window. Logged when it is first named
    (again after another rank was, or after none was for a window); the job goes on."""

    NAME = "straggler_detected"
    LEVEL = "warning"
    DIGITS: ClassVar[Mapping[str, int]] = {
        "slower": 2,
        "lost_s": 3,
        "lost_per_step_s": 4,
        "step_s": 4,
        "window_s": 1,
    }
    rank: int
    """The rank the others wait for."""
    node: str | None
    """The node (host name) it runs on; None when its hello was not heard."""
    slower: float
    """Its compute time per step (the step less its wait) over the median of the other ranks'
    (2.0: it computes twice as long)."""
    lost_s: float
    """Seconds the other ranks spent waiting for it over the window (the median rank's wait
    less its own)."""
    lost_per_step_s: float
    """Seconds per step the other ranks wait for it (the median of theirs less its own)."""
    step_s: float
    """Seconds per step over the window (the median rank's median)."""
    window_s: float
    """The span of the samples judged, in seconds."""
    samples: int
    """The fewest samples a judged rank had in the window."""
    exclude_node: bool
    """``[health] exclude_stragglers``: its node is to be excluded at the next restart."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitStalled(Event):
    """Every rank's script had ended without a failure, but some interpreters had not exited
    after a grace period: they were ended by the teardown and the attempt counts as succeeded."""

    NAME = "exit_stalled"
    LEVEL = "warning"
    DIGITS: ClassVar[Mapping[str, int]] = {"waited_s": 3}
    ranks: tuple[int, ...]
    """The ranks whose processes were still there."""
    waited_s: float
    """How long they had had since the last rank said its script ended."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ExitAborted(Event):
    """A rank whose script had ended was killed by a signal while its interpreter shut down
    (an extension's destructor, an ``atexit`` hook): its training was done, so when every rank's
    script ended and none reported a failure, the attempt counts as succeeded."""

    NAME = "exit_aborted"
    LEVEL = "warning"
    rank: int
    """The rank whose process aborted."""
    signal: str
    """The signal's name, e.g. ``SIGABRT``."""
    last_step: int | None
    """The rank's last finished step."""
    stderr_tail: str
    """The last lines the rank wrote to its stderr (what the abort printed)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessesEnded(Event):
    """A teardown ended every process of the attempt (`scope` "attempt"), at the job's end
    anything left in the job's groups once the zygote and standby ended (`scope` "job"; no
    line when nothing was), or at the start
    what a killed rvsup left in its groups (`scope` "previous"): how many, how many needed
    SIGKILL after the SIGTERM grace, and how."""

    NAME = "processes_ended"
    LEVEL = "info"
    DIGITS: ClassVar[Mapping[str, int]] = {"seconds": 3}
    scope: str
    """``"attempt"``, ``"job"`` or ``"previous"``."""
    mechanism: str
    """How they were found: ``cgroup v2 (DIR)``, or ``process tree (subreaper)``."""
    ended: int
    """Processes found and ended."""
    sigkilled: int
    """Of those, still alive after their SIGTERM grace and sent SIGKILL (a single-node
    torchrun, which is sent SIGKILL alone by design, is not counted)."""
    seconds: float
    """How long the teardown took."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ProcessesLeft(Event):
    """Processes a teardown could not end, not even with SIGKILL (uninterruptible sleep, a
    process of another user), named so that they are not silently left behind."""

    NAME = "processes_left"
    LEVEL = "error"
    scope: str
    """``"attempt"``, ``"job"`` or ``"previous"``."""
    processes: tuple[str, ...]
    """Each as ``PID STATE COMMAND``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MessagesDropped(Event):
    """Malformed or unauthenticated messages were dropped."""

    NAME = "messages_dropped"
    LEVEL = "warning"
    counts: Mapping[str, int]
    """Dropped messages by reason."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RequeueFailed(Event):
    """Asking Slurm to requeue the job failed (the job stops anyway)."""

    NAME = "requeue_failed"
    LEVEL = "error"
    job_id: str
    """The Slurm job."""
    error: str
    """What Slurm said."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TimeLeftUnknown(Event):
    """Slurm could not say how much time the allocation has left (asked again later)."""

    NAME = "time_left_unknown"
    LEVEL = "warning"
    error: str
    """What Slurm said."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SupervisorError(Event):
    """A bug in the daemon: it tore the job's processes down and exited 1."""

    NAME = "supervisor_error"
    LEVEL = "error"
    error: str
    """The exception (its ``repr``)."""
    traceback: str
    """Its formatted traceback."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AttemptClosed(Event):
    """A later ``rvsup start`` closed an attempt whose supervisor died before it could log the
    attempt's end (SIGKILL, a lost node); the line's ``attempt`` is the closed one."""

    NAME = "attempt_closed"
    LEVEL = "warning"
    outcome: str
    """How it ended, as far as can be known: ``"supervisor lost"``."""
    last_seen: str | None
    """When it was last known alive (its last event, or its ranks' last step), ISO-8601 UTC."""
    last_step: int | None
    """The last step any of its ranks on this node finished (their step slots), if known."""


_CLASSES: Final = (
    JobStarted,
    AttemptStarted,
    CheckpointCommitted,
    CheckpointFailed,
    CheckpointSkipped,
    CheckpointLoaded,
    ColdStart,
    FailureDetected,
    HealthChecked,
    NodeExcluded,
    AnomalyDetected,
    RolledBack,
    RestartScheduled,
    StopRequested,
    JobSucceeded,
    JobGaveUp,
    JobStopped,
    ExitStalled,
    ExitAborted,
    SlowPhase,
    StragglerDetected,
    ProcessesEnded,
    ProcessesLeft,
    MessagesDropped,
    RequeueFailed,
    TimeLeftUnknown,
    SupervisorError,
    AttemptClosed,
)
EVENTS: Final[Mapping[str, type[Event]]] = types.MappingProxyType(
    {cls.NAME: cls for cls in _CLASSES}
)
"""Every event, by name, in the order docs/events.md lists them."""


# ---------------------------------------------------------------- writing


def to_json(event: Event) -> dict[str, object]:
    """The event's fields as a line holds them, in declaration order (tuples as lists)."""
    return typed_json.to_json(event)


def describe() -> str:
    """The events as a Markdown table (docs/events.md's summary): name, level, meaning, fields and
    types."""
    lines = ["| event | level | what | fields |", "|---|---|---|---|"]
    for name, cls in EVENTS.items():
        first_paragraph = (cls.__doc__ or "").strip().split("\n\n")[0]
        doc = " ".join(first_paragraph.split()).replace("``", "`")
        specs = ", ".join(f"`{s.name}` ({s.json_type})" for s in typed_json.specs(cls))
        lines.append(f"| `{name}` | {cls.LEVEL} | {doc} | {specs} |")
    return "\n".join(lines)
