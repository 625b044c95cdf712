"""Checks the goodput simulator against a measured run (a program, not a test).

``python -m benchmarks.goodput_check`` measures, on this machine, each column's component costs
in runs of one fault each (the cold start and the end, a step's time, a kill -9's and a hang's
time to recover), then runs figure 13's mixed faults (two kills, a SIGSTOP, a rank stuck in a
receive, storage every third of the run) and compares its measured goodput (figure 5's:
useful-step time over wall time) with what the model (:mod:`.goodput_model`) predicts from
those costs. The restart delays the daemon drew (jittered) are read from the run's history and
replayed, as are the fault steps; the model works out everything else, the steps redone
included. Columns: rvsup with the memory tier every 5 steps, and storage-only. It writes the
local costs for ``python -m benchmarks.goodput_sim --costs`` (``--costs-out``; torchrun's from
a crash run of its own, ft_launcher's from docs/benchmarks.md).

Options: ``--steps`` (the mixed run's, default 1500), ``--out FILE`` (JSON of the table),
``--costs-out FILE``, ``--scratch DIR``, ``--smoke`` (400 steps).
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from . import records
from .fig_lifecycle import mixed_faults
from .goodput_model import Checkpointing, FaultClass, Recovery, RunResult, replay_by_progress
from .goodput_scale import MANIFESTS, LocalCosts
from .table import Cell, Table, Target
from .tools import Rvsup, Spec, Tool, Torchrun, _lines
from .trials import Outcome, run_trial

__all__ = ["HANG", "KILL", "Costs", "main", "predict", "schedule_faults"]

TOLERANCE = 0.05
KILL = FaultClass("kill -9", 1, "crash", False)
HANG = FaultClass("SIGSTOP or stuck in a receive", 1, "hang", False)
COLUMNS: dict[str, tuple[Rvsup, int | None]] = {
    "rvsup (memory tier, every 5)": (Rvsup(memory_every_steps=5), 5),
    "rvsup (storage only)": (Rvsup(), None),
}


@dataclass(frozen=True)
class Costs:
    """One column's costs measured in runs of one fault each (seconds)."""

    cold_s: float  # launch -> every rank's first step
    end_s: float  # the last step -> the launcher's exit
    step_s: float  # a step, saves included (rank 0's useful-step time / steps)
    notice_s: float  # kill -9 -> noticed
    crash_s: float  # kill -9 -> every rank's first resumed step, less a step
    hang_notice_s: float  # the two hangs' mean: the hang -> noticed
    hang_s: float  # the two hangs' mean: the hang -> every rank's first resumed step, less a step


def predict(
    costs: Costs,
    steps: int,
    storage_every: int,
    memory_every: int | None,
    faults: Sequence[tuple[int, FaultClass]],
    delays: Sequence[float],
) -> RunResult:
    """The model's run of ``steps`` steps with ``faults`` (by step), storage every
    ``storage_every`` steps, snapshots every ``memory_every``, the restarts waiting ``delays``
    in turn (what the daemon drew)."""
    waits = list(delays)

    def recorded(used: int, in_a_row: int, rng: random.Random) -> float:
        return waits[used] if used < len(waits) else 0.0

    recovery = Recovery(
        "measured",
        cold_start_s=costs.cold_s + costs.end_s,
        notice_s=dict.fromkeys(MANIFESTS, 0.0),
        restart_s={"crash": costs.crash_s, "hang": costs.hang_s, "node": costs.crash_s},
        replace_s=dict.fromkeys(MANIFESTS, 0.0),
        load_storage_s=0.0,  # within the measured recoveries
        load_memory_s=None if memory_every is None else 0.0,
        backoff=recorded,
    )
    step = costs.step_s
    every_s = None if memory_every is None else memory_every * step
    ckpt = Checkpointing(storage_every * step, 0.0, every_s, 0.0)  # stalls: in step_s
    return replay_by_progress(steps * step, [(s * step, f) for s, f in faults], recovery, ckpt)


def schedule_faults(schedule: str) -> list[tuple[int, FaultClass]]:
    """``kill:1:225,sigstop:0:600,...`` as (step, class) pairs; a kind the model has no
    class for is refused."""
    classes = {"kill": KILL, "sigstop": HANG, "stuck": HANG}
    out = []
    for item in schedule.split(","):
        kind, _, step = item.split(":")[:3]
        if kind not in classes:
            raise ValueError(f"no fault class for {kind!r} (known: {', '.join(classes)})")
        out.append((int(step), classes[kind]))
    return out


def _trial(tool: Tool, spec: Spec, workdir: Path, log: str) -> Outcome:
    cap = 60 + spec.steps * 0.1
    o = run_trial(tool, spec, workdir, cap)
    print(f"  .. {log}: wall {o.wall_s:.1f} s, completed {o.completed()}", file=sys.stderr)
    if not o.completed():
        raise RuntimeError(f"{log}: the run did not finish (see {workdir})")
    return o


def measure(tool: Tool, steps: int, every: int, scratch: Path, name: str) -> Costs:
    """Runs of one fault each: a kill -9 of rank 1, a SIGSTOP of rank 0, rank 1 stuck in a
    receive, each at 60 % of ``steps``."""
    at = steps * 60 // 100
    runs = {
        kind: _trial(tool, Spec(steps, every, f"{kind}:{rank}:{at}"), scratch / name / kind, kind)
        for kind, rank in (("kill", 1), ("sigstop", 0), ("stuck", 1))
    }
    kill = runs["kill"]
    step = records.useful_step_seconds(kill.records) / steps
    last = max(r.t for r in kill.records if r.event == "step")
    mttr = {k: o.mttr_s() for k, o in runs.items()}
    notice = {k: o.detect_s() for k, o in runs.items()}
    cold = kill.cold_start_s()
    if cold is None or None in mttr.values() or None in notice.values():
        raise RuntimeError(f"{name}: a recovery was not measured: {mttr}, noticed {notice}")

    def mean(kinds: tuple[str, ...], of: dict[str, float | None]) -> float:
        return statistics.mean(v for k in kinds if (v := of[k]) is not None)

    return Costs(
        cold_s=cold,
        end_s=kill.end_t - last,
        step_s=step,
        notice_s=mean(("kill",), notice),
        crash_s=mean(("kill",), mttr) - step,
        hang_notice_s=mean(("sigstop", "stuck"), notice),
        hang_s=mean(("sigstop", "stuck"), mttr) - step,
    )


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.goodput_check")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--costs-out", type=Path, default=None)
    parser.add_argument("--scratch", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    steps = 400 if args.smoke else args.steps
    if steps < 100:
        parser.error("--steps must be at least 100")
    scratch = args.scratch or Path(tempfile.mkdtemp(prefix="rvsup-goodput-check-"))
    t0 = time.monotonic()
    try:
        table, costs = _check(steps, scratch)
    finally:
        if args.scratch is None:
            shutil.rmtree(scratch, ignore_errors=True)
    table.wall_s = time.monotonic() - t0
    print(table.render())
    if args.out is not None:
        args.out.write_text(json.dumps(table.to_json(), indent=2))
    if args.costs_out is not None:
        args.costs_out.write_text(json.dumps(asdict(costs), indent=2))
    return 0


def _check(steps: int, scratch: Path) -> tuple[Table, LocalCosts]:
    every = max(10, steps // 3)
    schedule = mixed_faults(steps)
    faults = schedule_faults(schedule)
    table = Table(
        "goodput_check",
        f"The simulator against a measured run: {steps} steps with faults {schedule}, storage "
        f"every {every} steps",
        list(COLUMNS),
    )
    rows: dict[str, dict[str, Cell | str]] = {}
    local = LocalCosts()
    for col, (tool, memory_every) in COLUMNS.items():
        costs = measure(tool, max(100, steps // 5), every, scratch, col)
        mixed = _trial(tool, Spec(steps, every, schedule, None, 10), scratch / col / "mixed", col)
        events = _lines(scratch / col / "mixed" / "run" / "events.jsonl")
        delays = records.rvsup_restart_delays(events)
        measured = records.useful_step_seconds(mixed.records) / mixed.wall_s
        step = records.useful_step_seconds(mixed.records) / steps  # the workload's, this run
        model = predict(replace(costs, step_s=step), steps, every, memory_every, faults, delays)
        alone = predict(costs, steps, every, memory_every, faults, delays)
        predicted, predicted_alone = model.ettr, alone.ettr
        error, error_alone = predicted / measured - 1, predicted_alone / measured - 1
        redone = records.steps_computed_twice(mixed.records, 0)
        cells: dict[str, Cell | str] = {
            "goodput measured": Cell([measured], digits=3),
            "goodput predicted": f"{predicted:.3f} ({100 * error:+.1f} %)",
            "wall measured / predicted": f"{mixed.wall_s:.1f} s / {model.wall_s:.1f} s",
            "steps redone measured / predicted": f"{redone} / {round(model.redone_s / step)}",
            "restart delays drawn": ", ".join(f"{d:.2f} s" for d in delays) or "none",
            "step: the mixed run / the one-fault runs": (
                f"{1000 * step:.1f} ms / {1000 * costs.step_s:.1f} ms"
            ),
            "goodput predicted with the one-fault runs' step": (
                f"{predicted_alone:.3f} ({100 * error_alone:+.1f} %)"
            ),
            "costs: cold, crash, hang": (
                f"{costs.cold_s:.2f} s, {costs.crash_s:.2f} s, {costs.hang_s:.2f} s"
            ),
        }
        for label, cell in cells.items():
            rows.setdefault(label, {})[col] = cell
        table.targets.append(
            Target(
                f"{col}: predicted goodput within {100 * TOLERANCE:.0f} % of the measured",
                f"{100 * error:+.1f} %",
                abs(error) <= TOLERANCE,
            )
        )
        if memory_every is None:
            local = replace(
                local,
                source=f"measured by benchmarks.goodput_check ({steps} steps)",
                rvsup_cold_s=round(costs.cold_s, 3),
                rvsup_notice_crash_s=round(costs.notice_s, 3),
                rvsup_restart_crash_s=round(costs.crash_s - costs.notice_s, 3),
                rvsup_restart_hang_s=round(costs.hang_s - costs.hang_notice_s, 3),
            )
    for label, row in rows.items():
        table.row(label, row)
    torchrun = _trial(
        Torchrun(share_store=False),
        Spec(max(100, steps // 5), max(10, steps // 60), f"kill:1:{steps // 8}"),
        scratch / "torchrun" / "kill",
        "torchrun (workaround) kill",
    )
    cold, mttr, notice = torchrun.cold_start_s(), torchrun.mttr_s(), torchrun.detect_s()
    if cold is not None and mttr is not None and notice is not None:
        local = replace(
            local,
            torchrun_cold_s=round(cold, 3),
            torchrun_notice_crash_s=round(notice, 3),
            torchrun_restart_s=round(mttr - notice, 3),
        )
    table.notes.append(
        "the model is given the fault steps, the costs of the faults measured in runs of one "
        "fault each, the restart delays the daemon drew and the workload's step time (the mixed "
        "run's: it varies by a few % from run to run here, as much as the model's error); it "
        "works out the steps redone and the wall time. The row below it uses the step time of "
        "the one-fault runs instead"
    )
    return table, local


if __name__ == "__main__":
    sys.exit(main())
