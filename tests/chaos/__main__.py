"""``python -m tests.chaos``: a seeded campaign of random fault schedules against real jobs.

    python -m tests.chaos --runs 200 --seed 1        # a campaign; prints every run and a summary
    python -m tests.chaos --runs 200 --seed 1 --start 111   # the same campaign's runs 111..199
    python -m tests.chaos --runs 200 --seed 1 --memory auto  # the memory tier on, its faults too
    python -m tests.chaos --smoke    # the regression schedules (the memory tier's with a snapshot
                                     # every 3 steps) and one drawn (the tier as shipped, "auto")
    python -m tests.chaos --replay 'max_restarts=2 kill:1:13:1 term:-:20:2'
    python -m tests.chaos --runs 50 --seed 1 --memory 3 --accumulate 4  # gradients accumulated
                                     # over 4 steps: saves and snapshots mid-accumulation
    python -m tests.chaos --runs 50 --seed 1 --shape accelerate  # the loop as Accelerate's
                                     # guides write it: prepared loader, skip_first_batches
    python -m tests.chaos --runs 20 --seed 1 --shape lightning   # a Lightning Trainer with
                                     # the callback (drawn schedules of LIGHTNING_KINDS)
    python -m tests.chaos --bad-node --runs 4 --seed 1   # bad nodes on the Slurm testbed

Run ``i`` of seed ``s`` draws its schedule from ``random.Random(f"{s}:{i}")``: a failing run prints
its schedule line, which ``--replay`` runs again. Needs root for the ``enospc`` and ``shmfull``
faults (a small tmpfs); without it those kinds are left out, and the summary says so. Exit 0
when every invariant held in every run, 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import random
import shutil
import signal
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.helpers.process_guard import guard
from tests.helpers.states import assert_same_state, load_final

from . import bad_node
from .execute import WORKLOAD, Observed, execute, reference
from .invariants import check
from .rollbacks import omitted
from .schedule import DAMAGE, KINDS, MEMORY, Schedule, draw, parse

REGRESSIONS = (
    # a crash, a stop by SIGTERM, the stop's checkpoint corrupted before the next start
    "max_restarts=2 kill:1:13:1 term:-:20:2 corrupt:-:0:2",
    # a SIGSTOPped rank, then a kill aimed at a save spends the budget: rvsup gives up (exit 3)
    "max_restarts=1 sigstop:0:12:1 savekill:1:30:2",
    # two ranks failing at one step, a full disk, rvsup killed and its checkpoint truncated
    "max_restarts=2 kill:0:8:1 raise:1:8:1 enospc:0:9:2 daemonkill:-:30:2 truncate:-:0:2",
    # a rank blocked in a receive while the other waits in an all-reduce, twice: both stacks
    # are inside torch; only the flight recorders name rank 1
    "max_restarts=1 stuck:1:10:1 stuck:1:25:2",
    # a SIGSTOPped rank continued to dump its stacks trained on and committed a checkpoint after
    # the hang was caught; the next attempt resumed from it, past the step that fills the disk
    "max_restarts=2 sigstop:1:4:1 enospc:0:6:2 term:-:29:2",
    # rvsup killed while its ranks committed a checkpoint it never logged; the next attempt
    # resumed from it, and the history did not name it
    "max_restarts=2 enospc:0:7:1 daemonkill:-:20:1 usr1:-:36:2",
    # a poisoned batch at step 25 rolled back to step 19, on at 28; a crash before the next
    # save: the restart loads step 19 again and must still resume at 28, not train on 20..27
    "max_restarts=1 max_rollbacks=1 nan:1:25:1 kill:0:29:2",
)

SHAPES = ("plain", "accelerate", "lightning")  # the job's loop (--shape; trainer.py's SHAPE)
LIGHTNING_KINDS = ("kill", "raise", "oom", "sigstop", "stuck", "term", "usr1", "daemonkill")
"""The kinds a Lightning job is drawn (its checkpoints are Lightning's: no save to aim a kill at,
nor to fill a disk under; no step a rollback could skip to; no memory tier), with the damage to
the marker after a stop or a killed daemon."""

MEMORY_REGRESSIONS = (
    # a rank killed while a snapshot is being written; the snapshot writers killed at step 16 of
    # the next attempt, rvsup killed, the newest snapshot corrupted before the next start (the
    # writers killed first, the kill at step 12 found no snapshot to aim at whenever their death
    # turned the tier off for the attempt: a dead writer's snapshot in flight does)
    "max_restarts=1 snapkill:1:12:1 writerkill:-:16:2 daemonkill:-:30:2 shmcorrupt:-:0:2",
    # memory_dir full from step 5 to 13: the tier off for the attempt, then a crash
    "max_restarts=1 shmfull:0:5:1 kill:1:20:1",
)


def main(argv: Sequence[str] | None = None) -> int:
    args = _parse_args(argv)
    if args.bad_node:
        return _bad_node_campaign(args)
    guard()  # the subreaper of every run's processes: what a run leaves is found (execute.py)
    if args.accumulate > 1:
        WORKLOAD["ACCUMULATE"] = str(args.accumulate)
    if args.shape != "plain":
        WORKLOAD["SHAPE"] = args.shape
    # SIGTERM unwinds like Ctrl-C: the run in progress is killed and its tmpfs unmounted
    signal.signal(signal.SIGTERM, _exit_on_term)
    kinds = [
        k
        for k in KINDS
        if (k not in ("enospc", "shmfull") or _can_mount()) and (k not in MEMORY or args.memory)
    ]
    if args.shape == "lightning":
        kinds = [k for k in kinds if k in (*LIGHTNING_KINDS, *DAMAGE)]
    memory = [args.memory]  # each schedule's memory_every_steps (None: the tier off)
    if args.replay:
        schedules = [parse(args.replay)]
    elif args.smoke:
        # the memory tier's regressions with snapshots every 3 steps whether or not --memory is
        # given (its faults need snapshots to aim at), the drawn schedule with the tier as
        # shipped ("auto") unless --memory says otherwise
        drawn = draw(random.Random(f"{args.seed}:0"), kinds=kinds, max_endings=2)
        schedules = [*(parse(t) for t in (*REGRESSIONS, *MEMORY_REGRESSIONS)), drawn]
        memory = [
            *[args.memory] * len(REGRESSIONS),
            *[args.memory or "3"] * len(MEMORY_REGRESSIONS),
            args.memory or "auto",
        ]
    else:
        schedules = [draw(random.Random(f"{args.seed}:{i}"), kinds=kinds) for i in range(args.runs)]
    memory += [memory[-1]] * (len(schedules) - len(memory))
    numbered = list(enumerate(zip(schedules, memory, strict=True)))[args.start :]
    if not _can_mount():
        print("not root: enospc and shmfull faults (a full tmpfs) left out", flush=True)
        numbered = [(i, (s, m)) for i, (s, m) in numbered if not s.needs_tmpfs]
    schedules = [s for _, (s, _) in numbered]
    used = sorted({m or "off" for _, (_, m) in numbered})
    root = Path(tempfile.mkdtemp(prefix="rvsup-chaos-"))
    tally: collections.Counter[str] = collections.Counter()
    try:
        refs = References(root)
        results = [_one(i, s, root / f"run-{i:04d}", refs, m, tally) for i, (s, m) in numbered]
    finally:
        if not args.keep:
            shutil.rmtree(root, ignore_errors=True)
    summary = _summary(schedules, results)
    summary["memory_every_steps"] = ", ".join(used)
    summary["accumulate_steps"] = args.accumulate
    summary["shape"] = args.shape
    if used != ["off"]:
        summary |= {k: tally[k] for k in _MEMORY_TALLY}
    summary["resumed_from"] = {
        k.partition(":")[2]: n for k, n in sorted(tally.items()) if k.startswith("from:")
    }
    print(json.dumps(summary, indent=1) if args.json else _table(summary), flush=True)
    return 1 if summary["failed_runs"] else 0


def _parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m tests.chaos", description=__doc__)
    p.add_argument("--runs", type=int, default=200)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--start",
        type=int,
        default=0,
        metavar="I",
        help="begin at run I: the rest of a campaign that was cut short, same schedules",
    )
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--smoke", action="store_true", help="regression schedules + 1 drawn")
    mode.add_argument("--replay", metavar="SCHEDULE", help="run one schedule line")
    p.add_argument("--keep", action="store_true", help="keep the run directories")
    p.add_argument(
        "--bad-node",
        action="store_true",
        help="the bad-node campaign on the Slurm testbed (tests/chaos/bad_node.py), --runs runs",
    )
    p.add_argument("--json", action="store_true", help="the summary as JSON")
    p.add_argument(
        "--memory",
        metavar="EVERY",
        help='the memory tier on: the jobs\' memory_every_steps ("auto" or a number of steps)',
    )
    p.add_argument(
        "--accumulate",
        type=int,
        default=1,
        metavar="K",
        help="the job accumulates gradients over K steps (no_sync(), an optimizer step every K)",
    )
    p.add_argument(
        "--shape",
        choices=SHAPES,
        default="plain",
        help="the job's loop: plain (random batches from the global generator), accelerate "
        "(prepared model, optimizer, loader and scheduler; an epoch loop with "
        "skip_first_batches; tests/helpers/trainer.py) or lightning (a Trainer with the "
        "callback; tests/helpers/lightning_worker.py)",
    )
    args = p.parse_args(argv)
    if args.accumulate < 1:
        p.error(f"--accumulate takes a number of steps >= 1, not {args.accumulate}")
    if args.memory is not None and args.memory != "auto" and not args.memory.isdigit():
        p.error(f'--memory takes "auto" or a number of steps, not {args.memory!r}')
    if args.shape == "lightning" and (args.smoke or args.memory):
        p.error("--shape lightning runs drawn or replayed schedules with the memory tier off")
    if args.replay:
        try:
            replayed = parse(args.replay)
        except ValueError as e:
            p.error(str(e))
        odd = {f.kind for f in replayed.faults} - {*LIGHTNING_KINDS, *DAMAGE}
        if args.shape == "lightning" and odd:
            p.error(f"--shape lightning has no place for {', '.join(sorted(odd))}")
        if replayed.uses_memory and not args.memory:
            p.error(f"{args.replay!r} has faults of the memory tier ({MEMORY}): add --memory")
    if not 0 <= args.start < max(args.runs, 1):
        p.error(f"--start must be in 0..{args.runs - 1}, got {args.start}")
    return args


def _bad_node_campaign(args: argparse.Namespace) -> int:
    """Exit 1 when an attempt started on a bad node after its exclusion."""
    summary = bad_node.campaign(args.runs, args.seed, keep=args.keep)
    print(json.dumps(summary, indent=1), flush=True)
    return 1 if summary["on"]["attempts_on_bad_node_after_exclusion"] else 0


def _can_mount() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


class References:
    """The final states of the uninterrupted runs, one per set of steps left out (a rolled-back
    run skips steps), each run once when first needed."""

    def __init__(self, root: Path) -> None:
        self._root = root
        self._states: dict[tuple[tuple[int, int], ...], Any] = {}

    def state(self, left_out: tuple[tuple[int, int], ...]) -> Any:
        if left_out not in self._states:
            name = "-".join(f"{a}_{b}" for a, b in left_out) or "all"
            self._states[left_out] = load_final(reference(self._root / f"ref-{name}", left_out))
        return self._states[left_out]


def _one(
    index: int,
    s: Schedule,
    workdir: Path,
    refs: References,
    memory: str | None,
    tally: collections.Counter[str],
) -> list[str]:
    """Run ``s``, print its verdict; ``tally`` counts where attempts resumed from
    ("from:memory") and what the memory tier's faults did (:data:`_MEMORY_TALLY`)."""
    seen = execute(s, workdir, memory=memory)
    problems = [*seen.errors, *_violations(s, seen, refs, memory)]
    for e in seen.events:
        if e["event"] == "checkpoint_loaded" and e.get("checkpoint") is not None:
            tally[f"from:{e.get('source', 'storage')}"] += 1
        elif e["event"] == "memory_tier_off":
            tally["memory_tier_off"] += 1
    tally["writers_killed"] += sum(seen.writers_killed.values())
    tally["snapshots_damaged"] += len(seen.snapshot_damaged)
    skipped = {e["path"] for e in seen.events if e["event"] == "checkpoint_skipped"}
    tally["damaged_snapshots_skipped"] += len(set(seen.snapshot_damaged.values()) & skipped)
    verdict = "ok" if not problems else "FAIL"
    print(f"run {index:4d} {seen.seconds:6.1f}s {verdict:4s} {s.text()}", flush=True)
    for p in problems:
        print(f"    {p}", flush=True)
    if problems:
        flag = "" if memory is None else f" --memory {memory}"
        print(f"    replay: python -m tests.chaos --replay '{s.text()}'{flag}", flush=True)
    return problems


def _violations(
    s: Schedule, seen: Observed, refs: References, memory: str | None = None
) -> list[str]:
    out = check(
        s,
        exit_codes=seen.exit_codes,
        events=seen.events,
        save_killed=seen.save_killed,
        damaged=seen.damaged,
        history=seen.history,
        snapshot_damaged=seen.snapshot_damaged,
        memory_every=int(memory) if memory and memory.isdigit() else None,
    )
    out += [f"left behind: {line}" for line in seen.leftovers]
    if seen.memory_left:
        out.append(f"snapshots left in memory_dir after the job ended: {seen.memory_left}")
    if not s.gives_up:
        if seen.final is None or not seen.final.exists():
            out.append("no final state written")
        else:
            left_out = omitted(seen.events)
            try:
                assert_same_state(refs.state(left_out), load_final(seen.final))
            except AssertionError as e:
                out.append(f"final state differs from the uninterrupted run {left_out}: {e}")
    return out


_MEMORY_TALLY = (
    "writers_killed",
    "snapshots_damaged",
    "damaged_snapshots_skipped",
    "memory_tier_off",
)


def _exit_on_term(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def _summary(schedules: Sequence[Schedule], results: Sequence[list[str]]) -> dict[str, Any]:
    faults = collections.Counter(f.kind for s in schedules for f in s.faults)
    return {
        "runs": len(schedules),
        "faults": sum(faults.values()),
        "faults_by_kind": dict(sorted(faults.items())),
        "gave_up_as_expected": sum(1 for s in schedules if s.gives_up),
        "rolled_back_as_expected": sum(len(s.rollbacks) for s in schedules),
        "failed_runs": sum(1 for r in results if r),
        "violations": sum(len(r) for r in results),
    }


def _table(summary: dict[str, Any]) -> str:
    lines = [f"{k:22s} {v}" for k, v in summary.items() if not isinstance(v, dict)]
    lines += [f"  {k:20s} {v}" for k, v in summary["faults_by_kind"].items()]
    if summary.get("resumed_from"):
        lines.append("resumed_from")
        lines += [f"  {k:20s} {v}" for k, v in summary["resumed_from"].items()]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
