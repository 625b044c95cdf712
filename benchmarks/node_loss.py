"""Figure 14: a node lost on the Slurm testbed, with and without the memory tier.

``python -m benchmarks.node_loss [--steps 500] [--every 500] [--lose-after 400] [--trials 2]``
(root: it brings up the project's Slurm test cluster, three nodes in network namespaces, and
takes it down at the end).

The same 2 x 2 DDP job (the process tests' trainer, 0.05 s steps) runs in a 3-node allocation
(``sbatch --no-kill``: node3 is the spare), a storage checkpoint every ``--every`` steps, with
the memory tier on (``memory_every_steps = "auto"``, and every 5 steps) and off, in turn trial
by trial. Once
every rank is past ``--lose-after``, node2 is lost: its copies of the snapshots are deleted (its
memory) and every process on it is killed at once, slurmd included. rvsup finds the node lost
and restarts on node1 and node3. Measured from the kill: when the failure was noticed, when
attempt 2 started (once the node's loss was established and the survivors torn down), when its
ranks had loaded their state, and when every rank was past the step it had reached
before the kill again (the time the loss cost); and the steps redone. The final states are
compared with each other (bit-identical, or the table says so).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from supervisor.config.load import load_config
from supervisor.ranks.snapshot_home import recorded
from tests.helpers.states import assert_same_state, load_final
from tests.slurm.cluster import SlurmCluster
from tests.slurm.jobs import batch_script, ranks_past, wait_until, write_trainer_job
from tests.slurm.node_loss import bring_back

VARIANTS = {
    'rvsup, memory tier "auto"': 'memory_every_steps = "auto"',
    "rvsup, memory tier every 5": "memory_every_steps = 5",
    "rvsup, storage only": 'memory_every_steps = "off"',
}


def _when(event: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(event["timestamp"]).timestamp()


def run_one(
    cluster: SlurmCluster, root: Path, memory: str, *, steps: int, every: int, lose_after: int
) -> dict[str, Any]:
    """One job, node2 lost past ``lose_after``; what it cost."""
    job = write_trainer_job(
        root,
        name=root.name,
        total=steps,
        env={"STEP_SLEEP": "0.05"},
        nnodes="2",
        checkpoint=f"every_steps = {every}\n{memory}",
        restart='max_restarts = 3\nbackoff = "0s"',
    )
    job_id = cluster.sbatch(
        batch_script(job),
        f"--output={job.output}",
        f"--job-name={job.name}",
        "--nodes=3",
        "--nodelist=node1,node2,node3",
        "--no-kill",
    )
    killed = False
    try:
        status = wait_until(lambda: ranks_past(job, lose_after), timeout=180, what="the ranks")
        reached = min(r["last_step"] for r in status["ranks"])
        snapshots = recorded(load_config(job.job_toml).job.run_dir)  # the daemon made it
        if snapshots is not None:
            shutil.rmtree(snapshots / "node2", ignore_errors=True)
        for pid in cluster.node_processes("node2"):
            os.kill(pid, signal.SIGKILL)
        killed, kill_t = True, time.time()

        def back() -> dict[str, Any] | None:
            got = ranks_past(job, reached)
            return got if got is not None and got["attempt"] >= 2 else None

        wait_until(back, timeout=180, what="the ranks back where they were")
        back_s = time.time() - kill_t
        wait_until(
            lambda: job.named("job_succeeded") or job.named("job_gave_up"),
            timeout=300,
            what="the job's end",
        )
    finally:
        if killed:
            cluster.wait_gone(job_id, timeout=120)
            bring_back(cluster, "node2")
        else:
            cluster.scancel(job_id)
            cluster.wait_gone(job_id, timeout=60)
    (failure,) = job.named("failure_detected")
    started = next(e for e in job.named("attempt_started") if e["attempt"] == 2)
    loaded = next(e for e in job.named("checkpoint_loaded") if e["attempt"] == 2)
    noticed = datetime.datetime.fromisoformat(failure["noticed_at"].replace("Z", "+00:00"))
    return {
        "job": job,
        "kind": failure["kind"],
        "reached": reached,
        "source": loaded["source"] or "scratch",
        "redone": max(0, reached + 1 - loaded["resume_step"]),
        "noticed_s": noticed.timestamp() - kill_t,
        "started_s": _when(started) - kill_t,
        "loaded_s": _when(loaded) - kill_t,
        "back_s": back_s,
        "succeeded": bool(job.named("job_succeeded")),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.node_loss", description=__doc__)
    parser.add_argument("--steps", type=int, default=500)
    parser.add_argument("--every", type=int, default=500)
    parser.add_argument("--lose-after", type=int, default=400)
    parser.add_argument("--trials", type=int, default=2)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("the Slurm test cluster needs root", file=sys.stderr)
        return 2
    cluster = SlurmCluster()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in VARIANTS}
    os.environ["SLURM_CONF"] = str(cluster.slurm_conf)
    cluster.up()
    try:
        with tempfile.TemporaryDirectory(prefix="rvsup-node-loss-") as tmp:
            for trial in range(args.trials):
                for index, (name, memory) in enumerate(VARIANTS.items()):
                    root = Path(tmp) / f"t{trial}-v{index}"
                    got = run_one(
                        cluster,
                        root,
                        memory,
                        steps=args.steps,
                        every=args.every,
                        lose_after=args.lose_after,
                    )
                    results[name].append(got)
                    print(f"trial {trial + 1} {name}: " + _brief(got), flush=True)
            finals = [load_final(r["job"].final) for rs in results.values() for r in rs]
            same = "yes"
            for other in finals[1:]:
                try:
                    assert_same_state(finals[0], other)
                except AssertionError:
                    same = "NO"
    finally:
        cluster.down()
    _table(results, args, same)
    return 0


def _brief(got: dict[str, Any]) -> str:
    return (
        f"{got['kind']}, past step {got['reached']}, resumed from {got['source']}, "
        f"{got['redone']} steps redone, noticed {got['noticed_s']:.1f} s, attempt 2 "
        f"{got['started_s']:.1f} s, loaded {got['loaded_s']:.1f} s, back {got['back_s']:.1f} s "
        "after the kill"
    )


def _table(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, same: str) -> None:
    names = list(results)
    print(
        f"\n14. A node lost (2 x 2 DDP job, 3-node allocation, Slurm testbed): node2 killed whole "
        f"past step {args.lose_after} of {args.steps}, storage every {args.every} steps; "
        f"medians of {args.trials} trials"
    )
    rows = [
        ("resumed from", lambda rs: ", ".join(sorted({r["source"] for r in rs}))),
        ("steps redone", lambda rs: _median(rs, "redone", "{:.0f}")),
        ("failure noticed (s after the kill)", lambda rs: _median(rs, "noticed_s")),
        ("attempt 2 started (s after the kill)", lambda rs: _median(rs, "started_s")),
        ("state loaded (s after the kill)", lambda rs: _median(rs, "loaded_s")),
        ("back where it was (s after the kill)", lambda rs: _median(rs, "back_s")),
        ("finished", lambda rs: f"{sum(r['succeeded'] for r in rs)}/{len(rs)}"),
    ]
    width = max(len(label) for label, _ in rows) + 2
    print(" " * width + " | ".join(f"{n:>28}" for n in names))
    for label, cell in rows:
        print(f"{label:<{width}}" + " | ".join(f"{cell(results[n]):>28}" for n in names))
    storage = statistics.median(r["back_s"] for r in results[names[-1]])
    ratios = [statistics.median(r["back_s"] for r in results[n]) / storage for n in names]
    print(f"{'time lost / storage only':<{width}}" + " | ".join(f"{x:>28.2f}" for x in ratios))
    print(f"{'final states bit-identical':<{width}}{same:>28}")
    print(json.dumps({n: [_brief(r) for r in rs] for n, rs in results.items()}, indent=1))


def _median(rs: list[dict[str, Any]], key: str, fmt: str = "{:.1f}") -> str:
    return fmt.format(statistics.median(r[key] for r in rs))


if __name__ == "__main__":
    sys.exit(main())
