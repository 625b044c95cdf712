"""The goodput simulator's model: failures, how each system recovers, and a run replayed.

A synchronous training job does ``work_s`` seconds of useful training. It advances at the rate
its saves leave it (each storage checkpoint and memory snapshot stalls the training for a fixed
time), and failures interrupt it. Each failure has a *manifestation* (:data:`Manifest`): a
process ends with an error (``crash``), the ranks stop making progress but live on (``hang``),
or a node vanishes with everything on it (``node``); and it may need its node replaced. A
system's :class:`Recovery` says what each costs: the time to notice it, the delay its restart
policy waits, the time until every rank steps again, the load of the state, and the work
redone since the newest state it can restore (a storage checkpoint, or, with a memory tier, a
snapshot kept on another node as well).

:func:`replay` runs one trace (the failures' wall-clock times and kinds) exactly,
:func:`replay_by_progress` one given by the training's progress (a benchmark's fault steps);
:func:`simulate` draws the failures as a Poisson process in wall-clock time. Failures during a
recovery are not drawn: the next one is drawn from the moment training resumes (second order
while recoveries take minutes and failures come hours apart). The effective training time
ratio (ETTR) is ``work_s`` over the wall time.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Literal, TypeAlias

__all__ = [
    "Checkpointing",
    "Failure",
    "FaultClass",
    "Manifest",
    "Recovery",
    "RunResult",
    "replay",
    "replay_by_progress",
    "simulate",
    "training_rate",
]

Manifest: TypeAlias = Literal["crash", "hang", "node"]


@dataclass(frozen=True)
class FaultClass:
    """A cause of interruptions: how often (``count`` in the source's breakdown), how it shows,
    and whether its node must be replaced before the job goes on."""

    name: str
    count: int
    manifest: Manifest
    replace_node: bool


@dataclass(frozen=True)
class Failure:
    """One failure of a trace: when (wall-clock seconds from the job's start) and which."""

    at_s: float
    fault: FaultClass


@dataclass(frozen=True)
class Checkpointing:
    """Where a run's state is saved and what each save stalls (seconds of training time)."""

    storage_every_s: float
    storage_stall_s: float
    memory_every_s: float | None = None  # None: no memory tier
    memory_stall_s: float = 0.0

    def __post_init__(self) -> None:
        if self.storage_every_s <= 0 or (
            self.memory_every_s is not None and self.memory_every_s <= 0
        ):
            raise ValueError("intervals must be positive")
        if self.storage_stall_s < 0 or self.memory_stall_s < 0:
            raise ValueError("stalls must be >= 0")

    def restorable(self, progress_s: float, *, from_memory: bool) -> float:
        """The newest saved progress at ``progress_s``: a storage checkpoint's, or a memory
        snapshot's when ``from_memory`` and there is a tier."""
        newest = _floor_to(progress_s, self.storage_every_s)
        if from_memory and self.memory_every_s is not None:
            newest = max(newest, _floor_to(progress_s, self.memory_every_s))
        return newest


def _floor_to(value: float, every: float) -> float:
    """The largest multiple of ``every`` not above ``value``; a value a rounding error below a
    multiple (a fault at a save's step, both in seconds) counts as at it."""
    return math.floor(value / every + 1e-9) * every


def training_rate(c: Checkpointing) -> float:
    """Seconds of training per wall-clock second while the job runs: each interval of training
    pays its save's stall."""
    per_s = c.storage_stall_s / c.storage_every_s
    if c.memory_every_s is not None:
        per_s += c.memory_stall_s / c.memory_every_s
    return 1.0 / (1.0 + per_s)


@dataclass(frozen=True)
class Recovery:
    """What a system spends on each failure (seconds), as functions of nothing but the failure
    and the number of restarts before it."""

    name: str
    cold_start_s: float  # launch -> every rank's first step, once per run
    notice_s: dict[Manifest, float]  # the failure -> the system knows
    restart_s: dict[Manifest, float]  # noticed -> every rank steps again, the load excluded
    replace_s: dict[Manifest, float]  # added when the node must go (a spare, or a requeue)
    load_storage_s: float  # the state read from storage
    load_memory_s: float | None = None  # from the memory tier; None: the system has none
    memory_survives: frozenset[Manifest] = frozenset({"crash", "hang", "node"})
    # the restart policy's delay: (restarts used, restarts in a row after attempts without
    # progress, 0 when the attempt that failed progressed) -> seconds
    backoff: Callable[[int, int, random.Random], float] = field(default=lambda n, r, rng: 0.0)

    def downtime(
        self,
        fault: FaultClass,
        restarts: tuple[int, int],
        rng: random.Random,
        *,
        from_memory: bool,
    ) -> float:
        """From the failure to the training going on again, redone work excluded;
        ``restarts``: used, and in a row without progress (see ``backoff``); ``from_memory``:
        the state is loaded from the memory tier (:meth:`from_memory`), else from storage."""
        m = fault.manifest
        t = self.notice_s[m] + self.backoff(*restarts, rng) + self.restart_s[m]
        if fault.replace_node:
            t += self.replace_s[m]
        if from_memory and self.load_memory_s is not None:
            return t + self.load_memory_s
        return t + self.load_storage_s

    def from_memory(self, fault: FaultClass, checkpointing: Checkpointing) -> bool:
        """Whether this failure's restore reads the memory tier (the system has one, the run
        snapshots, and the snapshots survive this failure)."""
        return (
            self.load_memory_s is not None
            and checkpointing.memory_every_s is not None
            and fault.manifest in self.memory_survives
        )


@dataclass
class RunResult:
    """One run replayed or simulated: its wall time and where it went."""

    work_s: float
    wall_s: float = 0.0
    failures: int = 0
    redone_s: float = 0.0  # training done again after restores
    down_s: float = 0.0  # failures' downtime (notice, backoff, restart, replace, load)
    stall_s: float = 0.0  # saves' stalls

    @property
    def ettr(self) -> float:
        return self.work_s / self.wall_s if self.wall_s > 0 else 0.0


def replay(
    work_s: float,
    failures: Sequence[Failure],
    recovery: Recovery,
    checkpointing: Checkpointing,
    rng: random.Random | None = None,
) -> RunResult:
    """The run through the trace ``failures`` (by their ``at_s``; one that falls in a recovery,
    or after the end, is skipped): exact within the model."""
    pending = iter(sorted(failures, key=lambda f: f.at_s))

    def next_failure(after_s: float) -> Failure | None:
        for f in pending:
            if f.at_s >= after_s:
                return f
        return None

    return _run(
        work_s, recovery, checkpointing, rng or random.Random(0), lambda t, p: next_failure(t)
    )


def replay_by_progress(
    work_s: float,
    faults: Sequence[tuple[float, FaultClass]],
    recovery: Recovery,
    checkpointing: Checkpointing,
    rng: random.Random | None = None,
) -> RunResult:
    """The run with each of ``faults`` (progress in seconds of training, increasing) firing
    once, when the training first reaches it: a benchmark's fault schedule, given by step."""
    pending = sorted(faults, key=lambda f: f[0])
    rate = training_rate(checkpointing)

    def next_failure(t: float, progress: float) -> Failure | None:
        if not pending:
            return None
        at, fault = pending.pop(0)
        return Failure(t + max(0.0, at - progress) / rate, fault)

    return _run(work_s, recovery, checkpointing, rng or random.Random(0), next_failure)


def simulate(
    work_s: float,
    rate_per_s: float,
    mix: Sequence[FaultClass],
    recovery: Recovery,
    checkpointing: Checkpointing,
    rng: random.Random,
) -> RunResult:
    """The run with failures drawn at ``rate_per_s`` (Poisson), each of a class drawn from
    ``mix`` by its count."""
    if rate_per_s < 0:
        raise ValueError("the failure rate must be >= 0")
    weights = [c.count for c in mix]

    def next_failure(after_s: float) -> Failure | None:
        if rate_per_s == 0:
            return None
        at = after_s + rng.expovariate(rate_per_s)
        return Failure(at, rng.choices(mix, weights)[0])

    return _run(work_s, recovery, checkpointing, rng, lambda t, p: next_failure(t))


def _run(
    work_s: float,
    recovery: Recovery,
    checkpointing: Checkpointing,
    rng: random.Random,
    next_failure: Callable[[float, float], Failure | None],
) -> RunResult:
    if work_s <= 0:
        raise ValueError("work_s must be positive")
    rate = training_rate(checkpointing)
    out = RunResult(work_s)
    t = recovery.cold_start_s
    progress = 0.0  # training done, redone work counted once
    resumed = 0.0  # the progress the attempt under way started from
    in_a_row = 0  # restarts in a row after attempts that saved nothing newer (the budget's
    # no-progress streak: supervisor/rules/budget.py)
    failure = next_failure(t, progress)
    while True:
        finish_t = t + (work_s - progress) / rate
        if failure is None or failure.at_s >= finish_t:
            out.stall_s += (finish_t - t) * (1 - rate)
            t = finish_t
            break
        out.stall_s += (failure.at_s - t) * (1 - rate)
        progress += (failure.at_s - t) * rate
        memory = recovery.from_memory(failure.fault, checkpointing)
        restored = checkpointing.restorable(progress, from_memory=memory)
        out.redone_s += progress - restored
        progressed = restored > resumed
        progress = resumed = restored
        restarts = (out.failures, 0 if progressed else in_a_row)
        down = recovery.downtime(failure.fault, restarts, rng, from_memory=memory)
        in_a_row = 0 if progressed else in_a_row + 1
        out.failures += 1
        out.down_s += down
        t = failure.at_s + down
        failure = next_failure(t, progress)
    out.wall_s = t
    return out
