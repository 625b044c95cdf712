"""When the training itself goes wrong: the loss rules, and the rollback that answers them.

Pure, like every rule here: :class:`LossWatch` holds the losses the ranks reported (no I/O,
no clock) and says when one is an anomaly; :func:`decide_rollback` says what to do about it.

The rules:

- **non-finite loss** — a rank reported a loss that is NaN or infinite (the SDK checks a float
  loss at every ``step()``, a tensor at heartbeat time). Its onset is the step the rank names:
  the step itself for a float, the step after its previous heartbeat for a tensor.
- **loss spike** — each rank's reported losses (one per heartbeat) form a baseline: the median
  ``m`` and the median absolute deviation ``d`` of its last ``window`` accepted values. A value
  above ``m + spike_factor * max(d, 0.001 * |m|)`` is high; ``patience`` high values in a row
  are a spike, whose onset is the step after the last value that was not high (the
  attempt's first step when none was). High values never enter the baseline. Nothing is
  judged before the rank has reported :func:`min_values` values (the baseline is kept across
  attempts: a loss still high after a rollback is judged at once).
- **replicas_diverged** — the DDP ranks compared a fingerprint of their parameters every
  ``verify_every_steps`` steps and some differ from the majority (``worker_sdk.runtime.replicas``);
  the onset is the step after the last check that agreed.
- **rollback** — the job goes back to the newest checkpoint of a step before the onset
  (checkpoints at the onset or later are discarded: they may hold the damage) and goes on at
  ``max(step + 1, onset + skip_steps)``: the steps between are skipped, their data never
  trained on. ``max_rollbacks`` rollbacks are allowed for the whole job; an anomaly whose onset
  falls within ``skip_steps`` steps of where the previous rollback resumed came back at the same
  place, so it is not the data's doing: the job gives up (deterministic). When no checkpoint
  before the onset is left although one was committed (pruned), the job gives up too, naming
  it: going back to the start would silently skip every step since.
- **protection** — :meth:`LossWatch.earliest_onset` is the earliest step the onset of an
  anomaly not yet found can still be: per rank, the step after its last loss that was not high
  (the attempt's first step when none was; a high streak keeps it), and with the replica check
  the step after the last check before its last heartbeat (at most ``verify_every_steps``
  back). Pruning keeps the newest checkpoint older than it (``worker_sdk.contract.layout``).
"""

from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

from supervisor.rules.budget import Budget
from supervisor.rules.observation import Anomaly, FailureKind

__all__ = [
    "AnomalyPolicy",
    "LossWatch",
    "Rollback",
    "RollbackRefused",
    "baseline",
    "decide_rollback",
    "describe",
    "min_values",
]

_RELATIVE_FLOOR = 1e-3  # of the median: a perfectly flat loss still has a finite threshold


@dataclass(frozen=True, slots=True)
class AnomalyPolicy:
    """``[anomaly]``: what counts as the training going wrong, and the rollbacks it gets.

    - ``spike_factor`` (default 10.0, > 0): a reported loss above the median of the window
      plus this many median absolute deviations is high.
    - ``window`` (default 50, >= 4): reported losses per rank the baseline is taken over.
    - ``patience`` (default 3, >= 1): high losses in a row that make a spike.
    - ``skip_steps`` (default 1, >= 1): the next attempt starts at least this many steps after
      the anomaly's onset (and always after the step it was seen at).
    - ``max_rollbacks`` (default 3, >= 0): rollbacks for the whole job; 0 gives up at the
      first anomaly.
    - ``verify_every_steps`` (default 0: never, >= 0): compare the DDP replicas' parameters
      every this many steps (one small all-gather).
    """

    spike_factor: float = 10.0
    window: int = 50
    patience: int = 3
    skip_steps: int = 1
    max_rollbacks: int = 3
    verify_every_steps: int = 0


def min_values(policy: AnomalyPolicy) -> int:
    """Values a rank must have reported before a spike can be judged."""
    return max(4, min(policy.window, 10))


def baseline(values: Iterable[float], factor: float) -> tuple[float, float]:
    """``(median, threshold)`` of the accepted values (module docstring: the rule)."""
    data = list(values)
    median = statistics.median(data)
    mad = statistics.median(abs(v - median) for v in data)
    return median, median + factor * max(mad, _RELATIVE_FLOOR * abs(median))


@dataclass(slots=True)
class _RankLosses:
    accepted: deque[float]
    high: list[tuple[int, float]] = field(default_factory=list)
    last_normal: int | None = None
    ordered: list[float] = field(default_factory=list)  # ``accepted``, sorted: its median at once

    def accept(self, value: float) -> None:
        if len(self.accepted) == self.accepted.maxlen:  # the oldest leaves the window
            del self.ordered[bisect.bisect_left(self.ordered, self.accepted[0])]
        self.accepted.append(value)
        bisect.insort(self.ordered, value)

    def surely_below(self, value: float, factor: float) -> bool:
        """Whether ``value`` is below any threshold :func:`baseline` can give: the median plus
        ``factor`` times its floor (the spread is never below it). Most values are, and then
        the spread need not be computed (the daemon reads thousands a second)."""
        ordered, n = self.ordered, len(self.ordered)
        i = n // 2
        median = ordered[i] if n % 2 else (ordered[i - 1] + ordered[i]) / 2
        return value <= median + factor * _RELATIVE_FLOOR * abs(median)


class LossWatch:
    """The losses the ranks reported, across the attempts of one daemon."""

    def __init__(self, policy: AnomalyPolicy) -> None:
        self.policy = policy
        self._min_values = min_values(policy)
        self._ranks: dict[int, _RankLosses] = {}
        self._first_step = 0
        self._heard: dict[int, int] = {}  # rank -> step of its last heartbeat this attempt

    def begin_attempt(self, first_step: int) -> None:
        """A new attempt starts at ``first_step``: high streaks are forgotten, baselines kept."""
        self._first_step = first_step
        self._heard.clear()
        for r in self._ranks.values():
            r.high.clear()
            r.last_normal = None

    def resumed_at(self, step: int) -> None:
        """The ranks resumed at ``step``: earlier than the attempt planned when the checkpoint
        it named proved damaged and an older one was loaded. Onsets are never dated before the
        step the ranks actually started at, and never after it either."""
        self._first_step = step

    def heard(self, rank: int, step: int) -> None:
        """A heartbeat of ``rank`` at ``step`` (with a loss or not)."""
        self._heard[rank] = step

    def heartbeat(self, rank: int, step: int, loss: float | None) -> Anomaly | None:
        """A heartbeat of ``rank`` at ``step``, with its loss when it carried one (:meth:`heard`
        and :meth:`observe`); the anomaly it completes, if any."""
        self._heard[rank] = step
        return None if loss is None else self.observe(rank, step, loss)

    def earliest_onset(self, world_size: int, found: Anomaly | None = None) -> int | None:
        """The earliest step the onset of an anomaly not yet found (or of ``found``, this
        attempt's) can be (module docstring: protection); None when none can come: no rank
        ever reported a loss and the replicas are not compared."""
        every = self.policy.verify_every_steps
        if not self._ranks and not every:
            return None
        candidates = [] if found is None else [found.onset]
        for rank in range(world_size):
            step = self._heard.get(rank)
            if step is None:
                candidates.append(self._first_step)
                continue
            if every:
                candidates.append(max(self._first_step, step - every + 1))
            if self._ranks:  # a first loss may be NaN: since the step after the heartbeat
                candidates.append(self._onset(rank, step + 1) if rank in self._ranks else step + 1)
        return min(candidates)

    def observe(self, rank: int, step: int, value: float) -> Anomaly | None:
        """A heartbeat's loss; the anomaly it completes, if any."""
        if not math.isfinite(value):
            return self.nonfinite(rank, step, self._onset(rank, step), value)
        r = self._ranks.get(rank)
        if r is None:
            r = self._ranks[rank] = _RankLosses(deque(maxlen=self.policy.window))
        factor = self.policy.spike_factor
        if len(r.accepted) >= self._min_values and not r.surely_below(value, factor):
            median, threshold = baseline(r.ordered, factor)
            if value > threshold:
                r.high.append((step, value))
                if len(r.high) < self.policy.patience:
                    return None
                onset = self._onset(rank, r.high[0][0])
                return Anomaly(FailureKind.LOSS_SPIKE, rank, step, onset, value, median)
        if r.high:
            r.high.clear()
        r.accept(value)
        r.last_normal = step
        return None

    def nonfinite(self, rank: int, step: int, onset: int, value: float) -> Anomaly:
        """A rank reported a loss that is not finite, first possible at ``onset``."""
        return Anomaly(FailureKind.NONFINITE_LOSS, rank, step, max(onset, self._first_step), value)

    def diverged(self, ranks: tuple[int, ...], step: int, onset: int) -> Anomaly:
        """The replicas' fingerprints differed at ``step``; they agreed before ``onset``."""
        kind = FailureKind.REPLICAS_DIVERGED
        return Anomaly(
            kind, ranks[0], step, max(onset, self._first_step), math.nan, None, ranks[1:]
        )

    def _onset(self, rank: int, step: int) -> int:
        r = self._ranks.get(rank)
        last = None if r is None else r.last_normal
        return min(step, self._first_step if last is None else last + 1)


@dataclass(frozen=True, slots=True)
class Rollback:
    """Go back to checkpoint ``restore_step`` (None: the start) and go on at ``resume_step``."""

    restore_step: int | None
    resume_step: int
    skipped_steps: int
    """Steps never trained on: ``resume_step - (restore_step + 1)``."""
    discard_from: int
    """Checkpoints of this step (the onset) or later are discarded."""
    note: str


@dataclass(frozen=True, slots=True)
class RollbackRefused:
    """No rollback: the job gives up (exit 3)."""

    reason: str


def describe(anomaly: Anomaly) -> str:
    """``"rank 1: loss nan at step 12"``, ``"rank 0: loss 40.1 at step 80, 5.2x its baseline
    2.1 since step 71"``."""
    if anomaly.kind is FailureKind.REPLICAS_DIVERGED:
        ranks = ", ".join(map(str, (anomaly.rank, *anomaly.others)))
        return (
            f"rank(s) {ranks}: parameters differ from the other replicas' at step "
            f"{anomaly.step} (the same at step {anomaly.onset - 1})"
        )
    text = f"rank {anomaly.rank}: loss {anomaly.value:.4g} at step {anomaly.step}"
    if anomaly.baseline is not None:
        text += f", above its baseline {anomaly.baseline:.4g} since step {anomaly.onset}"
    elif anomaly.onset != anomaly.step:
        text += f" (finite at step {anomaly.onset - 1})"
    return text


def decide_rollback(
    budget: Budget,
    anomaly: Anomaly,
    policy: AnomalyPolicy,
    checkpoints: Iterable[int],
    committed: Iterable[int] = (),
) -> Rollback | RollbackRefused:
    """What to do after ``anomaly`` (module docstring: the rules); ``checkpoints`` are the
    steps of the committed checkpoints, ``committed`` those of every checkpoint committed
    (or found) since the supervisor started, pruned ones included; ``budget`` is folded
    from the history so far."""
    what = describe(anomaly)
    back = budget.skip_to
    if back is not None and back <= anomaly.onset < back + policy.skip_steps:
        return RollbackRefused(
            f"deterministic: {what}, again right after the steps skipped (resumed at step "
            f"{back}); it does not come from the data, so no rollback can help"
        )
    if budget.rollbacks_used >= policy.max_rollbacks:
        used = f"{budget.rollbacks_used} of {policy.max_rollbacks}"
        return RollbackRefused(f"rollback budget spent ({used} used): {what}")
    earlier = [s for s in checkpoints if s < anomaly.onset]
    restore = max(earlier) if earlier else None
    lost = [s for s in committed if s < anomaly.onset]
    if restore is None and lost:
        return RollbackRefused(
            f"no checkpoint before the onset is left: {what}; the checkpoint of step "
            f"{max(lost)} was removed (pruned), and going back to the start would skip "
            f"{anomaly.step + 1} steps"
        )
    resume = max(anomaly.step + 1, anomaly.onset + policy.skip_steps)
    skipped = resume - (0 if restore is None else restore + 1)
    source = "the start" if restore is None else f"the checkpoint of step {restore}"
    note = (
        f"rollback {budget.rollbacks_used + 1} of {policy.max_rollbacks}: {what}; back to "
        f"{source}, on at step {resume} ({skipped} steps skipped)"
    )
    return Rollback(restore, resume, skipped, anomaly.onset, note)
