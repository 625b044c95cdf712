"""The resume check's book: the ranks' fingerprints kept across the attempts of one
``rvsup start``, and each resume's verdict (docs/resume-check.md).

Every attempt records what its ranks send (``STEP_PRINTS``); what the earlier attempts sent is
kept, the newest steps of each rank (:data:`~supervisor.rules.resume_check.KEPT_STEPS`). When an
attempt resumes from a checkpoint or a snapshot (``LOADED``), its fingerprints of the steps
from its resume step on are compared, as they come, with the earlier attempts' of the same steps
(:func:`~supervisor.rules.resume_check.compare_rank`). The verdict is one event per resume:

- ``resume_diverged`` at the first value that differs (the earliest step of the ranks so far);
- ``resume_verified`` once every rank has reached the last step the earlier attempts ran in
  the window, or at the attempt's end when some values were compared;
- ``resume_unverified`` at the attempt's end otherwise, saying why (nothing redone, another
  world size, a rollback, no fingerprint sent).

The fingerprints live in the daemon's memory: a resume after another ``rvsup start`` (a requeue,
a killed daemon) is unverified, and says so.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from supervisor.record.schema import ResumeDiverged, ResumeUnverified, ResumeVerified
from supervisor.rules.observation import Divergence
from supervisor.rules.resume_check import (
    RankComparison,
    RankPrints,
    compare_rank,
    suspects,
)
from worker_sdk.contract import messages as m
from worker_sdk.contract.training_messages import bits_float

__all__ = ["ResumeBook", "Verdict", "stopping"]

Verdict = ResumeVerified | ResumeDiverged | ResumeUnverified
_SILENT = (
    "no fingerprint was sent: pass the loss to worker_sdk.step(loss=...) or a module to resume() "
    "(a framework's model: resume(external=True, fingerprint=[model]))"
)


@dataclass(slots=True)
class _Resume:
    """The resume of the current attempt, while its verdict is pending."""

    step: int
    why_not: str | None  # set: no comparison (the reason); None: compared as values come
    compared: dict[int, RankComparison] = field(default_factory=dict)


class ResumeBook:
    """The fingerprints of one ``rvsup start``'s attempts; ``mode``: job.toml's
    ``checkpoint.resume_check`` (``"off"``: nothing is recorded or said)."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.before: dict[int, RankPrints] = {}  # the earlier attempts', by rank
        self.now: dict[int, RankPrints] = {}  # the current attempt's
        self.rollback = False  # the current attempt skips steps after a rollback
        self.resume: _Resume | None = None
        self.decided = False
        self.attempts = 0  # begun under this rvsup start

    def begin_attempt(self, *, rollback: bool) -> None:
        """A new attempt: the last one's values join the earlier ones' (after a rollback, the
        steps run before it are another trajectory: forgotten)."""
        for rank, prints in self.now.items():
            self.before.setdefault(rank, RankPrints()).merge(prints)
        if rollback:
            self.before = {}
        self.now = {}
        self.attempts += 1
        self.rollback = rollback
        self.resume = None
        self.decided = False

    def loaded(self, body: m.Loaded) -> None:
        """What the ranks resumed from (the first rank's report counts): a fresh start has
        nothing to check."""
        if self.mode == "off" or self.resume is not None or body.path is None:
            return
        self.resume = _Resume(body.step, self._why_not(body))
        for rank in self.now:  # values that came before the LOADED of the first rank
            self._check(rank)

    def _why_not(self, body: m.Loaded) -> str | None:
        if self.rollback:
            return "a rollback skips the steps after the anomaly: the data differs on purpose"
        if body.resharded_from is not None:
            return f"resharded from {body.resharded_from} ranks: each rank's data and shard differ"
        if not self.before and self.attempts > 1:
            return _SILENT
        if not self.before:
            return "no fingerprints of earlier attempts under this rvsup start"
        if not any(s >= body.step for p in self.before.values() for s in (*p.losses, *p.params)):
            return (
                "nothing redone to compare: no fingerprint of a step from the resume step on "
                "reached rvsup (none was run, or the attempt died within a heartbeat of them)"
            )
        return None

    def heard(self, rank: int, body: m.StepPrints) -> Verdict | None:
        """A rank's fingerprints; the resume's verdict when they settle it."""
        if self.mode == "off":
            return None
        params = None
        if body.params_step is not None and body.params is not None:
            params = (body.params_step, bits_float(body.params))
        self.now.setdefault(rank, RankPrints()).add(body.first, body.losses, params, body.exact)
        return self._check(rank)

    def _check(self, rank: int) -> Verdict | None:
        r = self.resume
        if r is None or r.why_not is not None or self.decided or rank not in self.before:
            return None
        r.compared[rank] = compare_rank(rank, self.before[rank], self.now[rank], r.step)
        differences = [c.difference for c in r.compared.values() if c.difference is not None]
        if differences:
            first = min(differences, key=lambda d: (d.step, d.rank))
            likely, hint = suspects(first, r.step)
            self.decided = True
            return ResumeDiverged(
                resume_step=r.step,
                step=first.step,
                rank=first.rank,
                what=first.what,
                before=first.before,
                after=first.after,
                exact=all(c.exact for c in r.compared.values()),
                likely=likely,
                hint=hint,
                policy=self.mode,
            )
        if set(r.compared) >= set(self.before) and all(c.complete for c in r.compared.values()):
            return self._verified(r, complete=True)
        return None

    def _verified(self, r: _Resume, *, complete: bool) -> ResumeVerified | None:
        compared = [c for c in r.compared.values() if c.values]
        if not compared:
            return None
        self.decided = True
        return ResumeVerified(
            resume_step=r.step,
            first_step=min(c.first_step for c in compared if c.first_step is not None),
            last_step=max(c.last_step for c in compared if c.last_step is not None),
            values=sum(c.values for c in compared),
            ranks=len(compared),
            exact=all(c.exact for c in compared),
            complete=complete,
        )

    def ended(self) -> Verdict | None:
        """The attempt ended: the verdict of its resume, when none was given yet."""
        r = self.resume
        if self.mode == "off" or r is None or self.decided:
            return None
        self.decided = True
        if r.why_not is None:
            verified = self._verified(r, complete=False)
            if verified is not None:
                return verified
            why = "the attempt ended before it sent a fingerprint of a step to compare"
            if not any(p.losses or p.params for p in self.now.values()):
                why = _SILENT
        else:
            why = r.why_not
        return ResumeUnverified(resume_step=r.step, reason=why)


def stopping(verdict: Verdict | None) -> Divergence | None:
    """The failure's evidence when ``verdict`` stops the job: a resume that was not exact,
    under ``checkpoint.resume_check = "fail"`` (the job gives up: rules.policy)."""
    if not isinstance(verdict, ResumeDiverged) or verdict.policy != "fail":
        return None
    event = verdict
    how = "bit for bit" if event.exact else "within a relative 1e-3"
    detail = (
        f"rank {event.rank}'s {event.what} at step {event.step} was {event.before!r} before the "
        f"restart and is {event.after!r} after it (resumed at step {event.resume_step}, "
        f"compared {how}); likely: {event.likely}"
    )
    return Divergence(event.step, event.rank, detail)
