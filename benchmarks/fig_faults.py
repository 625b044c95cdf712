"""Figures 1-3: crash, hang and repeated OOM, every tool on the same workload and fault step."""

from __future__ import annotations

import json
import re
from collections import Counter
from pathlib import Path

from . import records
from .profiles import CONFIGURED_HANG_S, PG_TIMEOUT_S, Context, recovery_tools
from .table import Cell, Table, Target, fmt
from .tools import WORLD, BashLoop, FtLauncher, Rvsup, Spec, Tool, Torchrun
from .trials import Outcome, run_trial, success_text

CRASH_CAP_S = 90.0
HANG_CAP_S = 150.0
OOM_CAP_S = 180.0


def slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def steps_redone(o: Outcome) -> int | None:
    f = o.fault_t
    if f is None:
        return None
    before = records.group_step_before(o.records, f, WORLD)
    return records.lost_steps(before, records.resume_step(o.records, f))


def rvsup_hang_timeouts(workdir: Path) -> list[float]:
    """``hang_timeout_s`` of rvsup's failure_detected events in a trial."""
    out = []
    path = workdir / "run" / "events.jsonl"
    lines = path.read_text().splitlines() if path.exists() else []
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if d.get("event") == "failure_detected" and d.get("hang_timeout_s") is not None:
            out.append(float(d["hang_timeout_s"]))
    return out


def _unavailable_row(tools: dict[str, Tool], cells: dict[str, Cell | str]) -> dict[str, Cell | str]:
    for col, tool in tools.items():
        reason = tool.unavailable()
        if reason:
            cells[col] = reason
    return cells


# ---------------------------------------------------------------- 1. crash
def crash(ctx: Context) -> Table:
    p = ctx.profile
    tools = recovery_tools(ctx)
    spec = Spec(steps=p.steps, ckpt_every=p.ckpt_every, fault=f"kill:1:{p.fault_step}")
    detect = {c: Cell(unit=" s") for c in tools}
    mttr = {c: Cell(unit=" s") for c in tools}
    redone = {c: Cell(digits=0) for c in tools}
    ok = Counter[str]()
    runs = Counter[str]()
    for i in range(p.n_crash):
        for col, tool in tools.items():
            if tool.unavailable():
                continue
            o = run_trial(tool, spec, ctx.scratch / "crash" / slug(col) / str(i), CRASH_CAP_S)
            detect[col].add(o.detect_s())
            mttr[col].add(o.mttr_s())
            lost = steps_redone(o)
            redone[col].add(None if lost is None else float(lost))
            runs[col] += 1
            ok[col] += int(o.rc == 0 and o.completed())
            ctx.log(f"crash {i + 1}/{p.n_crash} {col}: rc={o.rc} mttr={fmt(o.mttr_s(), ' s')}")
    for col in tools:
        if runs[col] and ok[col] < runs[col]:
            mttr[
                col
            ].note = f"{runs[col] - ok[col]} trial(s) did not finish within {CRASH_CAP_S:g} s"
    t = Table(
        "crash",
        f"1. Crash: kill -9 of rank 1 at step {p.fault_step} ({p.steps} steps, checkpoint every "
        f"{p.ckpt_every}; rvsup's shipped [restart] defaults: the first restart at once)",
        list(tools),
    )
    t.row("detection latency (kill -> noticed)", _unavailable_row(tools, dict(detect)))
    t.row("MTTR (kill -> resumed step on all ranks)", _unavailable_row(tools, dict(mttr)))
    t.row("steps redone", _unavailable_row(tools, dict(redone)))
    t.row(
        "restart success", _unavailable_row(tools, {c: success_text(ok[c], runs[c]) for c in tools})
    )
    ours = mttr["rvsup (auto)"]
    for peer in ("rvsup (cold ranks)", "torchrun (workaround)", "torchrun", "bash loop"):
        if peer in tools and mttr[peer].values:
            t.add_ratio(f"MTTR rvsup / {peer}", ours, mttr[peer])
    if "ft_launcher" in tools and mttr["ft_launcher"].values:
        t.add_ratio("MTTR rvsup / ft_launcher", ours, mttr["ft_launcher"])
    base = mttr.get("torchrun (workaround)")
    if ours.median is not None and base is not None and base.median is not None:
        t.targets.append(
            Target(
                "crash MTTR <= 0.25x torchrun's (workaround on)",
                f"{ours.median:.2f} s vs {base.median:.2f} s ({ours.median / base.median:.2f}x)",
                ours.median <= 0.25 * base.median,
            )
        )
    rv = [c for c in tools if c.startswith("rvsup")]
    rv_ok, rv_runs = sum(ok[c] for c in rv), sum(runs[c] for c in rv)
    t.targets.append(
        Target(
            "restart success 100%", success_text(rv_ok, rv_runs), rv_runs > 0 and rv_ok == rv_runs
        )
    )
    return t


# ---------------------------------------------------------------- 2. hang
# py-spy (installed by the test extra) reads every hung rank's native stacks before the
# teardown; this column is rvsup with heartbeat.native_stacks = false, as without py-spy
NO_NATIVE = "rvsup (auto, no native stacks)"


def hang_tools(ctx: Context) -> dict[str, Tool]:
    pg = f"pg {PG_TIMEOUT_S:g} s"
    tools: dict[str, Tool] = {
        "rvsup (auto)": Rvsup(hang_timeout="auto"),
        NO_NATIVE: Rvsup(hang_timeout="auto", native_stacks=False),
        f"rvsup ({CONFIGURED_HANG_S:g} s)": Rvsup(hang_timeout=f"{CONFIGURED_HANG_S:g}s"),
        "torchrun (defaults)": Torchrun(name="torchrun", share_store=False),
        f"torchrun ({pg})": Torchrun(name="torchrun", share_store=False),
        f"bash loop ({pg})": BashLoop(),
        f"ft_launcher (hb {CONFIGURED_HANG_S:g} s)": FtLauncher(
            venv=ctx.nvrx_venv, heartbeat_timeout_s=CONFIGURED_HANG_S
        ),
    }
    if ctx.profile.smoke:
        return {k: v for k, v in tools.items() if k in ("rvsup (auto)", f"torchrun ({pg})")}
    return tools


def hang(ctx: Context) -> Table:
    p = ctx.profile
    tools = hang_tools(ctx)
    kinds = {"SIGSTOP": "sigstop", "stuck in gloo": "stuck"}
    t = Table(
        "hang",
        f"2. Hang at step {p.fault_step}: SIGSTOP of rank 0, or rank 1 stuck in a gloo receive "
        f"(peers: gloo default timeout, or init_process_group(timeout={PG_TIMEOUT_S:g} s))",
        list(tools),
    )
    auto_timeouts = Cell(unit=" s")
    for label, kind in kinds.items():
        rank = 0 if kind == "sigstop" else 1
        detect = {c: Cell(unit=" s") for c in tools}
        mttr = {c: Cell(unit=" s") for c in tools}
        recover = {c: Cell(unit=" s") for c in tools}  # MTTR minus detection, per trial
        ok, runs = Counter[str](), Counter[str]()
        waited: dict[str, float] = {}  # the shortest wait after the fault of a capped trial
        for i in range(p.n):
            for col, tool in tools.items():
                capped = col.endswith("(defaults)")
                slow = not col.startswith(("rvsup", "ft_"))
                limit = p.n_capped if capped else p.n_slow if slow else p.n
                if tool.unavailable() or i >= limit:
                    continue
                pg = None if capped or col.startswith(("rvsup", "ft_")) else PG_TIMEOUT_S
                spec = Spec(p.steps, p.ckpt_every, f"{kind}:{rank}:{p.fault_step}", pg)
                workdir = ctx.scratch / "hang" / kind / slug(col) / str(i)
                o = run_trial(tool, spec, workdir, p.hang_cap_s if capped else HANG_CAP_S)
                detect[col].add(o.detect_s())
                mttr[col].add(o.mttr_s())
                took, seen = o.mttr_s(), o.detect_s()
                recover[col].add(None if took is None or seen is None else took - seen)
                if o.fault_t is not None and o.detect_s() is None:
                    waited[col] = min(waited.get(col, 1e9), o.end_t - o.fault_t)
                runs[col] += 1
                ok[col] += int(o.rc == 0 and o.completed())
                if col == "rvsup (auto)":
                    for value in rvsup_hang_timeouts(workdir):
                        auto_timeouts.add(value)
                ctx.log(
                    f"hang {label} {i + 1}/{p.n} {col}: rc={o.rc} "
                    f"detect={fmt(o.detect_s(), ' s')} mttr={fmt(o.mttr_s(), ' s')}"
                )
        for col in tools:
            if col in waited and not detect[col].values:
                detect[col].note = f"not detected within {waited[col]:.0f} s (n={runs[col]})"
            if col in waited and not mttr[col].values:
                mttr[col].note = f"not recovered within {waited[col]:.0f} s (n={runs[col]})"
        t.row(f"{label}: detection latency", _unavailable_row(tools, dict(detect)))
        t.row(f"{label}: MTTR", _unavailable_row(tools, dict(mttr)))
        t.row(f"{label}: recovery once detected", _unavailable_row(tools, dict(recover)))
        t.row(
            f"{label}: recovered and finished",
            _unavailable_row(tools, {c: success_text(ok[c], runs[c]) for c in tools}),
        )
        configured = f"rvsup ({CONFIGURED_HANG_S:g} s)"
        for col, budget in (
            ("rvsup (auto)", auto_timeouts.median),
            (configured, CONFIGURED_HANG_S),
        ):
            med = detect[col].median if col in detect else None
            if med is not None and budget is not None:
                t.targets.append(
                    Target(
                        f"{label}: {col} detected <= timeout + 1 s",
                        f"{med:.2f} s vs {budget:.2f} + 1 s",
                        med <= budget + 1,
                    )
                )
        torchrun = f"torchrun (pg {PG_TIMEOUT_S:g} s)"
        t.add_ratio(
            f"{label}: detection rvsup (auto) / {torchrun}",
            detect["rvsup (auto)"],
            detect.get(torchrun),
        )
        _recovery_targets(t, label, recover, torchrun)
    t.row("rvsup automatic timeout used", {"rvsup (auto)": auto_timeouts})
    if auto_timeouts.median is not None:
        t.targets.append(
            Target(
                "automatic hang timeout <= 10 s",
                f"{auto_timeouts.median:.2f} s",
                auto_timeouts.median <= 10.0,
            )
        )
    return t


def _recovery_targets(t: Table, label: str, recover: dict[str, Cell], torchrun: str) -> None:
    """The hang's recovery once detected, by rvsup with and without native stacks, against
    0.25x torchrun's."""
    theirs = recover[torchrun].median if torchrun in recover else None
    for col in ("rvsup (auto)", NO_NATIVE):
        mine = recover[col].median if col in recover else None
        if mine is not None and theirs:
            t.targets.append(
                Target(
                    f"{label}: {col} recovery once detected <= 0.25x {torchrun}'s",
                    f"{mine:.2f} s vs {theirs:.2f} s ({mine / theirs:.2f}x)",
                    mine <= 0.25 * theirs,
                )
            )


# ---------------------------------------------------------------- 3. OOM on every attempt
def oom(ctx: Context) -> Table:
    p = ctx.profile
    tools: dict[str, Tool] = {
        "rvsup (on_oom=fail)": Rvsup(on_oom="fail"),
        "rvsup (on_oom=restart)": Rvsup(on_oom="restart"),
        "torchrun (workaround)": Torchrun(share_store=False),
        "bash loop": BashLoop(),
        "ft_launcher": FtLauncher(venv=ctx.nvrx_venv, heartbeat_timeout_s=CONFIGURED_HANG_S),
    }
    if p.smoke:
        tools = {k: tools[k] for k in ("rvsup (on_oom=fail)", "torchrun (workaround)")}
    restarts = 3
    spec = Spec(p.steps, p.ckpt_every, "oom:0:5:every", max_restarts=restarts)
    wall = {c: Cell(unit=" s") for c in tools}
    attempts = {c: Cell(digits=0) for c in tools}
    codes: dict[str, Counter[str]] = {c: Counter() for c in tools}
    for i in range(p.n):
        for col, tool in tools.items():
            if tool.unavailable():
                continue
            o = run_trial(tool, spec, ctx.scratch / "oom" / slug(col) / str(i), OOM_CAP_S)
            if o.rc is not None:
                wall[col].add(o.wall_s)
            attempts[col].add(float(o.attempts()))
            codes[col]["capped" if o.rc is None else str(o.rc)] += 1
            ctx.log(f"oom {i + 1}/{p.n} {col}: rc={o.rc} wall={o.wall_s:.1f} s")
    t = Table(
        "oom",
        f"3. torch.OutOfMemoryError at step 5 of every attempt (max restarts {restarts} for all; "
        "rvsup max_no_progress=2 by default)",
        list(tools),
    )
    t.row("wall time until the tool gives up", _unavailable_row(tools, dict(wall)))
    t.row("attempts started", _unavailable_row(tools, dict(attempts)))
    t.row(
        "exit codes",
        _unavailable_row(
            tools, {c: ", ".join(f"{k} x{v}" for k, v in codes[c].items()) or "-" for c in tools}
        ),
    )
    for peer in ("torchrun (workaround)", "bash loop", "ft_launcher"):
        if peer in tools and wall[peer].values:
            t.add_ratio(
                f"give-up time rvsup (on_oom=fail) / {peer}",
                wall["rvsup (on_oom=fail)"],
                wall[peer],
            )
    fail = attempts["rvsup (on_oom=fail)"]
    if fail.values:
        t.targets.append(
            Target(
                'on_oom="fail" stops after the first attempt',
                f"attempts {sorted({int(v) for v in fail.values})}",
                all(v == 1 for v in fail.values),
            )
        )
    return t
