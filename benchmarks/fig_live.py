"""Figure 12: kill -9 of one rank at step 60 and live recovery.

torchft (the killed replica group heals from the healthy one while that one trains on) against
rvsup with its memory tier (every rank restarts from a snapshot in host memory), and rvsup
storage-only and torchrun for reference. Every number comes from the ranks' records
(:mod:`benchmarks.records`), the same way for every column; the final parameters are compared
with an uninterrupted run of the same column.
"""

from __future__ import annotations

import json
import math
import statistics
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from . import records
from .fig_faults import slug
from .profiles import Context
from .table import Cell, Table, fmt
from .tools import WORLD, Rvsup, Spec, Tool, Torchrun, _lines
from .torchft_tool import TorchFT
from .trials import Outcome, run_trial, success_text

FAULT_STEP = 60
KILLED, HEALTHY = 1, 0
STEP_MS = 100  # every column's pace: the healthy torchft group must not finish before the heal
LIVE_STEPS = 300  # 24 s of training after the kill at the pace
MEMORY_EVERY = 5
CAP_S = 240.0
TORCHFT = "torchft"
MEMORY = f"rvsup (memory tier, every {MEMORY_EVERY})"
STORAGE = "rvsup (storage only)"
TORCHRUN = "torchrun (workaround)"


def live_tools(ctx: Context) -> dict[str, Tool]:
    tools: dict[str, Tool] = {
        TORCHFT: TorchFT(venv=ctx.torchft_venv),
        MEMORY: Rvsup(memory_every_steps=MEMORY_EVERY),
        STORAGE: Rvsup(),
        TORCHRUN: Torchrun(share_store=False),
    }
    if ctx.profile.smoke:
        return {MEMORY: tools[MEMORY]}
    return tools


@dataclass(frozen=True)
class Live:
    """One trial of the figure, reduced from its records."""

    mttr_s: float | None  # kill -> every rank finished a common step after it
    redone: tuple[int, ...]  # per rank: steps finished twice
    discarded: tuple[int, ...]  # per rank: steps computed and not committed
    stall_s: float | None  # the healthy rank's longest time without progress
    missed: int  # steps the job took without the killed rank's batch
    resumed_at: int | None  # the killed rank's first step after the kill


def reduce(o: Outcome, world: int = WORLD) -> Live:
    """A trial's figures, from its records alone."""
    fault = o.fault_t
    back = None if fault is None else records.rejoined(o.records, world, fault)
    stall = None
    if fault is not None:
        stall = records.progress_stall(o.records, HEALTHY, fault, back or o.end_t)
    return Live(
        mttr_s=None if fault is None or back is None else back - fault,
        redone=tuple(records.steps_computed_twice(o.records, r) for r in range(world)),
        discarded=tuple(records.discarded_steps(o.records, r) for r in range(world)),
        stall_s=stall,
        missed=records.steps_without(o.records, KILLED),
        resumed_at=None if fault is None else _first_step(o.records, KILLED, fault),
    )


def _first_step(rs: list[records.Record], rank: int, after: float) -> int | None:
    return next((r.step for r in rs if r.rank == rank and r.event == "step" and r.t > after), None)


def relative_difference(a: bytes, b: bytes) -> float | None:
    """||a - b|| / ||b|| of two float32 vectors (0.0: equal); None when they cannot be compared."""
    if len(a) != len(b) or not a or len(a) % 4:
        return None
    x, y = array("f", a), array("f", b)
    num = math.fsum((p - q) ** 2 for p, q in zip(x, y, strict=True))
    den = math.fsum(q * q for q in y)
    return math.sqrt(num / den) if den else None


def final_states(record_dir: Path, world: int = WORLD) -> list[bytes] | None:
    """Every rank's final parameters (``final-rank-<r>.bin``), or None if one is missing."""
    out = []
    for r in range(world):
        path = record_dir / f"final-rank-{r}.bin"
        if not path.exists():
            return None
        out.append(path.read_bytes())
    return out


@dataclass
class Compared:
    """Final parameters of interrupted runs against the uninterrupted one."""

    identical: int = 0
    compared: int = 0
    differences: list[float] | None = None

    def add(self, got: list[bytes] | None, reference: list[bytes] | None) -> None:
        if got is None or reference is None:
            return
        self.compared += 1
        if got == reference:
            self.identical += 1
            return
        diffs = [relative_difference(a, b) for a, b in zip(got, reference, strict=True)]
        worst = max((d for d in diffs if d is not None), default=None)
        if worst is not None:
            self.differences = [*(self.differences or []), worst]

    def render(self) -> str:
        if not self.compared:
            return "-"
        text = f"bit-identical {self.identical}/{self.compared}"
        if self.differences:
            lo, hi = min(self.differences), max(self.differences)
            med = statistics.median(self.differences)
            text += f"; differ: relative L2 {med:.1e} ({lo:.1e}\u2013{hi:.1e})"
        return text


def rvsup_sources(workdir: Path) -> list[str]:
    """``source@resume_step`` of rvsup's ``checkpoint_loaded`` events (what each restart loaded)."""
    out = []
    for line in _lines(workdir / "run" / "events.jsonl"):
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("event") == "checkpoint_loaded" and d.get("checkpoint"):
            out.append(f"{d.get('source') or 'storage'}@{d.get('resume_step')}")
    return out


def restored_from(col: str, workdir: Path, live: Live) -> str:
    if col == TORCHFT:
        return f"the other group@{live.resumed_at}"
    if col == TORCHRUN:
        return f"torch.save file@{live.resumed_at}"
    return ", ".join(rvsup_sources(workdir)) or f"?@{live.resumed_at}"


@dataclass
class Column:
    """What the figure measured for one column."""

    step_ms: Cell = field(default_factory=lambda: Cell(unit=" ms"))
    mttr: Cell = field(default_factory=lambda: Cell(unit=" s"))
    stall: Cell = field(default_factory=lambda: Cell(unit=" s"))
    redone: list[Cell] = field(default_factory=lambda: [Cell(digits=0) for _ in range(WORLD)])
    discarded: Cell = field(default_factory=lambda: Cell(digits=0))
    missed: Cell = field(default_factory=lambda: Cell(digits=0))
    sources: list[str] = field(default_factory=list)
    compared: Compared = field(default_factory=Compared)
    same_training: Compared = field(default_factory=Compared)  # uninterrupted, against torchrun's
    ok: int = 0
    runs: int = 0

    def add(self, one: Live, source: str) -> None:
        self.mttr.add(one.mttr_s)
        self.stall.add(one.stall_s)
        for r, cell in enumerate(self.redone):
            cell.add(float(one.redone[r]))
        self.discarded.add(float(sum(one.discarded)))
        self.missed.add(float(one.missed))
        self.sources.append(source)
        self.runs += 1


def live(ctx: Context) -> Table:
    p = ctx.profile
    tools = live_tools(ctx)
    steps = p.steps if p.smoke else LIVE_STEPS
    env = {"BENCH_STEP_MS": str(STEP_MS), "BENCH_FINAL": "1"}
    fault = Spec(steps, p.ckpt_every, f"kill:{KILLED}:{FAULT_STEP}")
    clean = Spec(steps, p.ckpt_every)
    reference: dict[str, list[bytes] | None] = {}
    cols = {c: Column() for c in tools}
    for col, tool in tools.items():  # the uninterrupted run of each column first
        if tool.unavailable():
            continue
        workdir = ctx.scratch / "live" / slug(col) / "uninterrupted"
        o = run_trial(tool, clean, workdir, CAP_S, env=env)
        reference[col] = final_states(workdir / "records") if o.completed() else None
        durations = records.step_durations(o.records, HEALTHY)
        cols[col].step_ms.add(1000 * statistics.median(durations) if durations else None)
        ctx.log(f"live uninterrupted {col}: rc={o.rc} wall={o.wall_s:.1f} s")
    for col in tools:
        if col in reference and TORCHRUN in reference:
            cols[col].same_training.add(reference[col], reference[TORCHRUN])
    for i in range(p.n):
        for col, tool in tools.items():
            if tool.unavailable():
                continue
            workdir = ctx.scratch / "live" / slug(col) / str(i)
            o = run_trial(tool, fault, workdir, CAP_S, env=env)
            one = reduce(o)
            cols[col].add(one, restored_from(col, workdir, one))
            if o.rc == 0 and o.completed():
                cols[col].ok += 1
                cols[col].compared.add(final_states(workdir / "records"), reference.get(col))
            ctx.log(
                f"live {i + 1}/{p.n} {col}: rc={o.rc} mttr={fmt(one.mttr_s, ' s')} "
                f"stall={fmt(one.stall_s, ' s')} redone={one.redone} missed={one.missed}"
            )
    return table(tools, cols, steps, ctx.profile.ckpt_every)


def table(tools: dict[str, Tool], cols: dict[str, Column], steps: int, ckpt_every: int) -> Table:
    """The figure's table; a column whose tool cannot run here says why in every row."""
    t = Table(
        "live",
        f"12. Live recovery: kill -9 of rank {KILLED} at step {FAULT_STEP} ({steps} steps paced "
        f"at {STEP_MS} ms, storage checkpoint every {ckpt_every}; torchft: {WORLD} replica "
        "groups of 1 rank, min_replicas 1)",
        list(tools),
    )

    def row(label: str, value: Callable[[Column], Cell | str]) -> None:
        t.row(label, {c: tools[c].unavailable() or value(cols[c]) for c in tools})

    row("MTTR (kill -> every rank finished a common step)", lambda c: c.mttr)
    row(f"steps redone, rank {HEALTHY} (healthy)", lambda c: c.redone[HEALTHY])
    row(f"steps redone, rank {KILLED} (killed)", lambda c: c.redone[KILLED])
    row("steps computed and not committed (both ranks)", lambda c: c.discarded)
    row(f"steps taken without rank {KILLED}'s batch", lambda c: c.missed)
    row(f"rank {HEALTHY} (healthy): longest time without progress", lambda c: c.stall)
    row(f"rank {KILLED} restored from @ its first step", lambda c: "; ".join(c.sources) or "-")
    row("final parameters vs an uninterrupted run", lambda c: c.compared.render())
    row("finished", lambda c: success_text(c.ok, c.runs))
    row(
        f"uninterrupted run vs {TORCHRUN}'s (the same training?)",
        lambda c: c.same_training.render(),
    )
    row("step time, uninterrupted run (rank 0, median)", lambda c: c.step_ms)
    ours = cols[TORCHFT].mttr if TORCHFT in cols else None
    if ours is not None and ours.values:
        for col in (MEMORY, STORAGE, TORCHRUN):
            if col in cols and cols[col].mttr.values:
                t.add_ratio(f"MTTR {col} / torchft", cols[col].mttr, ours)
    t.notes += NOTES
    return t


NOTES = [
    (
        "NOT like for like: torchft never restarts the healthy group; once the lighthouse has "
        "dropped the dead group it trains on alone until the killed group is back (those steps "
        "have half the global batch: the row 'steps taken without rank 1's batch'), then the "
        "killed group copies the healthy one's model, optimizer and step and joins at the job's "
        "current step (its gradient counts as zeros in that step); rvsup and torchrun stop every "
        "rank and restart both from a checkpoint (rvsup: the newest memory snapshot or storage "
        "checkpoint; torchrun: the script's own torch.save file), redoing the steps since."
    ),
    (
        "torchft's healthy group waits for the lighthouse to drop the dead group (its heartbeat "
        "timeout, 5 s as shipped) before it trains alone: its longest time without progress is "
        "that wait. Under rvsup and torchrun the healthy rank is restarted too: its time without "
        "progress runs from its last step before the kill to its first step past it."
    ),
    (
        "The final parameters are compared with an uninterrupted run of the same column, rank by "
        "rank. torchft's may legitimately differ: the steps the job took without one group's "
        "batch are other steps. torchrun's script checkpoint does not restore the RNG states, so "
        "its batches after the restart differ."
    ),
    (
        "MTTR here: kill -> the first time every rank had finished the same step after the kill "
        "(figure 1 counts new processes only; torchft's healthy rank is no new process)."
    ),
]
