"""Fault schedules: drawn from a seed, written as one line, parsed back for a replay.

A schedule is the restart budget of the job, its rollback budget, and an ordered list of faults,
each aimed at one attempt (1-based) and one step. Every attempt but the last ends with exactly
one *ending* fault (or a pair of them on both ranks at the same step); an ``enospc`` fault fills
the checkpoint file system from its step for :data:`ENOSPC_STEPS` steps and does not end its
attempt; ``corrupt`` and ``truncate`` damage the newest committed checkpoint after an attempt that
ended with rvsup itself stopped or killed (between two ``rvsup start``).

Kinds (see :data:`KINDS`): inside a rank (the test trainer's fault switches) ``kill``, ``raise``,
``oom``, ``sigstop``, ``stuck`` (a receive nobody sends: the rank blocks inside gloo), ``nan`` (a
poisoned batch: that rank's loss is NaN at that step of that attempt only); from outside ``term``
and ``usr1`` (the signal to rvsup, then ``rvsup start`` again, as a requeue would),
``daemonkill`` (SIGKILL of rvsup, then ``rvsup start`` again), ``savekill`` (kill -9 of a rank
while a checkpoint is being written, aimed at the save).

With the memory tier on (``--memory``), five more (:data:`MEMORY`): ``snapkill`` (kill -9 of a
rank while a snapshot is being written into ``memory_dir``, aimed at it as ``savekill`` at a
save), ``zygotekill`` (kill -9 of the node's zygote, whose ranks die with it: the next attempt
starts a zygote again, and the snapshots, files in ``memory_dir``, outlive it), ``writerkill``
(kill -9 of the snapshot writers forked beside the ranks at a step; the attempt goes on, and
does not end by it), ``shmfull`` (``memory_dir``, a small tmpfs, full for :data:`SHMFULL_STEPS`
steps, as ``enospc`` fills the checkpoints') and ``shmcorrupt`` (a flipped byte in the newest
snapshot, after rvsup itself was killed: the only end of a job that leaves its snapshots).

A ``nan`` is not a failure of the processes but of the training: rvsup rolls the job back to the
newest checkpoint before the step and resumes :data:`SKIP_STEPS` steps past it (the chaos job's
``[anomaly] skip_steps``), charging ``max_rollbacks``, not ``max_restarts``. It mixes with every
other fault: the steps it skips stay skipped whatever a later attempt loads (a crash after the
rollback, a stop, a killed daemon whose successor folds the rollback from the history), which is
what mixing checks; the only constraint is that no later fault aims below the step the rollback
resumes at (it would never strike). A ``nan`` that falls within ``skip_steps`` of the previous
rollback's resume step is, by rvsup's rule, deterministic: the job gives up (exit 3); draws make
that rare on purpose. It is drawn twice as often as each other ending kind: it is the only fault
of the training itself, and the one whose resume and final state differ most from the others'.

The line format, one fault per ``kind:rank:step:attempt`` (rank ``-`` when none), with
``max_rollbacks=N`` after the restart budget when the schedule has a ``nan``::

    max_restarts=3 kill:1:23:1 kill:0:31:2 raise:1:31:2 term:-:40:3 corrupt:-:0:3
    max_restarts=1 max_rollbacks=2 nan:0:14:1 kill:1:20:2
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CHARGED",
    "DAMAGE",
    "ENDING",
    "ENOSPC_STEPS",
    "EXTERNAL",
    "IN_RANK",
    "KEEP_LAST",
    "KINDS",
    "LAST_STEP",
    "MEMORY",
    "ROLLED_BACK",
    "SHMFULL_STEPS",
    "SKIP_STEPS",
    "STORAGE_KINDS",
    "TOTAL_STEPS",
    "Fault",
    "Rollback",
    "Schedule",
    "draw",
    "parse",
]

TOTAL_STEPS = 80
"""Steps of every chaos job (checkpoints every 10: steps 9, 19, ...)."""
KEEP_LAST = 3
"""The chaos job's ``[checkpoint] keep_last`` (the default)."""
ENOSPC_STEPS = 12
"""Steps for which an ``enospc`` fault keeps the checkpoint file system full (one save falls in)."""
SHMFULL_STEPS = 8
"""Steps for which a ``shmfull`` fault keeps ``memory_dir`` full (snapshots every few steps)."""
SKIP_STEPS = 3
"""The chaos job's ``[anomaly] skip_steps``: a rollback after a NaN at step s resumes at s + 3."""
MAX_ROLLBACKS = 3
"""``[anomaly] max_rollbacks`` of a schedule whose line does not say (rvsup's default)."""

IN_RANK = ("kill", "raise", "oom", "sigstop", "stuck", "nan")
EXTERNAL = ("term", "usr1", "daemonkill", "savekill", "snapkill", "zygotekill")
ENDING = IN_RANK + EXTERNAL
DAMAGE = ("corrupt", "truncate")
MEMORY = ("snapkill", "zygotekill", "writerkill", "shmfull", "shmcorrupt")
"""The memory tier's faults: drawn only when the campaign runs with it on."""
KINDS = (*ENDING, "enospc", *DAMAGE, "writerkill", "shmfull", "shmcorrupt")
STORAGE_KINDS = tuple(k for k in KINDS if k not in MEMORY)
"""The kinds of a campaign with the memory tier off."""
CHARGED = frozenset(
    {"kill", "raise", "oom", "sigstop", "stuck", "savekill", "snapkill", "zygotekill"}
)
"""Ending kinds that spend one restart of the budget (stops and a lost daemon do not)."""
ROLLED_BACK = frozenset({"nan"})
"""Ending kinds answered by a rollback: they spend one of ``max_rollbacks``, no restart."""
FAILURE_KIND = {
    "kill": "crash",
    "raise": "crash",
    "savekill": "crash",
    "snapkill": "crash",
    "zygotekill": "crash",
    "oom": "oom",
    "sigstop": "hang",
    "stuck": "hang",
    "nan": "nonfinite_loss",
}
"""The ``failure_detected`` kind each charged or rolled-back fault must be reported as."""

_FIRST_STEP = 3  # the first attempt has finished a few steps before anything strikes
_AFTER_EXTERNAL = 15  # an outside fault lands a few steps after its aim; the next one waits
_AFTER_WRITERS = 5  # the writers are killed a few steps after their aim: the ending comes after
LAST_STEP = TOTAL_STEPS - 8
"""The last step a fault aims at (the runner slows the steps from here on)."""


@dataclass(frozen=True, slots=True)
class Fault:
    """One fault: what, on which rank (``None`` for outside faults), at which step, in which
    attempt."""

    kind: str
    attempt: int
    step: int
    rank: int | None = None

    def text(self) -> str:
        rank = "-" if self.rank is None else str(self.rank)
        return f"{self.kind}:{rank}:{self.step}:{self.attempt}"


@dataclass(frozen=True, slots=True)
class Rollback:
    """What a ``nan`` fault that rvsup rolls back must lead to (rvsup's documented rule)."""

    attempt: int
    """The attempt the NaN ended."""
    step: int
    """The NaN's step: where it is seen, and its onset (a float loss is checked every step)."""
    resume: int
    """Where every later attempt starts at the earliest: ``max(step + 1, step + SKIP_STEPS)``."""
    rollbacks_left: int


@dataclass(frozen=True, slots=True)
class Schedule:
    """A run's faults, the job's ``restart.max_restarts`` and ``anomaly.max_rollbacks``."""

    max_restarts: int
    faults: tuple[Fault, ...]
    max_rollbacks: int = MAX_ROLLBACKS

    def text(self) -> str:
        budgets = [f"max_restarts={self.max_restarts}"]
        if self.has_nan or self.max_rollbacks != MAX_ROLLBACKS:
            budgets.append(f"max_rollbacks={self.max_rollbacks}")
        return " ".join([*budgets, *(f.text() for f in self.faults)])

    def in_attempt(self, attempt: int) -> list[Fault]:
        return [f for f in self.faults if f.attempt == attempt]

    def ending(self, attempt: int) -> list[Fault]:
        """The fault(s) that end ``attempt`` (empty: it runs to the end)."""
        return [f for f in self.in_attempt(attempt) if f.kind in ENDING]

    def _walk(self) -> tuple[int, str | None, tuple[Rollback, ...]]:
        """``(attempts, why the job gives up or None, the rollbacks)``: the restart budget, the
        rollback budget and the deterministic rule applied attempt by attempt."""
        charged = 0
        rollbacks: list[Rollback] = []
        for attempt in range(1, len(self.faults) + 2):
            ending = self.ending(attempt)
            if not ending:
                return attempt, None, tuple(rollbacks)
            kind, step = ending[0].kind, ending[0].step
            if kind in CHARGED:
                charged += 1
                if charged > self.max_restarts:
                    return attempt, "restart budget", tuple(rollbacks)
            elif kind in ROLLED_BACK:
                back = rollbacks[-1].resume if rollbacks else None
                if back is not None and back <= step < back + SKIP_STEPS:
                    return attempt, "deterministic", tuple(rollbacks)
                if len(rollbacks) >= self.max_rollbacks:
                    return attempt, "rollback budget", tuple(rollbacks)
                left = self.max_rollbacks - len(rollbacks) - 1
                resume = max(step + 1, step + SKIP_STEPS)
                rollbacks.append(Rollback(attempt, step, resume, left))
        raise AssertionError("unreachable: an attempt without a fault ends the job")

    @property
    def attempts(self) -> int:
        """Attempts the job runs (the last one ends the job)."""
        return self._walk()[0]

    @property
    def gives_up(self) -> bool:
        return bool(self.ending(self.attempts))

    @property
    def gives_up_because(self) -> str | None:
        """``"restart budget"``, ``"rollback budget"``, ``"deterministic"`` or None."""
        return self._walk()[1]

    @property
    def rollbacks(self) -> tuple[Rollback, ...]:
        """The ``nan`` faults rvsup rolls back, in order."""
        return self._walk()[2]

    def skip_to(self, attempt: int) -> int | None:
        """The step no part of ``attempt`` may start before: the newest earlier rollback's."""
        earlier = [r.resume for r in self.rollbacks if r.attempt < attempt]
        return earlier[-1] if earlier else None

    @property
    def exit_code(self) -> int:
        """What the last ``rvsup start`` must exit with: 3 when it gives up, else 0."""
        return 3 if self.gives_up else 0

    @property
    def has_nan(self) -> bool:
        return any(f.kind == "nan" for f in self.faults)

    @property
    def needs_tmpfs(self) -> bool:
        """Whether a file system is filled: the checkpoints' or ``memory_dir`` (root mounts a
        small tmpfs for it)."""
        return any(f.kind in ("enospc", "shmfull") for f in self.faults)

    @property
    def fills_checkpoints(self) -> bool:
        return any(f.kind == "enospc" for f in self.faults)

    @property
    def fills_memory(self) -> bool:
        return any(f.kind == "shmfull" for f in self.faults)

    @property
    def aims_at_saves(self) -> bool:
        """Whether a kill is aimed at a save (a large ballast makes it last)."""
        return any(f.kind == "savekill" for f in self.faults)

    @property
    def uses_memory(self) -> bool:
        """Whether a fault needs the memory tier on."""
        return any(f.kind in MEMORY for f in self.faults)

    def trainer_faults(self) -> str:
        """The trainer's ``FAULT`` switches for the in-rank faults."""
        switch = {"stuck": "mismatch"}
        out = []
        for f in self.faults:
            if f.kind in IN_RANK:
                out.append(f"{switch.get(f.kind, f.kind)}:{f.rank}:{f.step}:{f.attempt}")
            elif f.kind == "enospc":
                out.append(f"fill:{f.rank}:{f.step}:{f.attempt}")
                out.append(f"unfill:{f.rank}:{f.step + ENOSPC_STEPS}:{f.attempt}")
            elif f.kind == "shmfull":
                out.append(f"shmfill:{f.rank}:{f.step}:{f.attempt}")
                out.append(f"shmunfill:{f.rank}:{f.step + SHMFULL_STEPS}:{f.attempt}")
        return ",".join(out)


def parse(text: str) -> Schedule:
    """The schedule a :meth:`Schedule.text` line describes; ``ValueError`` saying what is wrong."""
    head, *items = text.split()
    key, _, value = head.partition("=")
    if key != "max_restarts" or not value.isdigit():
        raise ValueError(f"a schedule starts with max_restarts=N, not {head!r}")
    rollbacks = MAX_ROLLBACKS
    if items and items[0].startswith("max_rollbacks="):
        count = items.pop(0).partition("=")[2]
        if not count.isdigit():
            raise ValueError(f"max_rollbacks=N takes a count, not {count!r}")
        rollbacks = int(count)
    faults = []
    for item in items:
        parts = item.split(":")
        if len(parts) != 4 or parts[0] not in KINDS:
            raise ValueError(f"{item!r}: expected kind:rank:step:attempt, kind one of {KINDS}")
        kind, rank, step, attempt = parts
        faults.append(Fault(kind, int(attempt), int(step), None if rank == "-" else int(rank)))
    return Schedule(int(value), tuple(faults), rollbacks)


def draw(
    rng: random.Random, *, kinds: Sequence[str] = STORAGE_KINDS, max_endings: int = 3
) -> Schedule:
    """A random schedule of 1..``max_endings`` ending faults, using only ``kinds``.

    Steps are drawn so that every fault strikes: the next attempt resumes at most where the
    previous fault struck (at most a few steps later after an outside one; exactly
    :data:`SKIP_STEPS` later after a ``nan``), and every fault lies before the last steps of
    the job. A ``nan`` within ``skip_steps`` of the previous rollback's resume step (which
    rvsup calls deterministic) is moved past that window three times in four.
    """
    # a full disk and a save made large to be aimed at do not fit together: one or the other
    full_disk = "enospc" in kinds and rng.random() < 0.3
    full_shm = "shmfull" in kinds and rng.random() < 0.3
    aimed = ("savekill", "snapkill")
    filled = full_disk or full_shm  # a small tmpfs holds no ballast
    ending_kinds = [k for k in ENDING if k in kinds and not (filled and k in aimed)]
    ending_kinds += ["pair"] if "kill" in kinds else []
    ending_kinds += ["nan"] if "nan" in kinds else []  # twice as likely (module docstring)
    faults: list[Fault] = []
    low = _FIRST_STEP
    previous = 0  # the step the previous attempt's fault struck at
    skip_to: int | None = None  # the newest rollback's resume step
    attempt = 1
    for _ in range(rng.randint(1, max_endings)):
        if "writerkill" in kinds and rng.random() < 0.3 and low < LAST_STEP:
            writers = rng.randint(low, min(low + 6, LAST_STEP - 1))
            faults.append(Fault("writerkill", attempt, writers))  # then the ending, later
            low = writers + _AFTER_WRITERS
        if full_disk and rng.random() < 0.5 and low + ENOSPC_STEPS + 2 < LAST_STEP:
            fill = rng.randint(low, min(low + 6, LAST_STEP - ENOSPC_STEPS - 2))
            faults.append(Fault("enospc", attempt, fill, 0))
            low = fill + ENOSPC_STEPS + 1
        if full_shm and rng.random() < 0.5 and low + SHMFULL_STEPS + 2 < LAST_STEP:
            fill = rng.randint(low, min(low + 6, LAST_STEP - SHMFULL_STEPS - 2))
            faults.append(Fault("shmfull", attempt, fill, 0))
            low = fill + SHMFULL_STEPS + 1
        if low > LAST_STEP:
            break
        step = rng.randint(low, min(low + 10, LAST_STEP))
        kind = rng.choice(ending_kinds)
        if kind in aimed and any(f.kind in aimed and f.kind != kind for f in faults):
            kind = "kill"  # a save's ballast makes snapshots rare ("auto"): one aim or the other
        writers_killed = any(f.kind == "writerkill" and f.attempt == attempt for f in faults)
        if kind == "snapkill" and writers_killed:
            kind = "kill"  # new writers import torch for seconds: no snapshot to aim at then
        if kind in ("sigstop", "stuck"):  # a step done first, else the startup timeout applies
            step = max(step, previous + 2)
        past = LAST_STEP + 1 if skip_to is None else skip_to + SKIP_STEPS  # a fresh NaN from
        if kind == "nan" and step < past <= LAST_STEP and rng.random() < 0.75:
            step = past
        if kind == "pair":  # two faults close together: both ranks, the same step
            first, second = rng.choice([("kill", "kill"), ("kill", "raise"), ("raise", "kill")])
            faults += [Fault(first, attempt, step, 0), Fault(second, attempt, step, 1)]
        elif kind in IN_RANK:
            faults.append(Fault(kind, attempt, step, rng.randrange(2)))
        elif kind in ("savekill", "snapkill"):  # aimed at the next save (snapshot) after it
            step = min(step, TOTAL_STEPS - 20)
            faults.append(Fault(kind, attempt, step, rng.randrange(2)))
        else:
            faults.append(Fault(kind, attempt, step))
        if kind in ("term", "usr1", "daemonkill") and rng.random() < 0.4:
            faults.append(Fault(rng.choice(DAMAGE), attempt, 0))
        if kind == "daemonkill" and "shmcorrupt" in kinds and rng.random() < 0.6:
            faults.append(Fault("shmcorrupt", attempt, 0))
        previous = step
        if kind == "nan":  # the next attempt starts past the skipped steps
            skip_to = max(step + 1, step + SKIP_STEPS)
            previous = skip_to - 1
        after = _AFTER_EXTERNAL if kind in EXTERNAL else rng.choice([0, 1, 2, 5, 10])
        low = previous + (1 if kind == "nan" else 0) + after
        attempt += 1
    draft = Schedule(0, tuple(faults), 0)
    charged = sum(1 for a in range(1, attempt) if draft.ending(a)[0].kind in CHARGED)
    nans = sum(1 for a in range(1, attempt) if draft.ending(a)[0].kind in ROLLED_BACK)
    runs_out = bool(charged) and rng.random() < 0.15  # then rvsup must give up, exit 3
    budget = charged - 1 if runs_out else charged + rng.randint(0, 2)
    rollbacks_out = bool(nans) and rng.random() < 0.15
    rollbacks = nans - 1 if rollbacks_out else nans + rng.randint(0, 1)
    return _cut_at_give_up(Schedule(budget, tuple(faults), rollbacks if nans else MAX_ROLLBACKS))


def _cut_at_give_up(s: Schedule) -> Schedule:
    last = s.attempts
    return Schedule(
        s.max_restarts, tuple(f for f in s.faults if f.attempt <= last), s.max_rollbacks
    )
