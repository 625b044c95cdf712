"""The restart budget, as one fold over the history's events.

:func:`fold` is the only place the budget is computed. At start-up the supervisor folds the
whole ``events.jsonl`` (:func:`budget_of`); during the run it folds every event it logs into the
same :class:`Budget`. Both see the same events, so a requeued allocation or a new ``rvsup
start`` continues exactly where the run before it stood.

The rules, event by event (every other event leaves the budget as it is):

- ``attempt_started``: one more attempt, which has not progressed yet; the checkpoint it resumes
  from (``resume_step - 1``) is known.
- ``checkpoint_committed`` of a step newer than any known: the attempt progressed, and the
  no-progress streak is over. So does ``memory_snapshots`` (logged as the attempt ends, before
  its failure) whose newest complete snapshot is newer than any step known: the next attempt
  resumes from it.
- ``failure_detected``: the newest failure, by its signature (kind, ranks, last step); an
  ``oom`` is counted.
- ``restart_scheduled`` with ``charged``: one restart used; the newest failure becomes the last
  charged one (what :func:`supervisor.rules.policy.decide` compares a failure with to call it
  deterministic); the streak grows unless the attempt progressed.
- ``failure_detected`` also counts one failure for each of its ``nodes`` (attribution).
- ``node_excluded``: the node is excluded, for the rest of the job (with why).
- ``job_started``: a new daemon; no attempt runs until its ``attempt_started``.
- ``rolled_back``: one rollback used; the attempts from now on start no earlier than its
  ``resume_step`` (the skipped steps stay skipped whatever checkpoint a later restart loads);
  the next attempt may load no checkpoint of its onset or later; the newest checkpoint known is
  the one restored.

Nothing resets at a ``job_started``: the restarts used, the streak, the last charged failure,
the failures counted per node and the excluded nodes carry over requeues and restarts of
rvsup. A preemption, time limit or stop is never charged
(no ``restart_scheduled`` follows it), so it neither spends the budget nor grows the streak.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

from supervisor.record.schema import (
    AttemptStarted,
    CheckpointCommitted,
    Event,
    FailureDetected,
    JobStarted,
    MemorySnapshots,
    NodeExcluded,
    RestartScheduled,
    RolledBack,
)
from supervisor.rules.observation import FailureKind, Signature, signature

__all__ = ["Budget", "budget_of", "fold", "signature_of"]


@dataclass(frozen=True, slots=True)
class Budget:
    """Where the job's restart budget stands after the events folded so far."""

    attempts: int = 0
    """Attempts started: the number of the newest one (the next is ``attempts + 1``)."""
    restarts_used: int = 0
    """Charged restarts."""
    no_progress_streak: int = 0
    """Charged attempts in a row, most recent last, that committed no new checkpoint (nor
    memory snapshot)."""
    oom_count: int = 0
    """Failures of kind ``oom``."""
    failure: Signature | None = None
    """The newest failure's signature, charged or not."""
    charged_failure: Signature | None = None
    """The signature of the newest failure whose restart was charged."""
    newest_step: int | None = None
    """The newest checkpoint step known: committed, snapshotted, or resumed from."""
    progressed: bool = False
    """The newest attempt committed a checkpoint (or memory snapshot) newer than any known
    before it."""
    rollbacks_used: int = 0
    """Rollbacks after an anomaly (``rolled_back``)."""
    skip_to: int | None = None
    """The newest rollback's resume step: no attempt starts before it."""
    resume_before: int | None = None
    """Set by a rollback until the next attempt starts: it may load no checkpoint of this
    step or later."""
    node_failures: Mapping[str, int] = field(default_factory=dict)
    """Failures attributed to each node (``failure_detected.nodes``)."""
    excluded: Mapping[str, str] = field(default_factory=dict)
    """Excluded nodes and why (``node_excluded``), in the order they were excluded."""

    @property
    def last_failure(self) -> str | None:
        """The newest failure's kind (``crash``, ``oom``, ...), None before the first."""
        return None if self.failure is None else self.failure[0]


def signature_of(event: FailureDetected) -> Signature:
    """The recorded failure's :func:`~supervisor.rules.observation.signature` (that of the
    failure it records: :func:`supervisor.rules.failures.deterministic_signature`)."""
    return signature(event.kind, event.ranks, event.last_step)


def fold(budget: Budget, event: Event) -> Budget:
    """The budget after one more event (module docstring: the rules)."""
    if isinstance(event, AttemptStarted):
        newest = budget.newest_step
        if event.resume_step > 0 and (newest is None or event.resume_step - 1 > newest):
            newest = event.resume_step - 1
        return replace(
            budget,
            attempts=budget.attempts + 1,
            progressed=False,
            newest_step=newest,
            resume_before=None,
        )
    if isinstance(event, CheckpointCommitted | MemorySnapshots):
        step = event.step if isinstance(event, CheckpointCommitted) else event.newest_step
        if step is None or (budget.newest_step is not None and step <= budget.newest_step):
            return budget
        return replace(budget, newest_step=step, progressed=True, no_progress_streak=0)
    if isinstance(event, FailureDetected):
        is_oom = event.kind == FailureKind.OOM
        counts = dict(budget.node_failures)
        for node in dict.fromkeys(event.nodes):
            counts[node] = counts.get(node, 0) + 1
        return replace(
            budget,
            failure=signature_of(event),
            oom_count=budget.oom_count + is_oom,
            node_failures=counts,
        )
    if isinstance(event, NodeExcluded):
        if event.node in budget.excluded:
            return budget
        return replace(budget, excluded={**budget.excluded, event.node: event.reason})
    if isinstance(event, RestartScheduled) and event.charged:
        return replace(
            budget,
            restarts_used=budget.restarts_used + 1,
            charged_failure=budget.failure,
            no_progress_streak=0 if budget.progressed else budget.no_progress_streak + 1,
        )
    if isinstance(event, JobStarted):
        return replace(budget, progressed=False)
    if isinstance(event, RolledBack):
        return replace(
            budget,
            rollbacks_used=budget.rollbacks_used + 1,
            skip_to=event.resume_step,
            resume_before=event.onset,
            newest_step=event.to_step,
        )
    return budget


def budget_of(events: Iterable[Event]) -> Budget:
    """The budget of a whole history (``Budget()`` for none): :func:`fold` over every event."""
    budget = Budget()
    for event in events:
        budget = fold(budget, event)
    return budget
