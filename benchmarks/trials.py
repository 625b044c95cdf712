"""Running one trial of one tool and reducing it to the numbers every figure uses."""

from __future__ import annotations

import math
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from . import records
from .records import Record
from .table import Cell
from .tools import WORLD, Run, Spec, Tool


@dataclass
class Outcome:
    """What one trial produced."""

    rc: int | None  # the launcher's exit code; None: killed at the cap
    launch_t: float
    end_t: float  # launcher exit (or the cap)
    records: list[Record]
    noticed: list[float]
    spec: Spec

    @property
    def wall_s(self) -> float:
        return self.end_t - self.launch_t

    @property
    def fault_t(self) -> float | None:
        fault = records.first_event(self.records, "fault")
        return None if fault is None else fault.t

    def detect_s(self) -> float | None:
        """Fault -> the tool's first sign of noticing it."""
        f = self.fault_t
        if f is None:
            return None
        seen = records.first_at_or_after(self.noticed, f)
        return None if seen is None else seen - f

    def mttr_s(self) -> float | None:
        """Fault -> the first resumed step on every rank."""
        f = self.fault_t
        if f is None:
            return None
        back = records.all_ranks_stepped(self.records, WORLD, after=f)
        return None if back is None else back - f

    def cold_start_s(self) -> float | None:
        """Launch -> the first step on every rank."""
        first = records.all_ranks_stepped(self.records, WORLD, after=self.launch_t)
        return None if first is None else first - self.launch_t

    def completed(self) -> bool:
        return records.completed(self.records, WORLD, self.spec.steps)

    def attempts(self) -> int:
        """Processes of rank 0 that started training (one per attempt)."""
        return len({r.pid for r in self.records if r.rank == 0 and r.event == "start"})


def run_trial(
    tool: Tool,
    spec: Spec,
    workdir: Path,
    cap_s: float,
    *,
    during: Callable[[Run], None] | None = None,
    env: Mapping[str, str] | None = None,
) -> Outcome:
    """Launch (``env``: more environment), optionally act on the run (``during``), wait for the
    end or the cap, kill the tree."""
    if workdir.exists():
        shutil.rmtree(workdir)
    run = tool.launch(spec, workdir, env)
    with run:
        if during is not None:
            during(run)
        left = cap_s - (time.time() - run.launch_t)
        rc = run.wait(max(0.0, left))
        end_t = time.time()
    return Outcome(rc, run.launch_t, end_t, run.records(), tool.noticed(workdir), spec)


def add_seconds(cell: Cell, value: float | None) -> None:
    if value is not None and not math.isnan(value):
        cell.add(value)


def success_text(ok: int, n: int) -> str:
    return f"{ok}/{n} ({100.0 * ok / n:.0f}%)" if n else "-"
