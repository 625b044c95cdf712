"""What must hold after a chaos run, whatever was injected: a pure function of the schedule and
what was observed, returning every violation in words.

- every ``rvsup start`` exits as its ending demands (75 after SIGTERM/SIGUSR1, killed after
  SIGKILL, then 0, or 3 when the budget runs out);
- one ``attempt_started`` per attempt; its ranks report (``checkpoint_loaded``) a checkpoint
  that was committed, resuming at its step + 1 (or at the newest earlier rollback's resume
  step, when that is later), never a damaged or torn one; a damaged checkpoint is reported
  skipped, unless the next attempt resumed from a newer memory snapshot (reading no
  storage); a snapshot damaged between two starts (the memory tier) is not loaded by the next
  attempt, and is reported skipped when that attempt was started from it;
- each attempt ends as its fault demands: the failure kind, the rank named first, the last step
  within one step of where the fault struck; a stop as ``job_stopped``; a lost daemon as
  ``attempt_closed`` "supervisor lost"; a NaN as ``nonfinite_loss`` of its rank, at its step or
  later, and rolled back as :mod:`.rollbacks` says;
- the budget arithmetic: one charged ``restart_scheduled`` per charged failure (none for the one
  that spends the budget), ``restarts_left`` counting down from ``max_restarts``; a rollback
  spends none of it;
- a full disk shows as ``checkpoint_failed`` ("No space left") in its window, and nothing else;
  a full ``memory_dir`` as ``memory_tier_off`` ("No space left") if anything, never a failure;
- no ``resume_diverged``: every resume is exact, and the resume check agrees;
- the job ends with ``job_succeeded`` or ``job_gave_up``; ``rvsup history`` has no attempt
  left ``unknown`` or ``running``.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping, Sequence
from typing import Any

from .rollbacks import check_rollbacks, on_disk
from .schedule import CHARGED, ENOSPC_STEPS, FAILURE_KIND, ROLLED_BACK, Schedule

__all__ = ["check", "expected_exit_codes"]

_STOPS = {"term": 75, "usr1": 75, "daemonkill": -9}
_STOP_KINDS = frozenset({"preempted", "timelimit", "stopped"})


def expected_exit_codes(s: Schedule) -> list[int]:
    """Exit code of every ``rvsup start`` of the run, in order."""
    codes = []
    for attempt in range(1, s.attempts + 1):
        ending = s.ending(attempt)
        if ending and ending[0].kind in _STOPS:
            codes.append(_STOPS[ending[0].kind])
    return [*codes, s.exit_code]


def check(
    s: Schedule,
    *,
    exit_codes: Sequence[int],
    events: Sequence[Mapping[str, Any]],
    save_killed: Mapping[int, int],
    damaged: Mapping[int, str],
    history: str,
    snapshot_damaged: Mapping[int, str] | None = None,
    memory_every: int | None = None,
) -> list[str]:
    """Every invariant ``events`` (the run's ``events.jsonl``) and the rest break;
    ``snapshot_damaged``: attempt -> the memory snapshot damaged after it; ``memory_every``:
    the job's ``memory_every_steps`` when a number (None: "auto" or the tier off)."""
    out: list[str] = []
    want = expected_exit_codes(s)
    if list(exit_codes) != want:
        out.append(f"exit codes {list(exit_codes)}, expected {want}")
    out += _resumes(s, events, damaged)
    out += _damaged_snapshots(events, snapshot_damaged or {})
    for attempt in range(1, s.attempts + 1):
        out += _ending(s, attempt, events, save_killed)
        out += _full_disk(s, attempt, events)
        out += _full_memory(s, attempt, events, memory_every)
    out += _budget(s, events)
    out += check_rollbacks(s, events)
    # every resume is exact (the final state is compared elsewhere): the resume check agrees
    out += [
        f"attempt {d['attempt']}: resume_diverged at step {d['step']} ({d['what']})"
        for d in _named(events, "resume_diverged")
    ]
    final = "job_gave_up" if s.gives_up else "job_succeeded"
    if not _named(events, final):
        out.append(f"no {final} event")
    if "unknown" in history or "running" in history:
        out.append("rvsup history leaves an attempt unknown or running")
    return out


def _named(events: Sequence[Mapping[str, Any]], name: str, attempt: int | None = None) -> list[Any]:
    return [
        e for e in events if e["event"] == name and (attempt is None or e.get("attempt") == attempt)
    ]


def _recommitted(events: Sequence[Mapping[str, Any]], path: str, after: int, before: int) -> bool:
    """Whether ``path`` was committed again by an attempt between ``after`` and ``before`` (a
    damaged checkpoint that a later attempt wrote anew is whole again)."""
    return any(
        e["path"] == path and after < e["attempt"] < before
        for e in _named(events, "checkpoint_committed")
    )


def _memory_resume(
    events: Sequence[Mapping[str, Any]],
    attempt: int,
    path: str,
    resume: int,
    floor: int,
    damaged: Mapping[int, str],
) -> list[str]:
    """A resume from a memory snapshot (named ``step-NNNNNNNNNN``, not logged as committed): at
    its step + 1, and never from a snapshot older than the newest storage checkpoint usable
    before that attempt (the daemon takes memory only when it is newer)."""
    name = path.rstrip("/").rsplit("/", 1)[-1]
    if not name.startswith("step-") or not name[5:].isdigit():
        return [f"attempt {attempt} resumes from memory at {path}, not a snapshot's name"]
    step = int(name[5:])
    out = []
    if resume != max(step + 1, floor):
        out.append(f"attempt {attempt} resumes at {resume} from snapshot {path}, not at {step + 1}")
    storage = _storage_before(events, attempt, damaged)
    if storage is not None and step < storage:
        out.append(
            f"attempt {attempt} resumes from snapshot {step}, older than storage's {storage}"
        )
    return out


def _storage_before(
    events: Sequence[Mapping[str, Any]], attempt: int, damaged: Mapping[int, str]
) -> int | None:
    """The newest storage checkpoint an attempt could load: committed before it, not discarded
    by a rollback since, not damaged between two starts since (unless committed again)."""
    disk = on_disk(itertools.takewhile(lambda e: e.get("attempt", 0) < attempt, events))
    for after, path in damaged.items():
        if after < attempt and not _recommitted(events, path, after, attempt):
            disk.pop(path, None)
    return max(disk.values(), default=None)


def _resumes(
    s: Schedule, events: Sequence[Mapping[str, Any]], damaged: Mapping[int, str]
) -> list[str]:
    out = []
    started = sorted(e["attempt"] for e in _named(events, "attempt_started"))
    if started != list(range(1, s.attempts + 1)):
        out.append(f"attempts started {started}, expected 1..{s.attempts}")
    committed = {e["path"]: e["step"] for e in _named(events, "checkpoint_committed")}
    skipped = {e["path"] for e in _named(events, "checkpoint_skipped")}
    for attempt in started:
        loaded = _named(events, "checkpoint_loaded", attempt)
        if len(loaded) != 1:
            out.append(f"attempt {attempt}: {len(loaded)} checkpoint_loaded events, expected 1")
            continue
        path, resume = loaded[0]["checkpoint"], loaded[0]["resume_step"]
        floor = s.skip_to(attempt) or 0  # a rollback's skipped steps stay skipped
        if path is None:
            if resume != floor:
                out.append(f"attempt {attempt} resumes at {resume} from no checkpoint")
            continue
        if loaded[0].get("source") in ("memory", "replica"):
            out.extend(_memory_resume(events, attempt, path, resume, floor, damaged))
            continue
        step = committed.get(path)
        if step is None or resume != max(step + 1, floor):
            out.append(
                f"attempt {attempt} resumes at {resume} from {path} (committed as step {step}), "
                f"not at max(its step + 1, {floor})"
            )
        bad = [
            a
            for a, p in damaged.items()
            if p == path and a < attempt and not _recommitted(events, path, a, attempt)
        ]
        if bad:
            out.append(f"attempt {attempt} loads {path}, damaged after attempt {bad[0]}")
    for attempt, path in damaged.items():
        after = _named(events, "checkpoint_loaded", attempt + 1)
        from_memory = any(e.get("source") in ("memory", "replica") for e in after)
        if path not in skipped and not from_memory:  # a resume from memory reads no storage
            out.append(f"the checkpoint damaged after attempt {attempt} is not reported skipped")
    return out


def _damaged_snapshots(
    events: Sequence[Mapping[str, Any]], damaged: Mapping[int, str]
) -> list[str]:
    """A snapshot damaged between two starts is never loaded by the next attempt; when that
    attempt was started from it (``attempt_started`` names it), the ranks report it skipped."""
    out = []
    for after, path in damaged.items():
        attempt = after + 1
        loaded = [e["checkpoint"] for e in _named(events, "checkpoint_loaded", attempt)]
        if path in loaded:
            out.append(f"attempt {attempt} loads snapshot {path}, damaged after attempt {after}")
        named = [e.get("checkpoint") for e in _named(events, "attempt_started", attempt)]
        skipped = {e["path"] for e in _named(events, "checkpoint_skipped", attempt)}
        if path in named and path not in skipped:
            out.append(f"the snapshot damaged after attempt {after} is not reported skipped")
    return out


def _ending(
    s: Schedule, attempt: int, events: Sequence[Mapping[str, Any]], save_killed: Mapping[int, int]
) -> list[str]:
    ending = s.ending(attempt)
    failures = _named(events, "failure_detected", attempt)
    where = f"attempt {attempt}"
    if not ending:
        return [f"{where}: unexpected failure {f['kind']}: {f['detail']}" for f in failures]
    kind = ending[0].kind
    if kind in ("term", "usr1"):
        out = [
            f"{where}: failure {f['kind']} during a stop"
            for f in failures
            if f["kind"] not in _STOP_KINDS
        ]
        if not _named(events, "job_stopped", attempt):
            out.append(f"{where}: no job_stopped")
        return out
    if kind == "daemonkill":
        closed = [e["outcome"] for e in _named(events, "attempt_closed", attempt)]
        out = [f"{where}: unexpected failure {f['kind']}" for f in failures]
        return out if closed == ["supervisor lost"] else [*out, f"{where}: closed as {closed}"]
    if len(failures) != 1:
        return [f"{where}: {len(failures)} failure_detected events, expected 1 ({kind})"]
    (f,) = failures
    out = []
    want = FAILURE_KIND[kind]
    if f["kind"] != want:
        out.append(f"{where}: {kind} reported as {f['kind']} ({f['detail']}), expected {want}")
    ranks = {g.rank for g in ending}
    if not f["ranks"] or not set(f["ranks"]) <= {0, 1}:
        out.append(f"{where}: ranks {f['ranks']}")
    elif len(ending) == 1 and kind != "zygotekill" and f["ranks"][0] not in ranks:
        out.append(f"{where}: {kind} of rank {ending[0].rank} blames ranks {f['ranks']}")
    # at a save (a snapshot): the step it caught; the zygote: the ranks' step just before
    aimed = kind in ("savekill", "snapkill", "zygotekill")
    struck = save_killed.get(attempt, ending[0].step) if aimed else ending[0].step
    if kind in ROLLED_BACK:  # the ranks train on until the attempt is torn down
        if f["last_step"] is None or f["last_step"] < struck:
            out.append(f"{where}: {kind} at step {struck} reported at last step {f['last_step']}")
        return out
    # within one step: the step before, the one struck or, for a kill aimed at a save (which
    # lands a moment after the save was seen), the step the rank went on to run
    # a snapshot is written while its rank trains on: the kill may land two steps later
    late = 3 if kind in ("snapkill", "zygotekill") else 2 if aimed else 1
    near = range(struck - 1, struck + late)
    if f["last_step"] not in near:
        out.append(f"{where}: {kind} at step {struck} reported at last step {f['last_step']}")
    return out


def _full_disk(s: Schedule, attempt: int, events: Sequence[Mapping[str, Any]]) -> list[str]:
    out = []
    for f in s.in_attempt(attempt):
        if f.kind != "enospc":
            continue
        window = range(f.step, f.step + ENOSPC_STEPS + 1)
        failed = [
            e
            for e in _named(events, "checkpoint_failed", attempt)
            if e["step"] in window and "No space left" in e["reason"]
        ]
        if not failed:
            out.append(f"attempt {attempt}: no checkpoint_failed (No space left) in {window}")
    return out


def _full_memory(
    s: Schedule, attempt: int, events: Sequence[Mapping[str, Any]], every: int | None
) -> list[str]:
    """A full ``memory_dir`` never fails the run (the other invariants); where it turns the
    tier off, the event says no space was left. Its absence is no violation: a snapshot
    committed just before the fill prunes an older one, and the space freed may take the
    next snapshots of the window (seed 4, run 86 of ``--memory 3``; the test of
    tests/jobs/test_memory_tier.py shows the event on a tmpfs too small for any snapshot).
    Not after the writers were killed in the attempt: they died, which turns it off too."""
    if every is None:
        return []
    out = []
    for f in s.in_attempt(attempt):
        killed = any(g.kind == "writerkill" and g.step < f.step for g in s.in_attempt(attempt))
        if f.kind != "shmfull" or killed:
            continue
        reasons = [e["reason"] for e in _named(events, "memory_tier_off", attempt)]
        if reasons and not any("No space" in r for r in reasons):
            out.append(
                f"attempt {attempt}: memory_dir full from step {f.step}, tier off: {reasons}"
            )
    return out


def _budget(s: Schedule, events: Sequence[Mapping[str, Any]]) -> list[str]:
    charged_endings = sum(
        1 for a in range(1, s.attempts + 1) if s.ending(a) and s.ending(a)[0].kind in CHARGED
    )
    want_restarts = charged_endings - (1 if s.gives_up_because == "restart budget" else 0)
    restarts = [e for e in _named(events, "restart_scheduled") if e["charged"]]
    out = []
    if len(restarts) != want_restarts:
        out.append(f"{len(restarts)} charged restarts, expected {want_restarts}")
    left = [e["restarts_left"] for e in restarts]
    want_left = [s.max_restarts - k for k in range(1, len(restarts) + 1)]
    if left != want_left:
        out.append(f"restarts_left {left}, expected {want_left}")
    return out
