"""``python -m tests.chaos --bad-node``: a seeded campaign of bad nodes on the Slurm testbed.

Every run is a 2-node x 2-rank job in a 3-node allocation (node3 the spare) with one bad node
drawn from ``random.Random(f"{seed}:bad:{i}")``: node1 or node2, and how it is bad:

- ``crash``: its ranks raise at a drawn step of every attempt (a flaky GPU that fails again);
- ``unhealthy``: the same, and the health command fails there too (what NHC would see).

Each run is played twice, with exclusion on (``[health] exclude_after = 2``, the default) and
off (``exclude_after = 0``), and measured from its history: the attempts that started on the
bad node after it was excluded (the target is 0), the restarts until the job succeeded, and
whether it succeeded at all (``max_restarts = 4``). Needs root (the testbed).
"""

from __future__ import annotations

import json
import random
import re
import shutil
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.slurm.cluster import SlurmCluster
from tests.slurm.jobs import TrainerJob, batch_script, write_trainer_job

__all__ = ["BadNode", "Measured", "campaign", "draw_bad_node", "measure"]

NODES = ("node1", "node2", "node3")
KINDS = ("crash", "unhealthy")
TOTAL = 20
JOB_TIMEOUT_S = 600.0
_NODELIST = re.compile(r"--nodelist=(\S+)")


@dataclass(frozen=True, slots=True)
class BadNode:
    """One run's bad node: which, how, from which step."""

    node: str
    kind: str
    step: int

    def text(self) -> str:
        return f"{self.kind}:{self.node}:{self.step}"


@dataclass(frozen=True, slots=True)
class Measured:
    """What one job's history says."""

    succeeded: bool
    attempts: int
    restarts: int
    excluded: bool
    on_bad_after_exclusion: int
    seconds: float


def draw_bad_node(rng: random.Random) -> BadNode:
    """A bad node among the two the job starts on, its kind, and the step its ranks fail at."""
    return BadNode(rng.choice(NODES[:2]), rng.choice(KINDS), rng.randint(3, 8))


def measure(events: Sequence[dict[str, Any]], bad: str, seconds: float) -> Measured:
    """The figures of one job from its events (the module docstring)."""
    excluded = False
    on_bad = 0
    for event in events:
        if event["event"] == "node_excluded" and event.get("node") == bad:
            excluded = True
        if event["event"] == "attempt_started" and excluded:
            lists = [m.group(1).split(",") for a in event["launcher"] if (m := _NODELIST.match(a))]
            on_bad += bool(lists) and bad in lists[0]
    return Measured(
        succeeded=any(e["event"] == "job_succeeded" for e in events),
        attempts=sum(e["event"] == "attempt_started" for e in events),
        restarts=sum(
            e["event"] == "restart_scheduled" and e.get("charged") is True for e in events
        ),
        excluded=excluded,
        on_bad_after_exclusion=on_bad,
        seconds=seconds,
    )


def _job(root: Path, bad: BadNode, exclude_after: int) -> TrainerJob:
    job = write_trainer_job(
        root,
        name="bad-node",
        total=TOTAL,
        env={"BAD_NODE": f"{bad.node}:{bad.step}", "STEP_SLEEP": "0.05"},
        nnodes="2",
        restart='max_restarts = 4\nbackoff = "0.1s"\nbackoff_max = "0.5s"\nmax_no_progress = 5',
    )
    health = [f"exclude_after = {exclude_after}"]
    if bad.kind == "unhealthy":
        said = "Xid 79: GPU has fallen off the bus"
        check = f'test "$SLURMD_NODENAME" != {bad.node} || {{ echo "{said}"; exit 1; }}'
        health.append(f"command = {json.dumps(['sh', '-c', check])}")
    job.job_toml.write_text(job.job_toml.read_text() + "\n[health]\n" + "\n".join(health) + "\n")
    return job


def _play(cluster: SlurmCluster, root: Path, bad: BadNode, exclude_after: int) -> Measured:
    job = _job(root, bad, exclude_after)
    begin = time.monotonic()
    job_id = cluster.sbatch(
        batch_script(job),
        f"--output={job.output}",
        "--job-name=bad-node",
        "--nodes=3",
        "--nodelist=" + ",".join(NODES),
    )
    try:
        cluster.wait_gone(job_id, timeout=JOB_TIMEOUT_S)
    finally:
        cluster.scancel(job_id)
        cluster.wait_gone(job_id, timeout=60)
    return measure(job.events(), bad.node, time.monotonic() - begin)


def campaign(runs: int, seed: int, *, keep: bool = False) -> dict[str, Any]:
    """Every run with exclusion on and off on a fresh testbed; per-run lines and the summary."""
    root = Path(tempfile.mkdtemp(prefix="rvsup-bad-node-"))
    cluster = SlurmCluster()
    cluster.up()
    results: dict[str, list[Measured]] = {"on": [], "off": []}
    try:
        for index in range(runs):
            bad = draw_bad_node(random.Random(f"{seed}:bad:{index}"))
            for mode, after in (("on", 2), ("off", 0)):
                seen = _play(cluster, root / f"run-{index:03d}-{mode}", bad, after)
                results[mode].append(seen)
                print(
                    f"run {index:3d} exclusion {mode:3s} {bad.text():18s} "
                    f"{'succeeded' if seen.succeeded else 'gave up  '} attempts {seen.attempts} "
                    f"restarts {seen.restarts} on bad node after exclusion "
                    f"{seen.on_bad_after_exclusion} {seen.seconds:6.1f}s",
                    flush=True,
                )
    finally:
        cluster.down()
        if not keep:
            shutil.rmtree(root, ignore_errors=True)
    return {mode: _summary(seen) for mode, seen in results.items()}


def _summary(seen: Sequence[Measured]) -> dict[str, Any]:
    done = [m for m in seen if m.succeeded]
    return {
        "runs": len(seen),
        "succeeded": len(done),
        "gave_up": len(seen) - len(done),
        "attempts_on_bad_node_after_exclusion": sum(m.on_bad_after_exclusion for m in seen),
        "restarts_until_success_mean": (
            round(sum(m.restarts for m in done) / len(done), 2) if done else None
        ),
        "restarts_total": sum(m.restarts for m in seen),
        "attempts_total": sum(m.attempts for m in seen),
        "seconds_total": round(sum(m.seconds for m in seen), 1),
    }
