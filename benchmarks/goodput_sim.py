"""Goodput at the failure rates large runs publish, by simulation (a program, not a test).

``python -m benchmarks.goodput_sim`` replays failures drawn at Llama 3's published rate and mix
(one unexpected interruption per ~3.1 h at 16,384 GPUs) and at RSC's (MTTF 7.9 h at 1,024 GPUs)
against rvsup's recovery and restart policy, torchrun-style and ft_launcher-style recovery, at
1k, 16k and 100k GPUs, and prints each system's effective training time ratio (ETTR: useful
training time over wall time), where the rest went, and the assumptions. The component costs are
measured on this machine (``--costs``: the JSON ``python -m benchmarks.goodput_check`` writes;
default docs/benchmarks.md's figures) and scaled by the models of :mod:`.goodput_scale`.
``python -m benchmarks.goodput_check`` checks the model against a measured run.

Options: ``--days`` (training time to do, default 30), ``--trials`` (per cell, default 20),
``--gpus`` (default ``1024,16384,100000``), ``--seed``, ``--costs FILE``, ``--out FILE`` (JSON),
``--smoke`` (2 trials of 2 days).
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from .goodput_model import RunResult, simulate
from .goodput_scale import (
    DAY,
    LLAMA3_MIX,
    RATES,
    Assumptions,
    FailureRate,
    LocalCosts,
    assumption_lines,
    checkpointing_for,
    load_costs,
    systems_at,
)
from .table import Cell, Table, Target

__all__ = ["ettr_tables", "main", "simulate_cell"]

TARGET_GPUS = 16384
TARGET_ETTR = 0.97


def simulate_cell(
    a: Assumptions,
    local: LocalCosts,
    n_gpus: int,
    rate: FailureRate,
    *,
    days: float,
    trials: int,
    seed: int,
) -> dict[str, list[RunResult]]:
    """Every system's ``trials`` runs of ``days`` of training on ``n_gpus``: the same failure
    draws for every system (one seed per trial)."""
    out: dict[str, list[RunResult]] = {}
    for recovery, memory in systems_at(a, local, n_gpus):
        ckpt = checkpointing_for(a, n_gpus, memory=memory)
        out[recovery.name] = [
            simulate(
                days * DAY,
                rate.at(n_gpus),
                LLAMA3_MIX,
                recovery,
                ckpt,
                random.Random(seed * 1_000_003 + i),
            )
            for i in range(trials)
        ]
    return out


def ettr_tables(
    a: Assumptions,
    local: LocalCosts,
    gpus: Sequence[int],
    *,
    days: float,
    trials: int,
    seed: int,
) -> list[Table]:
    """One table per published rate: ETTR per system (rows) and scale (columns), and at the
    scale of the target where the lost time went."""
    tables = []
    for rate in RATES:
        t0 = time.monotonic()
        columns = [f"{n:,} GPUs" for n in gpus]
        cells: dict[str, dict[str, Cell | str]] = {}
        where: dict[str, dict[str, Cell | str]] = {}
        for n, col in zip(gpus, columns, strict=True):
            runs = simulate_cell(a, local, n, rate, days=days, trials=trials, seed=seed)
            for name, results in runs.items():
                cell = cells.setdefault(f"ETTR, {name}", {})
                cell[col] = Cell([r.ettr for r in results], digits=3)
                for part, seconds in _lost(results).items():
                    where.setdefault(f"  {name}: {part}", {})[col] = Cell(seconds, digits=3)
        mtbf = {col: f"{1 / rate.at(n) / 3600:.2f} h" for n, col in zip(gpus, columns, strict=True)}
        t = Table("goodput_sim", f"Simulated ETTR, failures at {rate.source}", columns)
        t.row("time between failures", dict(mtbf))
        for label, row in cells.items():
            t.row(label, row)
        t.row("share of the wall time lost to:", {})
        for label, row in where.items():
            t.row(label, row)
        col = f"{TARGET_GPUS:,} GPUs"
        ours = cells.get("ETTR, rvsup", {}).get(col)
        if isinstance(ours, Cell) and ours.median is not None:
            t.targets.append(
                Target(
                    f"rvsup ETTR >= {TARGET_ETTR} at {TARGET_GPUS:,} GPUs, storage every "
                    f"{a.storage_every_s / 60:g} min",
                    f"{ours.median:.3f}",
                    ours.median >= TARGET_ETTR,
                )
            )
        t.notes.append(
            f"{trials} runs of {days:g} days of training per cell, the same failures for "
            "every system; cells: median (min-max) over the runs"
        )
        t.wall_s = time.monotonic() - t0
        tables.append(t)
    return tables


def _lost(results: Sequence[RunResult]) -> dict[str, list[float]]:
    """Per run, the share of its wall time redone, down (recovering) and stalled by saves."""
    return {
        "work redone": [r.redone_s / r.wall_s for r in results],
        "recovering": [r.down_s / r.wall_s for r in results],
        "save stalls": [r.stall_s / r.wall_s for r in results],
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.goodput_sim")
    parser.add_argument("--days", type=float, default=30.0)
    parser.add_argument("--trials", type=int, default=20)
    parser.add_argument("--gpus", default="1024,16384,100000")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--costs", type=Path, default=None)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    try:
        gpus = [int(g) for g in args.gpus.split(",")]
        local = load_costs(args.costs)
    except (ValueError, OSError) as error:
        parser.error(str(error))
    if any(g < 1 for g in gpus) or args.days <= 0 or args.trials < 1:
        parser.error("--gpus, --days and --trials must be positive")
    days, trials = (2.0, 2) if args.smoke else (args.days, args.trials)
    a = Assumptions()
    tables = ettr_tables(a, local, gpus, days=days, trials=trials, seed=args.seed)
    for t in tables:
        print(t.render(), end="\n\n")
    print("\n".join(assumption_lines(a, local)))
    if args.out is not None:
        payload = {
            "tables": [t.to_json() for t in tables],
            "assumptions": assumption_lines(a, local),
        }
        args.out.write_text(json.dumps(payload, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
