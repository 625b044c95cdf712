"""Figures 4-6: preemption (SIGTERM), goodput over a schedule of mixed faults, and cold start."""

from __future__ import annotations

import shutil
import signal
import time
from collections import Counter
from dataclasses import dataclass

from . import records
from .fig_faults import slug
from .profiles import CONFIGURED_HANG_S, PG_TIMEOUT_S, Context
from .table import Cell, Table, Target, fmt
from .tools import WORLD, BashLoop, FtLauncher, Rvsup, Spec, Tool, Torchrun
from .trials import run_trial

STOP_CAP_S = 120.0
RESUME_CAP_S = 90.0


def _peers(ctx: Context) -> dict[str, Tool]:
    tools: dict[str, Tool] = {
        "rvsup": Rvsup(),
        "torchrun (workaround)": Torchrun(share_store=False),
        "bash loop": BashLoop(),
        "ft_launcher": FtLauncher(venv=ctx.nvrx_venv, heartbeat_timeout_s=CONFIGURED_HANG_S),
    }
    if ctx.profile.smoke:
        return {k: tools[k] for k in ("rvsup", "torchrun (workaround)")}
    return tools


def mark_unavailable(tools: dict[str, Tool], cells: dict[str, Cell | str]) -> dict[str, Cell | str]:
    """``cells`` with the column of every tool that cannot run here saying why."""
    for col, tool in tools.items():
        if tool.unavailable():
            cells[col] = tool.unavailable() or ""
    return cells


# ---------------------------------------------------------------- 4. preemption
def preempt(ctx: Context) -> Table:
    p = ctx.profile
    tools = _peers(ctx)
    spec = Spec(steps=100_000, ckpt_every=p.ckpt_every)
    lost = {c: Cell(digits=0) for c in tools}
    stop = {c: Cell(unit=" s") for c in tools}
    codes: dict[str, Counter[str]] = {c: Counter() for c in tools}
    for i in range(p.n):
        for col, tool in tools.items():
            if tool.unavailable():
                continue
            workdir = ctx.scratch / "preempt" / slug(col) / str(i)
            if workdir.exists():
                shutil.rmtree(workdir)
            with tool.launch(spec, workdir) as run:
                if not run.wait_group_step(p.fault_step, RESUME_CAP_S):
                    codes[col]["never reached the step"] += 1
                    continue
                t_sig = run.signal_launchers(signal.SIGTERM)
                gone = run.wait_tree_gone(STOP_CAP_S)
                codes[col][str(run.proc.returncode) if gone else "still running"] += 1
            if gone is not None:
                stop[col].add(gone - t_sig)
            done = records.group_step_before(run.records(), time.time(), WORLD)
            with tool.launch(spec, workdir) as again:
                relaunch_t = again.launch_t
                deadline = time.monotonic() + RESUME_CAP_S
                while time.monotonic() < deadline and again.proc.poll() is None:
                    if records.all_ranks_stepped(again.records(), WORLD, after=relaunch_t):
                        break
                    time.sleep(0.05)
                resumed = records.resume_step(again.records(), relaunch_t)
            n_lost = records.lost_steps(done, resumed)
            lost[col].add(None if n_lost is None else float(n_lost))
            ctx.log(
                f"preempt {i + 1}/{p.n} {col}: done={done} resumed={resumed} "
                f"stop={fmt(None if gone is None else gone - t_sig, ' s')}"
            )
    t = Table(
        "preempt",
        f"4. Preemption: SIGTERM to the launcher at step {p.fault_step} (checkpoint every "
        f"{p.ckpt_every}), then the same command again",
        list(tools),
    )
    t.row("steps lost on resume", mark_unavailable(tools, dict(lost)))
    t.row("SIGTERM -> every process gone", mark_unavailable(tools, dict(stop)))
    t.row(
        "launcher exit codes",
        mark_unavailable(
            tools, {c: ", ".join(f"{k} x{v}" for k, v in codes[c].items()) or "-" for c in tools}
        ),
    )
    ours = lost["rvsup"]
    if ours.values:
        t.targets.append(
            Target("preemption: 0 steps lost", f"max {max(ours.values):.0f}", max(ours.values) == 0)
        )
    return t


# ---------------------------------------------------------------- 5. goodput
GOODPUT_STEP_S = 0.03  # the workload's pace, for the cap


def mixed_faults(g: int) -> str:
    """Figure 5's schedule in ``g`` steps: kill -9, SIGSTOP, kill -9, stuck in gloo."""
    return (
        f"kill:1:{g * 15 // 100},sigstop:0:{g * 40 // 100},kill:0:{g * 65 // 100},"
        f"stuck:1:{g * 85 // 100}"
    )


@dataclass
class GoodputRuns:
    """What the goodput trials of every column measured."""

    good: dict[str, Cell]
    wall: dict[str, Cell]
    redone: dict[str, Cell]  # steps rank 0 finished twice
    finished: Counter[str]
    cap: float | None  # None: no trial ran


def goodput_runs(ctx: Context, tools: dict[str, Tool], every: int, name: str) -> GoodputRuns:
    """``n_goodput`` runs per column of :func:`mixed_faults` with a storage checkpoint every
    ``every`` steps, columns in turn (``name``: the scratch folder and the log's label)."""
    p = ctx.profile
    g = p.goodput_steps
    runs = GoodputRuns(
        {c: Cell(digits=3) for c in tools},
        {c: Cell(unit=" s", digits=1) for c in tools},
        {c: Cell(digits=0) for c in tools},
        Counter[str](),
        None,
    )
    for i in range(p.n_goodput):
        for col, tool in tools.items():
            if tool.unavailable():
                continue
            pg = None if col.startswith(("rvsup", "ft_")) else PG_TIMEOUT_S
            spec = Spec(g, every, mixed_faults(g), pg, max_restarts=10)
            runs.cap = 3 * g * GOODPUT_STEP_S + 240
            o = run_trial(tool, spec, ctx.scratch / name / slug(col) / str(i), runs.cap)
            runs.wall[col].add(o.wall_s)
            runs.good[col].add(records.useful_step_seconds(o.records) / o.wall_s)
            runs.redone[col].add(float(records.steps_computed_twice(o.records, 0)))
            runs.finished[col] += int(o.completed())
            ctx.log(
                f"{name} {i + 1}/{p.n_goodput} {col}: wall={o.wall_s:.1f} s "
                f"goodput={runs.good[col].values[-1]:.3f} "
                f"redone={runs.redone[col].values[-1]:.0f}"
            )
    return runs


def goodput(ctx: Context) -> Table:
    p = ctx.profile
    g = p.goodput_steps
    schedule = mixed_faults(g)
    tools: dict[str, Tool] = {
        "rvsup (auto)": Rvsup(),
        f"torchrun (workaround, pg {PG_TIMEOUT_S:g} s)": Torchrun(share_store=False),
        f"bash loop (pg {PG_TIMEOUT_S:g} s)": BashLoop(),
        f"ft_launcher (hb {CONFIGURED_HANG_S:g} s)": FtLauncher(
            venv=ctx.nvrx_venv, heartbeat_timeout_s=CONFIGURED_HANG_S
        ),
    }
    if p.smoke:
        tools = dict(list(tools.items())[:2])
    runs = goodput_runs(ctx, tools, max(10, g // 20), "goodput")
    good, wall, finished, cap = runs.good, runs.wall, runs.finished, runs.cap
    t = Table(
        "goodput",
        f"5. Goodput (useful-step time / wall time): {g} steps with faults {schedule}",
        list(tools),
    )
    t.row("goodput", mark_unavailable(tools, dict(good)))
    t.row("wall time", mark_unavailable(tools, dict(wall)))
    t.row(
        "finished all steps",
        mark_unavailable(tools, {c: f"{finished[c]}/{p.n_goodput}" for c in tools}),
    )
    first_peer = next(iter(list(tools)[1:]), None)
    if first_peer is not None:
        t.add_ratio(f"goodput rvsup / {first_peer}", good["rvsup (auto)"], good[first_peer])
    if cap is not None:
        t.notes.append(f"a run that does not finish is stopped at {cap:.0f} s")
    return t


# ---------------------------------------------------------------- 6. cold start
def cold(ctx: Context) -> Table:
    p = ctx.profile
    tools: dict[str, Tool] = {
        "rvsup": Rvsup(),
        "rvsup (cold ranks)": Rvsup(zygote=False),
        "torchrun": Torchrun(share_store=False),
        "ft_launcher": FtLauncher(venv=ctx.nvrx_venv),
    }
    if p.smoke:
        tools.pop("ft_launcher")
    first = {c: Cell(unit=" s") for c in tools}
    steps = {c: Cell(unit=" ms") for c in tools}
    for i in range(p.n):
        for col, tool in tools.items():
            if tool.unavailable():
                continue
            o = run_trial(tool, Spec(80, 1000), ctx.scratch / "cold" / slug(col) / str(i), 90)
            first[col].add(o.cold_start_s())
            durations = records.step_durations(o.records)
            if durations:
                steps[col].add(1000 * sorted(durations)[len(durations) // 2])
            ctx.log(f"cold {i + 1}/{p.n} {col}: {fmt(o.cold_start_s(), ' s')}")
    t = Table("cold", "6. Cold start: launch -> first step on all ranks (no fault)", list(tools))
    t.row("launch -> first step on all ranks", mark_unavailable(tools, dict(first)))
    t.row("median step time (rank 0)", mark_unavailable(tools, dict(steps)))
    t.add_ratio("cold start rvsup / torchrun", first["rvsup"], first["torchrun"])
    t.add_ratio(
        "cold start rvsup / rvsup (cold ranks)", first["rvsup"], first["rvsup (cold ranks)"]
    )
    ours, before = first["rvsup"].median, first["rvsup (cold ranks)"].median
    if ours is not None and before is not None:
        t.targets.append(
            Target(
                "first start with the zygote no slower than with cold ranks",
                f"{ours:.2f} s vs {before:.2f} s",
                ours <= before,
            )
        )
    return t
