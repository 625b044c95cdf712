"""Figure 10: busy is not hung. Healthy jobs with long work between two steps, and true hangs.

Every trial is rvsup (``hang_timeout = "auto"``: 5 s on this workload) on the benchmark workload
with one piece of slow work, none inside ``worker_sdk.phase()``: rank 0 evaluating alone, a
checkpoint of the user's own (16 MB fsynced writes), an epoch boundary where every rank
reshuffles then meets in a barrier, a blocking ``time.sleep`` in a logging hook on one rank; and
true hangs: rank 1 SIGSTOPped, stuck in a gloo receive, deadlocked on a lock. Per case: the hangs
rvsup declared (healthy: target 0), the true hangs declared within the timeout + 1 s (target
all), the ``slow_phase`` events and the jobs that completed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from .fig_faults import slug
from .profiles import Context
from .table import Cell, Table, Target
from .tools import Rvsup, Spec
from .trials import run_trial, success_text

FAULT_STEP = 60
STEPS = 100


@dataclass(frozen=True)
class Case:
    """One kind of trial: a label, the workload's fault spec, how long its slow work lasts."""

    label: str
    fault: str
    slow_s: float = 0.0
    hang: bool = False  # a true hang: to be declared in time

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
        ]
    hangs = [Case("true hang: rank 1 stuck in a gloo receive", f"stuck:1:{f}", hang=True)]
    if profile != "smoke":
        hangs += [
            Case("true hang: rank 1 SIGSTOPped", f"sigstop:1:{f}", hang=True),
            Case("true hang: rank 1 deadlocked on a lock", f"deadlock:1:{f}", hang=True),
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


def verdicts(lines: list[str]) -> Verdicts:
    """Count the hangs (and those declared within their timeout + 1 s) and slow phases in the
    lines of an events.jsonl."""
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
            seconds, timeout = d.get("detect_s"), d.get("hang_timeout_s")
            if isinstance(seconds, int | float):
                detect.append(float(seconds))
                if isinstance(timeout, int | float) and seconds <= timeout + 1.0:
                    in_time += 1
    return Verdicts(hangs, in_time, slow, tuple(detect))


def slow(ctx: Context) -> Table:
    p = ctx.profile
    n = {"smoke": 1, "quick": 1, "full": 3}[p.name]
    tool = Rvsup(hang_timeout="auto")
    columns = ["trials", "hangs declared", "in time (<= timeout + 1 s)", "slow_phase", "completed"]
    t = Table(
        "slow",
        f"10. Busy is not hung: slow work at step {FAULT_STEP} of {STEPS} without phase(), and "
        "true hangs (rvsup, automatic timeout)",
        [*columns, "detected after"],
    )
    false_hangs = healthy_trials = true_in_time = true_trials = 0
    for case in cases(p.name):
        found: list[Verdicts] = []
        completed = 0
        for i in range(n):
            spec = Spec(steps=STEPS, ckpt_every=25, fault=case.fault, max_restarts=2)
            workdir = ctx.scratch / "slow" / slug(case.label) / str(i)
            o = run_trial(tool, spec, workdir, case.cap_s, env={"BENCH_SLOW_S": str(case.slow_s)})
            v = verdicts(_lines(workdir / "run" / "events.jsonl"))
            found.append(v)
            completed += int(o.rc == 0 and o.completed())
            ctx.log(f"slow {case.label} {i + 1}/{n}: rc={o.rc} {v}")
        hangs = sum(v.hangs for v in found)
        in_time = sum(v.in_time for v in found)
        detect = Cell(unit=" s")
        for v in found:
            for seconds in v.detect_s:
                detect.add(seconds)
        t.row(
            case.label,
            {
                "trials": str(n),
                "hangs declared": str(hangs),
                "in time (<= timeout + 1 s)": f"{in_time}/{hangs}" if case.hang else "-",
                "slow_phase": str(sum(v.slow_phases for v in found)),
                "completed": success_text(completed, n),
                "detected after": detect if detect.values else "-",
            },
        )
        if case.hang:
            true_trials += n
            true_in_time += sum(min(1, v.in_time) for v in found)
        else:
            healthy_trials += n
            false_hangs += hangs
    t.targets.append(
        Target(
            "healthy jobs with long work: 0 hangs declared",
            f"{false_hangs} in {healthy_trials} trials",
            false_hangs == 0,
        )
    )
    t.targets.append(
        Target(
            "true hangs declared within timeout + 1 s: 100%",
            success_text(true_in_time, true_trials),
            true_trials > 0 and true_in_time == true_trials,
        )
    )
    return t


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []
