"""Restart policy: what to do after an attempt ended, as one pure function.

:func:`decide` takes the job's :class:`~supervisor.rules.budget.Budget` (folded from the history
up to the attempt that just ended: :mod:`supervisor.rules.budget`), the classified
:class:`~supervisor.rules.observation.Failure`, the configured :class:`RestartPolicy` and a random
number drawn by the caller (so that the function stays pure), and returns a :data:`Decision`:

- ``preempted`` / ``timelimit`` / ``stopped`` -> :class:`Requeue`, never charged to the
  budget, even when the budget is spent.
- A ``crash`` in which a rank exited with :data:`worker_sdk.contract.protocol.EXIT_USAGE` (the script
  called the SDK in a way it refuses, e.g. ``resume()`` before ``init_process_group``) ->
  :class:`GiveUp` at once: the same script fails the same way on every restart.
- ``resume_diverged`` (a resume that was not exact, under ``checkpoint.resume_check =
  "fail"``; never classified otherwise) -> :class:`GiveUp`.
- ``oom`` with ``on_oom = "fail"`` or ``node_failure`` with ``on_node_failure = "fail"``
  -> :class:`GiveUp`; so is ``node_failure`` when the allocation has fewer nodes left than the
  job's minimum (``nodes``: left, minimum; ``launch.min_nnodes``, by default ``nnodes``).
- Anything else is a charged restart, unless the budget is spent
  (``restarts_used >= max_restarts``) or the attempt made no progress (``budget.progressed``)
  and would be the ``max_no_progress``-th such attempt in a row; then :class:`GiveUp`.
- A crash or OOM with the signature (kind, ranks, last step) of the last *charged* failure is
  called deterministic in the note or reason; that failure may lie before a requeue or a
  restart of rvsup (the budget carries it over).

A restart after an attempt that progressed (a checkpoint or memory snapshot newer than any
before it: ``budget.progressed``) starts at once (``first_backoff``, default 0 s: a one-off
fault, the common case, costs no waiting), however many restarts the job used; restarts in a row
after attempts that did not progress wait longer and longer (:func:`backoff_s`, ``n`` = such
restarts before this one). A long run that fails every few hours thus never waits for a backoff
grown by the failures of earlier days.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Final, Literal, TypeAlias, get_args

from supervisor.rules.budget import Budget
from supervisor.rules.failures import deterministic_signature
from supervisor.rules.observation import Failure, FailureKind, StopReason
from worker_sdk.contract.protocol import EXIT_USAGE

__all__ = [
    "Decision",
    "GiveUp",
    "OnFailure",
    "Requeue",
    "Restart",
    "RestartPolicy",
    "backoff_s",
    "decide",
    "deterministic_text",
    "nodes_for_restart",
]

OnFailure: TypeAlias = Literal["restart", "fail"]
"""What to do after an OOM or a node failure: restart (charged), or give up."""
_ON_FAILURE_CHOICES: Final = get_args(OnFailure)
_NEVER_CHARGED: Final = frozenset(
    {FailureKind.PREEMPTED, FailureKind.TIMELIMIT, FailureKind.STOPPED}
)
_DETERMINISTIC_KINDS: Final = frozenset({FailureKind.CRASH, FailureKind.OOM})
_MAX_DOUBLINGS: Final = 64  # past this the cap applies anyway; avoids float overflow


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """``[restart]`` of job.toml: the retry budget, for the whole job across allocations.

    One type for the configuration and the rule: :mod:`supervisor.config` reads the table into
    it (and reports a bad value per key before this class would reject it), :func:`decide`
    applies it.

    - ``max_restarts`` (default 5, >= 0): restarts charged before giving up; preemptions
      are never charged.
    - ``backoff`` (default ``"5s"``, >= 0): delay before the second charged restart in a
      row after attempts that did not progress (no newer checkpoint or memory snapshot),
      doubled for each one after it, with jitter; a restart after an attempt that progressed
      waits ``first_backoff``.
    - ``backoff_max`` (default ``"5m"``, >= backoff): the longest delay.
    - ``max_no_progress`` (default 2, >= 1): restarts in a row without a new checkpoint
      or memory snapshot before giving up.
    - ``on_oom`` (default ``"restart"``): ``"restart"`` or ``"fail"``.
    - ``on_node_failure`` (default ``"restart"``): ``"restart"`` or ``"fail"``.
    - ``first_backoff`` (default ``"0s"``, >= 0): delay before the job's first charged
      restart and before every restart after an attempt that progressed (at once: a one-off
      fault costs no waiting; a deterministic failure takes ``backoff``).
    """

    max_restarts: int
    """Charged restarts allowed for the whole job, across allocations."""
    backoff_s: float
    """Delay before the second charged restart in a row without progress; doubled for each
    one after it."""
    backoff_max_s: float
    """Cap on the delay."""
    max_no_progress: int
    """Give up at this many charged attempts in a row without a new checkpoint or memory
    snapshot (>= 1)."""
    on_oom: OnFailure = "restart"
    on_node_failure: OnFailure = "restart"
    first_backoff_s: float = 0.0
    """Delay before the first charged restart, and each after an attempt that progressed (of
    a failure that is not deterministic)."""

    def __post_init__(self) -> None:
        """Reject values that make no sense (the config layer reports them per key first)."""
        if self.max_restarts < 0:
            raise ValueError("max_restarts must be >= 0")
        if self.max_no_progress < 1:
            raise ValueError("max_no_progress must be >= 1")
        if self.backoff_s < 0 or self.backoff_max_s < 0 or self.first_backoff_s < 0:
            raise ValueError("first_backoff_s, backoff_s and backoff_max_s must be >= 0")
        for name in ("on_oom", "on_node_failure"):
            if getattr(self, name) not in _ON_FAILURE_CHOICES:
                raise ValueError(f'{name} must be "restart" or "fail"')


@dataclass(frozen=True, slots=True)
class Restart:
    """Start the next attempt after ``after_s`` seconds."""

    after_s: float
    charged: bool
    """The restart uses one from the budget."""
    restarts_left: int
    """Restarts left in the budget after this one."""
    deterministic: bool
    """The previous charged attempt failed the same way (same kind, ranks and step)."""
    note: str
    """One human sentence for the log, e.g. ``"restart 2 of 5 in 9.1s"``."""


@dataclass(frozen=True, slots=True)
class GiveUp:
    """End the job: exit 3."""

    reason: str


@dataclass(frozen=True, slots=True)
class Requeue:
    """Stop this allocation and let Slurm requeue it (or just stop: exit 75)."""

    reason: StopReason
    """Why: preempted, time limit or stopped (the failure kind of the attempt that ended)."""


Decision: TypeAlias = Restart | GiveUp | Requeue


def backoff_s(
    n: int, policy: RestartPolicy, jitter: float, *, deterministic: bool = False
) -> float:
    """The delay before a restart that follows ``n`` charged restarts in a row whose attempts
    did not progress (0 after an attempt that progressed: :func:`decide`).

    ``n = 0`` for a failure that is not ``deterministic``: ``d = first_backoff_s``
    (0 by default: at once). Otherwise ``d = min(backoff_max_s, backoff_s * 2**(n - 1))``
    (``n - 1`` no less than 0): ``backoff_s`` before the second restart, doubled for each after
    it. The delay is ``d/2 + jitter * d/2``: random like "full jitter" (restarts of many jobs
    spread out) but never below ``d/2``. ``jitter`` is drawn by the caller from [0, 1).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, not {n}")
    if not 0.0 <= jitter < 1.0:
        raise ValueError(f"jitter must be in [0, 1), not {jitter}")
    if n == 0 and not deterministic:
        d = policy.first_backoff_s
    else:
        k = max(0, n - 1)
        grown = policy.backoff_s * 2.0**k if k < _MAX_DOUBLINGS else float("inf")
        d = min(policy.backoff_max_s, grown)
    return d / 2 + jitter * d / 2


def deterministic_text(f: Failure) -> str:
    """``"deterministic: rank 1 fails at step 30 every time"``."""
    who = f"rank {f.ranks[0]}" if f.ranks else "the launch"
    what = "runs out of memory" if f.kind == FailureKind.OOM else "fails"
    when = f"at step {f.last_step}" if f.last_step is not None else "before its first step"
    return f"deterministic: {who} {what} {when} every time"


def decide(
    budget: Budget,
    failure: Failure,
    policy: RestartPolicy,
    *,
    jitter: float,
    nodes: tuple[int, int] | None = None,
) -> Decision:
    """What to do after the attempt that ended with ``failure`` (module docstring: rules).

    ``budget`` is folded up to the end of that attempt (its ``failure_detected`` included or
    not; its restart not yet).
    """
    progressed = budget.progressed
    if failure.kind in _NEVER_CHARGED:
        return Requeue(StopReason(failure.kind.value))
    deterministic = (
        failure.kind in _DETERMINISTIC_KINDS
        and budget.charged_failure == deterministic_signature(failure)
    )
    suffix = f" ({deterministic_text(failure)})" if deterministic else ""
    if failure.kind == FailureKind.CRASH and EXIT_USAGE in failure.exit_codes:
        return GiveUp(f"the training script must be changed, no restart can help: {failure.detail}")
    if failure.kind == FailureKind.RESUME_DIVERGED:  # only under resume_check = "fail"
        return GiveUp(
            f'the resume was not exact and checkpoint.resume_check = "fail": {failure.detail}'
        )
    if failure.kind == FailureKind.OOM and policy.on_oom == "fail":
        return GiveUp(f'out of memory and restart.on_oom = "fail"{suffix}')
    if failure.kind == FailureKind.NODE_FAILURE and policy.on_node_failure == "fail":
        return GiveUp(f'node failure and restart.on_node_failure = "fail"{suffix}')
    if failure.kind == FailureKind.NODE_FAILURE and nodes is not None and nodes[0] < nodes[1]:
        left, minimum = nodes
        return GiveUp(
            f"node failure: the job runs on at least {minimum} {_plural(minimum, 'node')}, "
            f"{left} left in this allocation"
        )
    if budget.restarts_used >= policy.max_restarts:
        used = f"{budget.restarts_used} of {policy.max_restarts}"
        noun = _plural(policy.max_restarts, "restart")
        return GiveUp(f"restart budget spent: {used} {noun} used{suffix}")
    streak = budget.no_progress_streak + 1
    if not progressed and streak >= policy.max_no_progress:
        return GiveUp(
            f"no progress: {streak} {_plural(streak, 'restart')} in a row without a new checkpoint"
            f"{suffix}"
        )
    in_a_row = 0 if progressed else budget.no_progress_streak
    delay = backoff_s(in_a_row, policy, jitter, deterministic=deterministic)
    number = budget.restarts_used + 1
    note = f"restart {number} of {policy.max_restarts} in {delay:.1f}s after {failure.kind}"
    if deterministic:
        note += f"; {deterministic_text(failure)}"
    return Restart(
        after_s=delay,
        charged=True,
        restarts_left=policy.max_restarts - number,
        deterministic=deterministic,
        note=note,
    )


def nodes_for_restart(nodes: Sequence[str], lost: Collection[str], needed: int) -> tuple[str, ...]:
    """The first ``needed`` nodes of the allocation that are not lost, in allocation order
    (fewer when not enough are left)."""
    return tuple(node for node in nodes if node not in lost)[:needed]


def _plural(count: int, noun: str) -> str:
    return noun if count == 1 else f"{noun}s"
