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

from .fig_lifecycle import GOODPUT_STEP_S, goodput_runs, mark_unavailable, mixed_faults
from .profiles import CONFIGURED_HANG_S, PG_TIMEOUT_S, Context
from .table import Table
from .tools import FtLauncher, Rvsup, Tool, Torchrun

MEMORY = 'rvsup (memory tier "auto")'
EVERY = 5
MEMORY_FIXED = f"rvsup (memory tier, every {EVERY})"
STORAGE = "rvsup (storage only)"


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
    schedule = mixed_faults(g)
    tools = goodput_tools(ctx)
    runs = goodput_runs(ctx, tools, every, "memory_goodput")
    good, wall, redone, finished = runs.good, runs.wall, runs.redone, runs.finished
    cap = 3 * g * GOODPUT_STEP_S + 240
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
