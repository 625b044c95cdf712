"""The closing lines of ``rvsup history``: what the attempts add up to (pure).

- *steps redone*: the finished steps that a later attempt ran again (the attempts'
  ``steps_lost``);
- *time lost*: per attempt that did not succeed, from its newest commit (or its start) to its end,
  plus the backoff before the next (the rows' ``seconds_lost``); the next attempt's start-up is
  not counted;
- *steps skipped*: the steps rollbacks skipped (never trained on), shown when there are any;
- *wall time*: from the first attempt's start to the last one's end (or ``now`` while it runs);
- *goodput*: the share of the wall time that was not lost, ``(wall - lost) / wall``;
- *resumes*: the resume check's verdicts (verified, diverged, unverified), shown when there are
  any (docs/resume-check.md).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from supervisor.record.history import AttemptRow

__all__ = ["Summary", "render_summary", "summarize", "summary_to_json"]

_NOT_FAILURES = frozenset({"succeeded", "running", "unknown", "stopped"})


@dataclass(frozen=True, slots=True)
class Summary:
    """A job's attempts, added up."""

    attempts: int
    failures: dict[str, int]  # by outcome (crash, hang, oom, preempted, supervisor lost, ...)
    steps_redone: int
    time_lost_s: float
    wall_s: float
    goodput: float | None  # None when no time has passed
    steps_skipped: int = 0
    resumes: dict[str, int] | None = None  # verdict -> resumes; None: no resume was checked


def summarize(rows: list[AttemptRow], now: datetime) -> Summary:
    """Add up ``rows`` (in attempt order); ``now`` ends a running last attempt."""
    failures = Counter(
        row.outcome.removeprefix("gave up: ") for row in rows if row.outcome not in _NOT_FAILURES
    )
    wall = 0.0
    if rows:
        end = rows[-1].ended or now
        wall = max(0.0, (end - rows[0].started).total_seconds())
    lost = sum(row.seconds_lost for row in rows)
    goodput = max(0.0, (wall - lost) / wall) if wall > 0 else None
    checks = [row.resume_check.split(" ")[0] for row in rows if row.resume_check]
    resumes = {k: checks.count(k) for k in ("verified", "diverged", "unverified")}
    return Summary(
        attempts=len(rows),
        failures=dict(sorted(failures.items())),
        steps_redone=sum(row.steps_lost for row in rows),
        time_lost_s=lost,
        wall_s=wall,
        goodput=goodput,
        steps_skipped=sum(row.steps_skipped for row in rows),
        resumes=resumes if checks else None,
    )


def render_summary(s: Summary) -> str:
    """One line, e.g. ``2 attempts (1 crash); 21 steps redone; 1.5s lost of 12.0s``. The
    goodput ``rvsup history`` shows is on the next line, split by source
    (:mod:`supervisor.record.goodput`); :attr:`Summary.goodput` stays in the JSON."""
    failed = ", ".join(f"{n} {kind}" for kind, n in s.failures.items()) or "no failure"
    plural = "" if s.attempts == 1 else "s"
    skipped = f"{s.steps_skipped} steps skipped by rollbacks; " if s.steps_skipped else ""
    resumes = ""
    if s.resumes is not None:
        resumes = "; resumes: " + ", ".join(f"{n} {k}" for k, n in s.resumes.items() if n)
    return (
        f"{s.attempts} attempt{plural} ({failed}); {s.steps_redone} steps redone; {skipped}"
        f"{s.time_lost_s:.1f}s lost of {s.wall_s:.1f}s{resumes}"
    )


def summary_to_json(s: Summary) -> dict[str, Any]:
    return {
        "attempts": s.attempts,
        "failures": s.failures,
        "steps_redone": s.steps_redone,
        "steps_skipped": s.steps_skipped,
        "time_lost_s": round(s.time_lost_s, 3),
        "wall_s": round(s.wall_s, 3),
        "goodput": None if s.goodput is None else round(s.goodput, 4),
        "resumes": s.resumes,
    }
