"""What must hold after a ``nan`` fault: rvsup's rollback, as its documented rule demands.

For every NaN that the schedule's model rolls back (:attr:`.schedule.Schedule.rollbacks`),
at attempt ``a``, step ``s``, rank ``r``:

- one ``anomaly_detected`` in ``a``: kind ``nonfinite_loss``, step ``s``, onset ``s`` (a float
  loss is checked at every step), rank ``r``, value null;
- one ``rolled_back`` in ``a``: from and onset ``s``; resume ``max(s + 1, s + skip_steps)``;
  ``to_step`` the newest checkpoint on disk of a step before ``s`` (the disk as the history tells
  it: the commits, pruned to ``keep_last``, less what earlier rollbacks discarded), null when
  there is none; ``skipped_steps = resume - (to_step + 1)`` (``resume`` from the start);
  ``discarded`` only steps ``>= s``; ``rollbacks_left`` counting down from ``max_rollbacks``;
- then one ``restart_scheduled`` in ``a``: not charged, no backoff, the restarts left unchanged;
- attempt ``a + 1`` loads ``to_step``'s checkpoint (an older one only if that one is reported
  skipped as damaged), from storage, never from memory; no later attempt loads a checkpoint the
  rollback discarded unless it was committed again after it, nor a memory snapshot of a step
  from the onset up to the resume step (the rollback discards those: a later snapshot was taken
  after it).

A NaN the job gives up at (within ``skip_steps`` of the previous rollback's resume: deterministic;
or past ``max_rollbacks``) has the same ``anomaly_detected``, no ``rolled_back``, and a
``job_gave_up`` that says why. No other attempt has an ``anomaly_detected``. Every attempt starts
no earlier than the newest earlier rollback's resume step (checked with the resumes, in
:mod:`.invariants`); :func:`omitted` gives the steps the final state must not have trained on.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from .schedule import KEEP_LAST, ROLLED_BACK, Rollback, Schedule

__all__ = ["check_rollbacks", "omitted", "on_disk"]

Events = Sequence[Mapping[str, Any]]

_GIVE_UP_REASON = {"deterministic": "deterministic", "rollback budget": "rollback budget spent"}


def omitted(events: Events) -> tuple[tuple[int, int], ...]:
    """The half-open step ranges the rollbacks skipped (``to_step + 1`` to ``resume_step``),
    merged: an uninterrupted run that leaves them out must end in the same state."""
    ranges = sorted(
        ((-1 if e["to_step"] is None else e["to_step"]) + 1, e["resume_step"])
        for e in _named(events, "rolled_back")
    )
    merged: list[tuple[int, int]] = []
    for first, end in ranges:
        if first >= end:
            continue
        if merged and first <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((first, end))
    return tuple(merged)


def check_rollbacks(s: Schedule, events: Events) -> list[str]:
    """Every violation of the rules above."""
    nan_attempts = {
        a for a in range(1, s.attempts + 1) if s.ending(a) and s.ending(a)[0].kind in ROLLED_BACK
    }
    out = [
        f"attempt {e['attempt']}: unexpected anomaly_detected {e['kind']}"
        for e in _named(events, "anomaly_detected")
        if e["attempt"] not in nan_attempts
    ]
    rolled = {r.attempt: r for r in s.rollbacks}
    for attempt in sorted(nan_attempts):
        (fault,) = s.ending(attempt)[:1]
        out += _anomaly(attempt, fault.step, fault.rank, events)
        if attempt in rolled:
            out += _rolled_back(s, rolled[attempt], events)
        else:
            out += _gave_up(s, attempt, events)
    if len(_named(events, "rolled_back")) != len(rolled):
        out.append(
            f"{len(_named(events, 'rolled_back'))} rolled_back events, expected {len(rolled)}"
        )
    return out


def _named(events: Events, name: str, attempt: int | None = None) -> list[Mapping[str, Any]]:
    return [
        e for e in events if e["event"] == name and (attempt is None or e.get("attempt") == attempt)
    ]


def _anomaly(attempt: int, step: int, rank: int | None, events: Events) -> list[str]:
    found = _named(events, "anomaly_detected", attempt)
    if len(found) != 1:
        return [f"attempt {attempt}: {len(found)} anomaly_detected events, expected 1 (nan)"]
    (a,) = found
    seen = (a["kind"], a["step"], a["onset"], a["rank"], a["value"])
    want = ("nonfinite_loss", step, step, rank, None)
    if seen != want:
        return [f"attempt {attempt}: anomaly (kind, step, onset, rank, value) {seen}, not {want}"]
    return []


def _rolled_back(s: Schedule, r: Rollback, events: Events) -> list[str]:
    where = f"attempt {r.attempt}"
    found = _named(events, "rolled_back", r.attempt)
    if len(found) != 1:
        return [f"{where}: {len(found)} rolled_back events, expected 1"]
    (back,) = found
    index = _index(events, back)
    to = _newest_before(events, index, r.step)
    skipped = r.resume - (0 if to is None else to + 1)
    seen = (back["from_step"], back["onset"], back["to_step"], back["resume_step"])
    out = []
    if seen != (r.step, r.step, to, r.resume):
        out.append(
            f"{where}: rolled back (from, onset, to, resume) {seen}, not {(r.step,) * 2}, "
            f"{to}, {r.resume}"
        )
    if back["skipped_steps"] != skipped:
        out.append(f"{where}: {back['skipped_steps']} steps skipped, expected {skipped}")
    if any(d < r.step for d in back["discarded"]):
        out.append(f"{where}: discarded {back['discarded']}, some before the onset {r.step}")
    if back["rollbacks_left"] != r.rollbacks_left:
        out.append(f"{where}: rollbacks_left {back['rollbacks_left']}, expected {r.rollbacks_left}")
    out += _restart_after(s, r, events, index)
    out += _loads_after(r, back, events, index)
    return out


def _restart_after(s: Schedule, r: Rollback, events: Events, index: int) -> list[str]:
    restarts = _named(events, "restart_scheduled", r.attempt)
    charged_before = sum(
        1 for e in events[:index] if e["event"] == "restart_scheduled" and e["charged"]
    )
    want = (False, 0.0, s.max_restarts - charged_before)
    seen = [(e["charged"], e["backoff_s"], e["restarts_left"]) for e in restarts]
    if seen != [want]:
        return [f"attempt {r.attempt}: restarts (charged, backoff, left) {seen}, expected {[want]}"]
    return []


def _loads_after(r: Rollback, back: Mapping[str, Any], events: Events, index: int) -> list[str]:
    out = []
    skipped = {e["path"] for e in _named(events, "checkpoint_skipped")}
    for e in events[index:]:
        if e["event"] != "checkpoint_loaded" or e["attempt"] <= r.attempt:
            continue
        path = e["checkpoint"]
        step = None if path is None else _step_of(path)
        memory = e.get("source") in ("memory", "replica")
        if e["attempt"] == r.attempt + 1 and memory:
            out.append(f"attempt {e['attempt']} loads {path} from memory after the rollback")
        if e["attempt"] == r.attempt + 1 and step != back["to_step"]:
            told = back["to_step"]
            damaged = told is not None and any(_step_of(p) == told for p in skipped)
            if not (damaged and (step is None or step < told)):
                out.append(f"attempt {e['attempt']} loads step {step}, rolled back to {told}")
        if memory:  # every snapshot newer than the checkpoint restored went with it
            restored = -1 if back["to_step"] is None else back["to_step"]
            if step is not None and restored < step < r.resume:
                out.append(f"attempt {e['attempt']} loads {path}, discarded by the rollback")
        elif step is not None and step >= r.step and not _committed_between(events, path, index, e):
            out.append(f"attempt {e['attempt']} loads {path}, discarded by the rollback")
    return out


def _committed_between(events: Events, path: str, after: int, loaded: Mapping[str, Any]) -> bool:
    end = _index(events, loaded)
    return any(
        e["event"] == "checkpoint_committed" and e["path"] == path for e in events[after:end]
    )


def _gave_up(s: Schedule, attempt: int, events: Events) -> list[str]:
    where = f"attempt {attempt}"
    out = []
    if _named(events, "rolled_back", attempt):
        out.append(f"{where}: rolled back, but must give up ({s.gives_up_because})")
    want = _GIVE_UP_REASON.get(s.gives_up_because or "", "?")
    reasons = [e["reason"] for e in _named(events, "job_gave_up", attempt)]
    if not any(reason.startswith(want) for reason in reasons):
        out.append(f"{where}: gave up with {reasons}, expected a reason starting {want!r}")
    return out


def on_disk(events: Iterable[Mapping[str, Any]], keep_last: int | None = None) -> dict[str, int]:
    """The storage checkpoints on disk after ``events`` (path -> step): every commit, the
    ``keep_last`` newest kept (None: every one), rollbacks' discards removed."""
    disk: dict[str, int] = {}
    for e in events:
        if e["event"] == "checkpoint_committed":
            disk[e["path"]] = e["step"]
            if keep_last is not None:
                disk = dict(sorted(disk.items(), key=lambda item: item[1])[-keep_last:])
        elif e["event"] == "rolled_back":
            disk = {p: s for p, s in disk.items() if s < e["onset"]}
    return disk


def _newest_before(events: Events, index: int, step: int) -> int | None:
    """The newest checkpoint of a step before ``step`` on disk when ``events[index]`` was
    written (pruned to the ``KEEP_LAST`` newest)."""
    earlier = [s for s in on_disk(events[:index], KEEP_LAST).values() if s < step]
    return max(earlier) if earlier else None


def _index(events: Events, event: Mapping[str, Any]) -> int:
    return next(i for i, e in enumerate(events) if e is event)


def _step_of(path: str) -> int:
    return int(path.rstrip("/").rsplit("step-", 1)[1])
