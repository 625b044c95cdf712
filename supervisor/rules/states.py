"""The job lifecycle: states and the transitions allowed between them.

One job runs as a sequence of attempts. The supervisor holds exactly one state at a time
and changes it only through :func:`check_transition`, so an impossible change (say, from
``BACKOFF`` straight to ``RUNNING``) is a loud bug instead of a silent one::

    STARTING ---> RUNNING <---> SAVING          "live": an attempt's ranks are running
       |             |             |
       +------+------+------+------+
              |             |
              |             +--> SUCCEEDED      exit 0 (also STARTING directly: a resumed
              |             |                   job with no steps left)
              |             +--> STOPPING ---> STOPPED        checkpoint committed, exit 75
              |                     +--------> SUCCEEDED      the training ended first
              |                     |
              v                     v
         TEARING_DOWN <-------------+           kill and reap the attempt's process tree
           |   |   |
           |   |   +--> GAVE_UP                 exit 3: budget spent / must not retry
           |   +------> STOPPED                 a stop arrived during the teardown
           v
         BACKOFF ---> STARTING                  the next attempt
           |   |
           |   +----> STOPPED                   a stop arrived while waiting
           +--------> GAVE_UP

The same table, state by state, is :data:`TRANSITIONS`. Terminal states (:data:`TERMINAL`)
have no way out; :func:`exit_code` maps each to the exit status of ``rvsup start``.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from types import MappingProxyType
from typing import Final

__all__ = [
    "TERMINAL",
    "TRANSITIONS",
    "ExitCode",
    "IllegalTransitionError",
    "JobState",
    "check_transition",
    "exit_code",
]


class JobState(enum.Enum):
    """Where a job is in its lifecycle."""

    STARTING = "starting"
    """Preflight done; an attempt is launching (waiting for every rank's first step)."""
    RUNNING = "running"
    """Every rank finished at least one step in this attempt."""
    SAVING = "saving"
    """A coordinated checkpoint is in progress (a time-based save or the save before a stop)."""
    STOPPING = "stopping"
    """A stop was requested: coordinated checkpoint, then every rank exits."""
    TEARING_DOWN = "tearing_down"
    """The attempt's process tree is being killed and reaped."""
    BACKOFF = "backoff"
    """Waiting before the next attempt."""
    SUCCEEDED = "succeeded"
    """Terminal: the job finished (exit 0)."""
    GAVE_UP = "gave_up"
    """Terminal: the restart budget is spent or a failure must not be retried (exit 3)."""
    STOPPED = "stopped"
    """Terminal: stopped (request, preemption, time limit), checkpoint committed (exit 75)."""


_S = JobState

TRANSITIONS: Final[Mapping[JobState, frozenset[JobState]]] = MappingProxyType(
    {
        _S.STARTING: frozenset(
            {_S.RUNNING, _S.STOPPING, _S.TEARING_DOWN, _S.SUCCEEDED, _S.STOPPED, _S.GAVE_UP}
        ),
        _S.RUNNING: frozenset({_S.SAVING, _S.STOPPING, _S.TEARING_DOWN, _S.SUCCEEDED}),
        _S.SAVING: frozenset({_S.RUNNING, _S.STOPPING, _S.TEARING_DOWN, _S.SUCCEEDED}),
        _S.STOPPING: frozenset({_S.TEARING_DOWN, _S.STOPPED, _S.SUCCEEDED}),
        _S.TEARING_DOWN: frozenset({_S.BACKOFF, _S.GAVE_UP, _S.STOPPED}),
        _S.BACKOFF: frozenset({_S.STARTING, _S.STOPPED, _S.GAVE_UP}),
        _S.SUCCEEDED: frozenset(),
        _S.GAVE_UP: frozenset(),
        _S.STOPPED: frozenset(),
    }
)
"""For each state, the states it may change to (read-only)."""

TERMINAL: Final[frozenset[JobState]] = frozenset({_S.SUCCEEDED, _S.GAVE_UP, _S.STOPPED})
"""States that end the job."""


class ExitCode(enum.IntEnum):
    """The exit statuses of ``rvsup`` (its commands and the daemon)."""

    OK = 0
    """Success: the job finished (``start``), or the command did what was asked."""
    ERROR = 1
    """An internal error of the daemon, or ``status``/``stop`` found no daemon."""
    USAGE = 2
    """Bad configuration or usage; nothing was launched."""
    GAVE_UP = 3
    """The restart budget is spent, or a failure must not be retried."""
    TEMPFAIL = 75
    """EX_TEMPFAIL: stopped on request, preemption or time limit; resumable."""


_EXIT_CODES: Final[Mapping[JobState, ExitCode]] = MappingProxyType(
    {_S.SUCCEEDED: ExitCode.OK, _S.GAVE_UP: ExitCode.GAVE_UP, _S.STOPPED: ExitCode.TEMPFAIL}
)


class IllegalTransitionError(RuntimeError):
    """A state change that :data:`TRANSITIONS` does not allow."""

    def __init__(self, old: JobState, new: JobState) -> None:
        allowed = ", ".join(sorted(s.name for s in TRANSITIONS[old])) or "nothing (terminal)"
        super().__init__(f"illegal transition {old.name} -> {new.name}; allowed: {allowed}")
        self.old = old
        self.new = new


def check_transition(old: JobState, new: JobState) -> None:
    """Return if ``old -> new`` is allowed, else raise :class:`IllegalTransitionError`."""
    if new not in TRANSITIONS[old]:
        raise IllegalTransitionError(old, new)


def exit_code(state: JobState) -> ExitCode:
    """The exit status of ``rvsup start`` for a terminal state: 0, 3 or 75.

    Raises ``ValueError`` for a state that is not terminal.
    """
    try:
        return _EXIT_CODES[state]
    except KeyError:
        raise ValueError(f"{state.name} is not a terminal state") from None
