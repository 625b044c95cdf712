"""Fault schedules: drawn from a seed, written as one line, parsed back for a replay.

A schedule is the restart budget of the job and an ordered list of faults, each aimed at one
attempt (1-based) and one step. Every attempt but the last ends with exactly one *ending* fault
(or a pair of them on both ranks at the same step); an ``enospc`` fault fills the checkpoint
file system from its step for :data:`ENOSPC_STEPS` steps and does not end its attempt;
``corrupt`` and ``truncate`` damage the newest committed checkpoint after an attempt that ended
with rvsup itself stopped or killed (between two ``rvsup start``).

Kinds (see :data:`KINDS`): inside a rank (the test trainer's fault switches) ``kill``, ``raise``,
``oom``, ``sigstop``, ``stuck`` (a receive nobody sends: the rank blocks inside gloo); from outside
``term`` and ``usr1`` (the signal to rvsup, then ``rvsup start`` again, as a requeue would),
``daemonkill`` (SIGKILL of rvsup, then ``rvsup start`` again), ``savekill`` (kill -9 of a rank
while a checkpoint is being written, aimed at the save).

The line format, one fault per ``kind:rank:step:attempt`` (rank ``-`` when none)::

    max_restarts=3 kill:1:23:1 kill:0:31:2 raise:1:31:2 term:-:40:3 corrupt:-:0:3
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

__all__ = [
    "CHARGED",
    "ENDING",
    "ENOSPC_STEPS",
    "EXTERNAL",
    "IN_RANK",
    "KINDS",
    "LAST_STEP",
    "TOTAL_STEPS",
    "Fault",
    "Schedule",
    "draw",
    "parse",
]

TOTAL_STEPS = 80
"""Steps of every chaos job (checkpoints every 10: steps 9, 19, ...)."""
ENOSPC_STEPS = 12
"""Steps for which an ``enospc`` fault keeps the checkpoint file system full (one save falls in)."""

IN_RANK = ("kill", "raise", "oom", "sigstop", "stuck")
EXTERNAL = ("term", "usr1", "daemonkill", "savekill")
ENDING = IN_RANK + EXTERNAL
DAMAGE = ("corrupt", "truncate")
KINDS = (*ENDING, "enospc", *DAMAGE)
CHARGED = frozenset({"kill", "raise", "oom", "sigstop", "stuck", "savekill"})
"""Ending kinds that spend one restart of the budget (stops and a lost daemon do not)."""
FAILURE_KIND = {
    "kill": "crash",
    "raise": "crash",
    "savekill": "crash",
    "oom": "oom",
    "sigstop": "hang",
    "stuck": "hang",
}
"""The ``failure_detected`` kind each charged fault must be reported as."""

_FIRST_STEP = 3  # the first attempt has finished a few steps before anything strikes
_AFTER_EXTERNAL = 15  # an outside fault lands a few steps after its aim; the next one waits
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
class Schedule:
    """A run's faults and the job's ``restart.max_restarts``."""

    max_restarts: int
    faults: tuple[Fault, ...]

    def text(self) -> str:
        return " ".join([f"max_restarts={self.max_restarts}", *(f.text() for f in self.faults)])

    def in_attempt(self, attempt: int) -> list[Fault]:
        return [f for f in self.faults if f.attempt == attempt]

    def ending(self, attempt: int) -> list[Fault]:
        """The fault(s) that end ``attempt`` (empty: it runs to the end)."""
        return [f for f in self.in_attempt(attempt) if f.kind in ENDING]

    @property
    def attempts(self) -> int:
        """Attempts the job runs (the last one ends the job)."""
        charged = 0
        for attempt in range(1, len(self.faults) + 2):
            ending = self.ending(attempt)
            if not ending:
                return attempt
            if ending[0].kind in CHARGED:
                charged += 1
                if charged > self.max_restarts:
                    return attempt
        raise AssertionError("unreachable: an attempt without a fault ends the job")

    @property
    def gives_up(self) -> bool:
        return bool(self.ending(self.attempts))

    @property
    def exit_code(self) -> int:
        """What the last ``rvsup start`` must exit with: 3 when the budget runs out, else 0."""
        return 3 if self.gives_up else 0

    @property
    def needs_tmpfs(self) -> bool:
        return any(f.kind == "enospc" for f in self.faults)

    @property
    def aims_at_saves(self) -> bool:
        return any(f.kind == "savekill" for f in self.faults)

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
        return ",".join(out)


def parse(text: str) -> Schedule:
    """The schedule a :meth:`Schedule.text` line describes; ``ValueError`` saying what is wrong."""
    head, *items = text.split()
    key, _, value = head.partition("=")
    if key != "max_restarts" or not value.isdigit():
        raise ValueError(f"a schedule starts with max_restarts=N, not {head!r}")
    faults = []
    for item in items:
        parts = item.split(":")
        if len(parts) != 4 or parts[0] not in KINDS:
            raise ValueError(f"{item!r}: expected kind:rank:step:attempt, kind one of {KINDS}")
        kind, rank, step, attempt = parts
        faults.append(Fault(kind, int(attempt), int(step), None if rank == "-" else int(rank)))
    return Schedule(int(value), tuple(faults))


def draw(rng: random.Random, *, kinds: Sequence[str] = KINDS, max_endings: int = 3) -> Schedule:
    """A random schedule of 1..``max_endings`` ending faults, using only ``kinds``.

    Steps are drawn so that every fault strikes: the next attempt resumes at most where the
    previous fault struck (at most a few steps later after an outside one), and every fault lies
    before the last steps of the job.
    """
    # a full disk and a save made large to be aimed at do not fit together: one or the other
    full_disk = "enospc" in kinds and rng.random() < 0.3
    ending_kinds = [k for k in ENDING if k in kinds and not (full_disk and k == "savekill")]
    ending_kinds += ["pair"] if "kill" in kinds else []
    faults: list[Fault] = []
    low = _FIRST_STEP
    previous = 0  # the step the previous attempt's fault struck at
    attempt = 1
    for _ in range(rng.randint(1, max_endings)):
        if full_disk and rng.random() < 0.5 and low + ENOSPC_STEPS + 2 < LAST_STEP:
            fill = rng.randint(low, min(low + 6, LAST_STEP - ENOSPC_STEPS - 2))
            faults.append(Fault("enospc", attempt, fill, 0))
            low = fill + ENOSPC_STEPS + 1
        if low > LAST_STEP:
            break
        step = rng.randint(low, min(low + 10, LAST_STEP))
        kind = rng.choice(ending_kinds)
        if kind in ("sigstop", "stuck"):  # a step done first, else the startup timeout applies
            step = max(step, previous + 2)
        if kind == "pair":  # two faults close together: both ranks, the same step
            first, second = rng.choice([("kill", "kill"), ("kill", "raise"), ("raise", "kill")])
            faults += [Fault(first, attempt, step, 0), Fault(second, attempt, step, 1)]
        elif kind in IN_RANK:
            faults.append(Fault(kind, attempt, step, rng.randrange(2)))
        elif kind == "savekill":  # aimed at the first save after the step: one must follow
            step = min(step, TOTAL_STEPS - 20)
            faults.append(Fault(kind, attempt, step, rng.randrange(2)))
        else:
            faults.append(Fault(kind, attempt, step))
        if kind in ("term", "usr1", "daemonkill") and rng.random() < 0.4:
            faults.append(Fault(rng.choice(DAMAGE), attempt, 0))
        low = step + (_AFTER_EXTERNAL if kind in EXTERNAL else rng.choice([0, 1, 2, 5, 10]))
        previous = step
        attempt += 1
    draft = Schedule(0, tuple(faults))
    charged = sum(1 for a in range(1, attempt) if draft.ending(a)[0].kind in CHARGED)
    runs_out = bool(charged) and rng.random() < 0.15  # then rvsup must give up, exit 3
    budget = charged - 1 if runs_out else charged + rng.randint(0, 2)
    return _cut_at_give_up(Schedule(budget, tuple(faults)))


def _cut_at_give_up(s: Schedule) -> Schedule:
    last = s.attempts
    return Schedule(s.max_restarts, tuple(f for f in s.faults if f.attempt <= last))
