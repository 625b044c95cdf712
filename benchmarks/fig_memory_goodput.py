"""Figure 13: goodput of figure 5's mixed faults with a storage interval as users set it.

Figure 5 saves every ``steps / 20`` steps, so every tool loses little to a crash. Users save
large models far less often (``every_steps = 500`` or every 30 minutes: a save stalls for seconds
to minutes), and then every failure throws away, on average, half an interval. Here the
storage interval is a third of the run (500 steps of the quick profile's 1,500), the faults are
figure 5's (two kills, a SIGSTOP, a rank stuck in a receive), and rvsup runs with the memory
tier (``memory_every_steps = "auto"``, and every 5 steps) beside rvsup storage-only, torchrun
and ft_launcher, all on the same workload in one run.
"""

from __future__ import annotations

from collections import Counter

from . import records
from .fig_faults import slug
from .fig_lifecycle import mark_unavailable
from .profiles import CONFIGURED_HANG_S, PG_TIMEOUT_S, Context
from .table import Cell, Table
from .tools import FtLauncher, Rvsup, Spec, Tool, Torchrun
from .trials import run_trial

MEMORY = 'rvsup (memory tier "auto")'
EVERY = 5
MEMORY_FIXED = f"rvsup (memory tier, every {EVERY})"
STORAGE = "rvsup (storage only)"
STEP_S = 0.03  # the workload's pace, for the cap


def goodput_tools(ctx: Context) -> dict[str, Tool]:
    """The columns (smoke: the rvsup ones)."""
    tools: dict[str, Tool] = {
        MEMORY: Rvsup(memory_every_steps="auto"),
        MEMORY_FIXED: Rvsup(memory_every_steps=EVERY),
        STORAGE: Rvsup(),
        f"torchrun (workaround, pg {PG_TIMEOUT_S:g} s)": Torchrun(share_store=False),
        f"ft_launcher (hb {CONFIGURED_HANG_S:g} s)": FtLauncher(
            venv=ctx.nvrx_venv, heartbeat_timeout_s=CONFIGURED_HANG_S
        ),
    }
    if ctx.profile.smoke:
        return {k: tools[k] for k in (MEMORY, MEMORY_FIXED, STORAGE)}
    return tools


def memory_goodput(ctx: Context) -> Table:
    p = ctx.profile
    g = p.goodput_steps
    every = max(10, g // 3)
    schedule = (
        f"kill:1:{g * 15 // 100},sigstop:0:{g * 40 // 100},kill:0:{g * 65 // 100},"
        f"stuck:1:{g * 85 // 100}"
    )
    tools = goodput_tools(ctx)
    good = {c: Cell(digits=3) for c in tools}
    wall = {c: Cell(unit=" s", digits=1) for c in tools}
    redone = {c: Cell(digits=0) for c in tools}
    finished = Counter[str]()
    cap = 3 * g * STEP_S + 240
    for i in range(p.n_goodput):
        for col, tool in tools.items():
            if tool.unavailable():
                continue
            pg = None if col.startswith(("rvsup", "ft_")) else PG_TIMEOUT_S
            spec = Spec(g, every, schedule, pg, max_restarts=10)
            o = run_trial(tool, spec, ctx.scratch / "memory_goodput" / slug(col) / str(i), cap)
            wall[col].add(o.wall_s)
            good[col].add(records.useful_step_seconds(o.records) / o.wall_s)
            redone[col].add(float(records.steps_computed_twice(o.records, 0)))
            finished[col] += int(o.completed())
            ctx.log(
                f"memory goodput {i + 1}/{p.n_goodput} {col}: wall={o.wall_s:.1f} s "
                f"goodput={good[col].values[-1]:.3f} redone={redone[col].values[-1]:.0f}"
            )
    t = Table(
        "memory_goodput",
        f"13. Goodput with a storage checkpoint every {every} steps: {g} steps with faults "
        f"{schedule}",
        list(tools),
    )
    t.row("goodput", mark_unavailable(tools, dict(good)))
    t.row("steps redone (rank 0, all 4 faults)", mark_unavailable(tools, dict(redone)))
    t.row("wall time", mark_unavailable(tools, dict(wall)))
    t.row(
        "finished all steps",
        mark_unavailable(tools, {c: f"{finished[c]}/{p.n_goodput}" for c in tools}),
    )
    for mem in (MEMORY, MEMORY_FIXED):
        for col in (c for c in tools if c not in (MEMORY, MEMORY_FIXED)):
            t.add_ratio(f"goodput {mem} / {col}", good[mem], good[col])
    t.notes.append(f"a run that does not finish is stopped at {cap:.0f} s")
    t.notes.append(
        "every column saves to storage at the same steps; only rvsup's memory tier also "
        "snapshots into host memory between them"
    )
    return t
