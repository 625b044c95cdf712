"""Figure 10: busy is not hung. Healthy jobs with long work between two steps, and true hangs.

Every trial is rvsup (``hang_timeout = "auto"``: 5 s on this workload; ``hang_timeout_idle`` 30 s,
so that a hang with no CPU ends within a minute) on the benchmark workload with one piece of
slow work, none inside ``worker_sdk.phase()``: rank 0 evaluating alone, a checkpoint of the
user's own (16 MB fsynced writes), an epoch boundary where every rank reshuffles then meets in a
barrier, a blocking ``time.sleep`` in a logging hook on one rank, rank 0 waiting 12 s on a thread
of its own (its future; a ``queue.Queue`` it feeds), rank 0 flushing a file to slow storage for
10 s (state D: a FUSE file system whose server takes that long per write, where one can be
mounted); and true hangs: rank 1 SIGSTOPped, stuck in a gloo receive, deadlocked on a lock,
asleep forever outside any collective, waiting on a data-loader worker that never answers. Per
case: the hangs rvsup declared (healthy: target 0), the true hangs declared in time (the
timeout + 1 s; ``hang_timeout_idle`` + 1 s for a hang with no CPU outside collectives: target
all), the ``slow_phase`` events and the jobs that completed. Beside them (not in smoke), one
trial per case of torchrun (``init_process_group`` timeout 20 s) and of ft_launcher (rank
heartbeat timeout 10 s), which judge by a timeout alone: what each made of the same shape.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from tests.helpers import slow_storage

from .fig_faults import slug
from .fig_live import Compared, final_states
from .profiles import CONFIGURED_HANG_S, PG_TIMEOUT_S, Context
from .table import Cell, Table, Target
from .tools import FtLauncher, Rvsup, Spec, Tool, Torchrun
from .trials import Outcome, run_trial, success_text

FAULT_STEP = 60
STEPS = 100
IDLE_S = 30.0  # this figure's hang_timeout_idle (shipped: 2 min)


@dataclass(frozen=True)
class Case:
    """One kind of trial: a label, the workload's fault spec, how long its slow work lasts."""

    label: str
    fault: str
    slow_s: float = 0.0
    hang: bool = False  # a true hang: to be declared in time
    idle: bool = False  # ... with no CPU outside collectives: in time is hang_timeout_idle + 1 s
    storage: bool = False  # on slow storage (BENCH_SLOW_DIR)

    @property
    def cap_s(self) -> float:
        return 120.0 + self.slow_s


def cases(profile: str) -> list[Case]:
    """The campaign of a mode: smoke is one short healthy case and one hang."""
    f = FAULT_STEP
    evals = {"smoke": (8,), "quick": (8, 30), "full": (8, 30, 120)}[profile]
    healthy = [Case(f"rank 0 evaluates alone {s} s", f"eval:0:{f}", s) for s in evals]
    if profile != "smoke":
        healthy += [
            Case("rank 0 writes its own checkpoint 10 s", f"ckptwrite:0:{f}", 10),
            Case("epoch boundary: every rank 10 s / 5 s, then a barrier", epoch(f), 10),
            Case("time.sleep 10 s in a logging hook, rank 1", f"hooksleep:1:{f}", 10),
            Case("rank 0 waits 12 s on a thread's future", f"threadwait:0:{f}", 12),
            Case("rank 0 waits 12 s on a queue.Queue fed by a thread", f"queuewait:0:{f}", 12),
            Case(
                "rank 0 flushes a file to slow storage 10 s (D)",
                f"storagewrite:0:{f}",
                10,
                storage=True,
            ),
        ]
    hangs = [Case("true hang: rank 1 stuck in a gloo receive", f"stuck:1:{f}", hang=True)]
    if profile != "smoke":
        hangs += [
            Case("true hang: rank 1 SIGSTOPped", f"sigstop:1:{f}", hang=True),
            Case("true hang: rank 1 deadlocked on a lock", f"deadlock:1:{f}", hang=True),
            Case("true hang: rank 1 asleep forever", f"asleep:1:{f}", hang=True, idle=True),
            Case(
                "true hang: rank 1's data-loader worker never answers",
                f"loaderdeadlock:1:{f}",
                hang=True,
                idle=True,
            ),
        ]
    return healthy + hangs


def epoch(step: int) -> str:
    return f"epoch:0:{step},epoch:1:{step}"


@dataclass(frozen=True)
class Verdicts:
    """What rvsup's history says about one trial."""

    hangs: int  # failure_detected of kind hang
    in_time: int  # ... whose detection was within the timeout + 1 s
    slow_phases: int
    detect_s: tuple[float, ...]


def verdicts(lines: list[str], bound_s: float | None = None) -> Verdicts:
    """Count the hangs (and those declared within their timeout + 1 s, or ``bound_s`` + 1 s where
    given) and slow phases in the lines of an events.jsonl."""
    hangs = in_time = slow = 0
    detect: list[float] = []
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if not isinstance(d, dict):
            continue
        if d.get("event") == "slow_phase":
            slow += 1
        elif d.get("event") == "failure_detected" and d.get("kind") == "hang":
            hangs += 1
            seconds = d.get("detect_s")
            timeout = d.get("hang_timeout_s") if bound_s is None else bound_s
            if isinstance(seconds, int | float):
                detect.append(float(seconds))
                if isinstance(timeout, int | float) and seconds <= timeout + 1.0:
                    in_time += 1
    return Verdicts(hangs, in_time, slow, tuple(detect))


def peers(ctx: Context) -> dict[str, Tool]:
    """The launchers that judge by a timeout alone (none in smoke)."""
    if ctx.profile.smoke:
        return {}
    return {
        f"torchrun (pg {PG_TIMEOUT_S:g} s)": Torchrun(share_store=False),
        f"ft_launcher (hb {CONFIGURED_HANG_S:g} s)": FtLauncher(
            venv=ctx.nvrx_venv, heartbeat_timeout_s=CONFIGURED_HANG_S
        ),
    }


def slow(ctx: Context) -> Table:
    p = ctx.profile
    n = {"smoke": 1, "quick": 1, "full": 3}[p.name]
    tool = Rvsup(hang_timeout="auto", hang_timeout_idle=f"{IDLE_S:g}s")
    others = peers(ctx)
    columns = ["trials", "hangs declared", "in time", "slow_phase", "completed", "final state"]
    t = Table(
        "slow",
        f"10. Busy is not hung: slow work at step {FAULT_STEP} of {STEPS} without phase(), and "
        f"true hangs (rvsup, automatic timeout, hang_timeout_idle {IDLE_S:g} s; in time: "
        "timeout + 1 s, hang_timeout_idle + 1 s for a hang with no CPU outside collectives)",
        [*columns, "detected after", *others],
    )
    false_hangs = healthy_trials = true_in_time = true_trials = 0
    reference = None if p.smoke else _reference(ctx, tool)
    exact = Compared()
    for case in cases(p.name):
        row: dict[str, Cell | str] = {}
        compared = Compared()
        try:
            found, completed = _rvsup_trials(ctx, tool, case, n, reference, compared)
        except slow_storage.UnavailableError as e:
            t.row(case.label, {"trials": "0", "hangs declared": f"n/a ({e})"})
            continue
        hangs = sum(v.hangs for v in found)
        in_time = sum(v.in_time for v in found)
        detect = Cell(unit=" s")
        for v in found:
            for seconds in v.detect_s:
                detect.add(seconds)
        row.update(
            {
                "trials": str(n),
                "hangs declared": str(hangs),
                "in time": f"{in_time}/{hangs}" if case.hang else "-",
                "slow_phase": str(sum(v.slow_phases for v in found)),
                "completed": success_text(completed, n),
                "final state": compared.render(),
                "detected after": detect if detect.values else "-",
            }
        )
        for col, peer in others.items():
            row[col] = peer.unavailable() or _peer_trial(ctx, col, peer, case)
        t.row(case.label, row)
        if case.hang:
            true_trials += n
            true_in_time += sum(min(1, v.in_time) for v in found)
        else:
            healthy_trials += n
            false_hangs += hangs
            exact.identical += compared.identical
            exact.compared += compared.compared
    t.targets.append(
        Target(
            "healthy jobs with long work: 0 hangs declared",
            f"{false_hangs} in {healthy_trials} trials",
            false_hangs == 0,
        )
    )
    if reference is not None:
        t.targets.append(
            Target(
                "healthy jobs end bit-identical to an uninterrupted run: 100%",
                success_text(exact.identical, healthy_trials),
                exact.identical == healthy_trials,
            )
        )
    t.targets.append(
        Target(
            "true hangs declared in time: 100%",
            success_text(true_in_time, true_trials),
            true_trials > 0 and true_in_time == true_trials,
        )
    )
    return t


def _reference(ctx: Context, tool: Rvsup) -> list[bytes] | None:
    """The final parameters of the workload run without slow work (the uninterrupted run)."""
    workdir = ctx.scratch / "slow" / "reference"
    o = _trial(tool, Case("uninterrupted", ""), workdir, None)
    ctx.log(f"slow reference: rc={o.rc}")
    return final_states(workdir / "records")


def _rvsup_trials(
    ctx: Context,
    tool: Rvsup,
    case: Case,
    n: int,
    reference: list[bytes] | None,
    compared: Compared,
) -> tuple[list[Verdicts], int]:
    """``n`` trials of rvsup: their verdicts, and how many completed; each one's final
    parameters compared with ``reference`` into ``compared``."""
    found: list[Verdicts] = []
    completed = 0
    for i in range(n):
        workdir = ctx.scratch / "slow" / slug(case.label) / str(i)
        o = _trial(tool, case, workdir, None)
        v = verdicts(_lines(workdir / "run" / "events.jsonl"), IDLE_S if case.idle else None)
        found.append(v)
        compared.add(final_states(workdir / "records"), reference)
        completed += int(o.rc == 0 and o.completed())
        ctx.log(f"slow {case.label} {i + 1}/{n}: rc={o.rc} {v}")
    return found, completed


def _peer_trial(ctx: Context, col: str, peer: Tool, case: Case) -> str:
    """One trial of a peer: whether (and when) it declared the shape hung, and the end."""
    workdir = ctx.scratch / "slow" / slug(case.label) / slug(col)
    try:
        o = _trial(peer, case, workdir, PG_TIMEOUT_S if isinstance(peer, Torchrun) else None)
    except slow_storage.UnavailableError as e:
        return f"n/a ({e})"
    seen, fault = o.detect_s(), o.fault_t
    if seen is not None:
        said = f"{'detected' if case.hang else 'killed as hung'} after {seen:.1f} s"
    elif case.hang and fault is not None:
        said = f"not detected in {o.end_t - fault:.0f} s"
    else:
        said = "no hang"
    end = "completed" if o.rc == 0 and o.completed() else f"not completed (rc={o.rc})"
    ctx.log(f"slow {case.label} {col}: {said}, {end}")
    return f"{said}; {end}"


def _trial(tool: Tool, case: Case, workdir: Path, pg_timeout_s: float | None) -> Outcome:
    """One trial of ``case`` (on slow storage where it needs it)."""
    spec = Spec(STEPS, 25, case.fault, pg_timeout_s, max_restarts=2)
    env = {"BENCH_SLOW_S": str(case.slow_s), "BENCH_FINAL": "1"}
    if not case.storage:
        return run_trial(tool, spec, workdir, case.cap_s, env=env)
    mountpoint = workdir.with_name(workdir.name + "-storage")
    with slow_storage.mounted(mountpoint, case.slow_s):
        return run_trial(
            tool, spec, workdir, case.cap_s, env={**env, "BENCH_SLOW_DIR": str(mountpoint)}
        )


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
