"""Figure 11: the training gone wrong. From the anomalous step to the resumed step.

rvsup only (no peer detects a bad loss, see :data:`PEER_NOTE`), on the benchmark workload with
its loss passed to ``worker_sdk.step()`` as a float: rank 1's batch is poisoned at one step (its
loss is NaN: caught at that step), or the loss rank 1 reports is scaled 100x from one step on (a
spike: caught after ``patience`` high heartbeats, once the baseline has its ``min(window, 10)``
values). Each case runs with rvsup's shipped defaults (``backoff = "5s"``, 1 s heartbeats,
``[anomaly]`` defaults) and with ``backoff = "0s"``.

The time is split where the records and events allow: detection (the rank's record of the
anomalous step -> ``anomaly_detected``), restart (-> every rank of the next attempt booted:
teardown, the rollback, the launch), restore (-> every rank's ``resume()`` returned: process
group, model, the checkpoint loaded), first step (-> every rank finished its first resumed
step). For a spike the anomalous step is its onset, the first scaled step.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import records
from .fig_faults import slug
from .profiles import Context
from .records import Record
from .table import Cell, Table, Target
from .tools import WORLD, Rvsup, Spec
from .trials import Outcome, add_seconds, run_trial, success_text

SPIKE_AFTER_S = 16.0
"""Training before the spike: the baseline needs 10 heartbeat values (1 s apart by default)."""
STEP_S = 0.02  # the workload's step on a 2-core machine (figure 6 measures it)
SPIKE_CKPT_EVERY = 100
"""A spike is caught ``patience`` heartbeats after its onset (~3 s, 60-150 steps here): the
checkpoints written meanwhile must not push the last one before the onset out of ``keep_last``
(3), or the rollback finds none and goes back to the start (docs/anomalies.md)."""
CAP_S = 150.0
PEER_NOTE = (
    "torchrun (and the other peers) have no anomaly detection: after a NaN the training goes on "
    "with NaN weights (every later loss is NaN) until someone notices and restarts by hand from "
    "a checkpoint they pick, skipping the batches themselves; a spike is not noticed at all. "
    "No time can be measured for that."
)
ROWS = (
    "total: anomalous step -> resumed step on all ranks",
    "detection: anomalous step -> anomaly_detected",
    "restart: -> next attempt's ranks booted",
    "restore: -> resume() returned on all ranks",
    "first step: -> resumed step done on all ranks",
)


@dataclass(frozen=True)
class Case:
    """One column: the fault and the backoff."""

    label: str
    kind: str  # nan or spike
    backoff: str


@dataclass(frozen=True)
class Split:
    """The seconds of one trial, phase by phase (None where a record is missing)."""

    total: float | None
    detection: float | None
    restart: float | None
    restore: float | None
    first_step: float | None
    resumed_at: int | None
    rolled_back: dict[str, Any] | None


def cases(smoke: bool) -> list[Case]:
    nan = [Case('NaN, defaults (backoff "5s")', "nan", "5s")]
    if smoke:
        return nan
    return [
        *nan,
        Case('NaN, backoff "0s"', "nan", "0s"),
        Case('spike, defaults (backoff "5s")', "spike", "5s"),
        Case('spike, backoff "0s"', "spike", "0s"),
    ]


def split(o: Outcome, events: list[dict[str, Any]]) -> Split:
    """The phases of one trial, from the ranks' records and rvsup's events."""
    fault = records.first_event(o.records, "fault")
    stepped = None
    if fault is not None:
        stepped = next(
            (
                r
                for r in o.records
                if r.event == "step" and r.pid == fault.pid and r.step == fault.step
            ),
            None,
        )
    if stepped is None:
        return Split(None, None, None, None, None, None, None)
    t0 = stepped.t
    anomaly = next((e for e in events if e.get("event") == "anomaly_detected"), None)
    detected = None if anomaly is None else records.iso_to_unix(str(anomaly["timestamp"]))
    born = {r.pid for r in o.records if r.event == "boot" and r.t > t0}  # the next attempt's
    new = [r for r in o.records if r.pid in born]
    booted = _all_ranks(new, "boot")
    started = _all_ranks(new, "start")
    back = _all_ranks(new, "step")
    back_event = next((e for e in events if e.get("event") == "rolled_back"), None)
    return Split(
        total=_minus(back, t0),
        detection=_minus(detected, t0),
        restart=_minus(booted, detected),
        restore=_minus(started, booted),
        first_step=_minus(back, started),
        resumed_at=records.resume_step(o.records, t0),
        rolled_back=back_event,
    )


def anomaly(ctx: Context) -> Table:
    p = ctx.profile
    n = p.n
    t = Table(
        "anomaly",
        "11. Training gone wrong: rank 1's loss NaN at one step, or its reported loss 100x from "
        f"one step on; anomalous step -> resumed step (rvsup, 2 ranks, NaN at step "
        f"{25 if p.smoke else p.fault_step}"
        f"{'' if p.smoke else f', spike from step {int(SPIKE_AFTER_S / STEP_S)}'}, "
        "[anomaly] defaults: skip_steps 1, patience 3, window 50)",
        [c.label for c in cases(p.smoke)],
    )
    cells = {row: {c.label: Cell(unit=" s") for c in cases(p.smoke)} for row in ROWS}
    resumed: dict[str, list[str]] = {c.label: [] for c in cases(p.smoke)}
    completed: dict[str, int] = {}
    for case in cases(p.smoke):
        spec, env = _trial(case, ctx)
        ok = 0
        for i in range(n):
            workdir = ctx.scratch / "anomaly" / slug(case.label) / str(i)
            o = run_trial(Rvsup(backoff=case.backoff), spec, workdir, CAP_S, env=env)
            s = split(o, _events(workdir / "run" / "events.jsonl"))
            for row, value in zip(
                ROWS, (s.total, s.detection, s.restart, s.restore, s.first_step), strict=True
            ):
                add_seconds(cells[row][case.label], value)
            resumed[case.label].append(_resumed_text(s))
            ok += int(o.rc == 0 and o.completed())
            ctx.log(f"anomaly {case.label} {i + 1}/{n}: rc={o.rc} {s}")
        completed[case.label] = ok
    for row in ROWS:
        t.row(row, dict(cells[row].items()))
    t.row("rolled back to -> resumed at (trial 1)", {k: v[0] for k, v in resumed.items() if v})
    t.row("jobs completed", {k: success_text(v, n) for k, v in completed.items()})
    done = sum(completed.values())
    trials = n * len(completed)
    t.targets.append(Target("every rolled-back job completes", success_text(done, trials), None))
    t.notes.append(PEER_NOTE)
    t.notes.append(
        f"NaN: checkpoint every {10 if p.smoke else p.ckpt_every} steps; spike: every "
        f"{SPIKE_CKPT_EVERY} steps, so that keep_last (3) still holds one from before the onset "
        "when the spike is caught."
    )
    if not p.smoke:
        t.notes.append(
            "A rollback restarts at once whatever [restart] backoff says (the backoff is for "
            "failures of the processes); both columns are measured to show it."
        )
    return t


def _trial(case: Case, ctx: Context) -> tuple[Spec, dict[str, str]]:
    p = ctx.profile
    if case.kind == "nan":  # smoke: a short job, the NaN after two checkpoints
        steps, at = (40, 25) if p.smoke else (p.steps, p.fault_step)
        spec = Spec(steps=steps, ckpt_every=10 if p.smoke else p.ckpt_every, fault=f"nan:1:{at}")
        return spec, {"BENCH_LOSS": "1"}
    onset = int(SPIKE_AFTER_S / STEP_S)
    spec = Spec(steps=onset + 200, ckpt_every=SPIKE_CKPT_EVERY, fault=f"spike:1:{onset}")
    return spec, {"BENCH_LOSS": "1", "BENCH_SPIKE_FACTOR": "100"}


def _all_ranks(rs: list[Record], event: str) -> float | None:
    """When every rank had written ``event`` (its first), or None."""
    first: dict[int, float] = {}
    for r in rs:
        if r.event == event and r.rank not in first:
            first[r.rank] = r.t
    return max(first.values()) if len(first) == WORLD else None


def _minus(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _resumed_text(s: Split) -> str:
    if s.rolled_back is None:
        return "no rollback"
    back = s.rolled_back
    to = "the start" if back["to_step"] is None else f"step {back['to_step']}"
    return f"{to} -> step {s.resumed_at} (seen {back['from_step']}, onset {back['onset']})"


def _events(path: Path) -> list[dict[str, Any]]:
    out = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict):
            out.append(d)
    return out
