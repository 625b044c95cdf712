"""Figure 9: the supervisor's own footprint, and a real daemon driven by simulated ranks at scale.

9a samples (every 0.25 s, while every rank trains) the RSS and CPU of the rvsup daemon, of the
torchrun agent it starts, of a plain torchrun agent and of ft_launcher's agent process.
9b starts a real ``rvsup start`` whose only "rank" is :mod:`benchmarks.fake_ranks` (N simulated ranks,
each its own DEALER connection, 1 heartbeat/s; or behind simulated node agents of 8 ranks, one
beat/s each, as on several nodes), measures the daemon's CPU and RSS over a window, then silences
one rank and reads how long the daemon took to call it a hang (configured timeout).
"""

from __future__ import annotations

import contextlib
import json
import shutil
import time
from dataclasses import dataclass, field

import psutil

from supervisor.rules.stragglers import MIN_SAMPLES

from . import records
from .profiles import Context
from .table import Cell, Table, Target
from .tools import REPO, WORLD, FtLauncher, Run, Rvsup, Spec, Tool, Torchrun

SAMPLE_S = 0.25
SCALE_HANG_S = 5.0
AGENT_RANKS = 8  # ranks per simulated node agent (a node of 8 GPUs)
MB = 1 << 20


@dataclass
class Usage:
    """RSS peak and CPU share of one process over a sampling window."""

    rss_mb: list[float] = field(default_factory=list)
    cpu_percent: float | None = None


def sample(procs: dict[str, psutil.Process], until: float) -> dict[str, Usage]:
    """Sample ``procs`` until the monotonic time ``until`` or until all have exited; CPU % of one
    core over the time each process was seen (its last reading, not the end of the window)."""
    usage = {k: Usage() for k in procs}
    t0 = time.monotonic()
    start: dict[str, float] = {}
    last: dict[str, tuple[float, float]] = {}  # CPU seconds, and when they were read
    for k, pr in procs.items():
        with contextlib.suppress(psutil.Error):
            c = pr.cpu_times()
            start[k] = c.user + c.system
    while time.monotonic() < until:
        seen = 0
        for k, pr in procs.items():
            with contextlib.suppress(psutil.Error):
                rss = pr.memory_info().rss / MB
                c = pr.cpu_times()
                last[k] = (c.user + c.system, time.monotonic())
                usage[k].rss_mb.append(rss)
                seen += 1
        if not seen:
            break
        time.sleep(SAMPLE_S)
    for k, (cpu_s, at) in last.items():
        if k in start and at > t0:
            usage[k].cpu_percent = 100.0 * (cpu_s - start[k]) / (at - t0)
    return usage


def _agent_of(
    run: Run,
    marks: tuple[str, ...] = ("torchrun", "ft_launcher"),
    unless: tuple[str, ...] = (),
) -> psutil.Process | None:
    """The first process of a launch (the root, or one below it) whose command line holds one
    of ``marks`` and none of ``unless``: by default the torchrun/ft_launcher agent."""
    with contextlib.suppress(psutil.Error):
        root = psutil.Process(run.proc.pid)
        for pr in [root, *root.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                line = " ".join(pr.cmdline())
                if any(m in line for m in marks) and not any(u in line for u in unless):
                    return pr
    return None


# rvsup's warm standby: started cold (-c ... worker_sdk.spawn.standby) or forked from the zygote (its
# command line then reads "python .../worker_sdk/spawn/standby.py"); the zygote itself
# (-m worker_sdk.spawn.zygote), not the clients that stand in for its ranks (worker_sdk.spawn.bootstrap)
_STANDBY_MARKS = ("worker_sdk.spawn.standby", "worker_sdk/spawn/standby.py")
_ZYGOTE_MARKS = ("worker_sdk.spawn.zygote",)
_NOT_ZYGOTE = ("worker_sdk.spawn.bootstrap", "standby.py")


def _measure_job(tool: Tool, ctx: Context, name: str) -> dict[str, Usage]:
    p = ctx.profile
    workdir = ctx.scratch / "footprint" / name
    shutil.rmtree(workdir, ignore_errors=True)
    with tool.launch(Spec(p.footprint_steps, 100), workdir) as run:
        if not run.wait_group_step(20, 90):
            return {}
        procs: dict[str, psutil.Process] = {}
        agent = _agent_of(run)
        if agent is not None:
            procs["agent"] = agent
        if isinstance(tool, Rvsup):
            procs["daemon"] = psutil.Process(run.proc.pid)
            standby = _agent_of(run, _STANDBY_MARKS, unless=("worker_sdk.spawn.bootstrap",))
            if standby is not None:
                procs["standby"] = standby
            zygote = _agent_of(run, _ZYGOTE_MARKS, unless=_NOT_ZYGOTE)
            if zygote is not None:
                procs["zygote"] = zygote
        steps_left = p.footprint_steps - 40
        window = max(1.0, steps_left * 0.01)  # ends before the job does (13-20 ms a step)
        return sample(procs, time.monotonic() + window)


def footprint(ctx: Context) -> Table:
    jobs: dict[str, Tool] = {"rvsup": Rvsup(), "torchrun": Torchrun(share_store=False)}
    ft = FtLauncher(venv=ctx.nvrx_venv)
    if not ctx.profile.smoke and not ft.unavailable():
        jobs["ft_launcher"] = ft
    cols = [
        "rvsup daemon",
        "torchrun agent (under rvsup)",
        "warm standby torchrun (rvsup)",
        "zygote (rvsup)",
        "torchrun agent (plain)",
        "ft_launcher agent",
    ]
    where = {
        cols[0]: ("rvsup", "daemon"),
        cols[1]: ("rvsup", "agent"),
        cols[2]: ("rvsup", "standby"),
        cols[3]: ("rvsup", "zygote"),
        cols[4]: ("torchrun", "agent"),
        cols[5]: ("ft_launcher", "agent"),
    }
    found: dict[str, list[Usage]] = {col: [] for col in cols}
    for i in range(ctx.profile.n_windows):  # the jobs interleaved, one window each per round
        measured = {name: _measure_job(tool, ctx, name) for name, tool in jobs.items()}
        ctx.log(f"footprint {i + 1}/{ctx.profile.n_windows}")
        for col, (job, role) in where.items():
            usage = measured.get(job, {}).get(role)
            if usage is not None:
                found[col].append(usage)
    t = Table(
        "footprint",
        f"9a. Supervisor footprint while {WORLD} ranks train (sampled every {SAMPLE_S:g} s)",
        cols,
    )
    rss: dict[str, Cell | str] = {}
    cpu: dict[str, Cell | str] = {}
    for col, usages in found.items():
        if not usages:
            why = (ft.unavailable() if col == cols[5] else None) or "n/a"
            rss[col] = cpu[col] = why
            continue
        rss[col] = Cell(_peaks(usages), " MB", digits=1, note="peak of each window")
        cpu[col] = Cell(_cpu(usages), " %", digits=2)
    t.row("RSS", rss)
    t.row("CPU (% of one core)", cpu)
    t.notes.append(
        "the zygote's RSS counts the pages it shares with the ranks it forked (torch's code and"
        " imported modules): what it adds is less"
    )
    daemon = rss[cols[0]]
    if isinstance(daemon, Cell) and daemon.values:
        worst = max(daemon.values)
        t.targets.append(Target("daemon RSS <= 60 MB", f"max {worst:.1f} MB", worst <= 60.0))
    return t


def _peaks(usages: list[Usage]) -> list[float]:
    return [max(u.rss_mb) for u in usages if u.rss_mb]


def _cpu(usages: list[Usage]) -> list[float]:
    return [u.cpu_percent for u in usages if u.cpu_percent is not None]


class _ScaleRvsup(Rvsup):
    """rvsup whose single rank is the simulator. The simulator's process stays busy sending the
    other ranks' heartbeats while one of them is silent: rvsup would take that for a rank busy in
    a long step and wait up to hang_timeout_max (30 min by default) before calling it a hang, so
    hang_timeout_max is the hang timeout here."""

    def __init__(self) -> None:
        super().__init__(
            name="rvsup",
            hang_timeout=f"{SCALE_HANG_S:g}s",
            hang_timeout_max=f"{SCALE_HANG_S:g}s",
            script=REPO / "benchmarks" / "fake_ranks.py",
            nproc=1,
        )


def _scale_once(
    ctx: Context, n: int, per_agent: int, training: bool
) -> tuple[Usage, float | None, str]:
    workdir = ctx.scratch / "scale" / f"{n}-{per_agent}{'-training' if training else ''}"
    shutil.rmtree(workdir, ignore_errors=True)
    tool = _ScaleRvsup()
    spec = Spec(steps=1, ckpt_every=0, max_restarts=0)
    env = {"FAKE_RANKS": str(n), "FAKE_PER_AGENT": str(per_agent)}
    if training:
        env["FAKE_TRAINING"] = "1"
    with tool.launch(spec, workdir, env) as run:
        ready = run.record_dir / "ready.json"
        deadline = time.monotonic() + 120
        while not ready.exists() and time.monotonic() < deadline and run.proc.poll() is None:
            time.sleep(0.05)
        if not ready.exists():
            return Usage(), None, "the simulator never became ready"
        time.sleep(2.0 + n / 8192)  # HELLOs and the first round of heartbeats absorbed
        if training and not ctx.profile.smoke:  # the straggler rule judges a rank once it has
            time.sleep(MIN_SAMPLES + 2.0)  # MIN_SAMPLES waits (the smoke only runs the column)
        daemon = psutil.Process(run.proc.pid)
        usage = sample({"daemon": daemon}, time.monotonic() + ctx.profile.scale_window_s)["daemon"]
        (run.record_dir / "go-silent").write_text("")
        rc = run.wait(SCALE_HANG_S + 60)
    silent_path = run.record_dir / "silent.json"
    noticed = tool.noticed(workdir)
    if not silent_path.exists() or not noticed:
        return usage, None, f"no hang detected (daemon exit {rc})"
    silent_t = float(json.loads(silent_path.read_text())["last_heartbeat_t"])
    seen = records.first_at_or_after(noticed, silent_t)
    return usage, None if seen is None else seen - silent_t, ""


def scale(ctx: Context) -> Table:
    p = ctx.profile
    runs = [(n, 0, f"{n} ranks", False) for n in p.scale_ranks]
    runs += [
        (n, AGENT_RANKS, f"{n} ranks, {n // AGENT_RANKS} agents", False) for n in p.scale_agents
    ]
    runs += [
        (n, AGENT_RANKS, f"{n} ranks, {n // AGENT_RANKS} agents, losses + waits", True)
        for n in p.scale_training
    ]
    cpu: dict[str, Cell | str] = {}
    rss: dict[str, Cell | str] = {}
    per_rank: dict[str, Cell | str] = {}
    latency: dict[str, Cell | str] = {}
    smallest = min(p.scale_ranks)
    base: list[float] = []  # the smallest run's RSS: the daemon with (almost) no ranks
    for n, per_agent, col, training in runs:
        usages: list[Usage] = []
        detects: list[float] = []
        problems: list[str] = []
        for i in range(p.n_windows):
            ctx.log(f"scale {col} {i + 1}/{p.n_windows}")
            usage, detect, problem = _scale_once(ctx, n, per_agent, training)
            usages.append(usage)
            if detect is not None:
                detects.append(detect)
            if problem:
                problems.append(problem)
        note = "; ".join(sorted(set(problems)))
        cpu[col] = Cell(_cpu(usages), " %", note=note)
        rss[col] = Cell(_peaks(usages), " MB", digits=1, note="peak of each window")
        latency[col] = Cell(detects, " s", note=note)
        if not base:
            base = _peaks(usages)
        elif n > smallest:
            grown = [(peak - min(base)) * 1024 / (n - smallest) for peak in _peaks(usages)]
            per_rank[col] = Cell(grown, " KB", digits=1, note=f"over the {smallest}-rank run")
    t = Table(
        "scale",
        f"9b. A real rvsup daemon with simulated ranks (1 heartbeat/s each: one connection per"
        f" rank, or behind node agents of {AGENT_RANKS} ranks, one beat/s each, as on several"
        f" nodes, and there with each heartbeat's loss and all-reduce wait, which the loss"
        f" and straggler rules read; CPU over {p.scale_window_s:g} s;"
        f" hang_timeout = {SCALE_HANG_S:g} s)",
        [col for _, _, col, _ in runs],
    )
    t.row("daemon CPU (% of one core)", cpu)
    t.row("daemon RSS", rss)
    t.row("daemon RSS per rank", per_rank)
    t.row("one rank goes silent -> hang detected", latency)
    biggest_of = [(runs[len(p.scale_ranks) - 1][2], f"{max(p.scale_ranks)} simulated ranks")]
    for sizes, kind in ((p.scale_agents, ""), (p.scale_training, ", losses and waits")):
        if sizes:
            col = next(c for n, _, c, t in runs if n == max(sizes) and t == bool(kind))
            biggest_of.append((col, f"{max(sizes)} simulated ranks behind agents{kind}"))
    for col, what in biggest_of:
        biggest = cpu.get(col)
        if isinstance(biggest, Cell) and biggest.median is not None:
            t.targets.append(
                Target(
                    f"{what} <= 20% of a core", f"{biggest.median:.1f} %", biggest.median <= 20.0
                )
            )
    lat = [c.median for c in latency.values() if isinstance(c, Cell) and c.median is not None]
    if lat:
        t.targets.append(
            Target(
                "hang detected <= timeout + 1 s (simulated ranks)",
                f"max {max(lat):.2f} s vs {SCALE_HANG_S:g} + 1 s",
                max(lat) <= SCALE_HANG_S + 1,
            )
        )
    t.notes.append("the simulator runs on the same cores as the daemon")
    if p.scale_training and not p.smoke:
        t.notes.append(
            f"losses + waits: CPU measured from {MIN_SAMPLES + 2:g} s after the first"
            " heartbeats on, once the straggler rule judges every rank"
        )
    return t
