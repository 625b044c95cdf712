"""``python -m benchmarks [--quick | --smoke] [--only crash,hang,...]``: print the tables, write JSON."""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from . import (
    fig_anomaly,
    fig_checkpoint,
    fig_ckpt_stall,
    fig_faults,
    fig_footprint,
    fig_lifecycle,
    fig_live,
    fig_memory_goodput,
    fig_sdk,
    fig_slow,
    machine,
)
from .profiles import PROFILES, Context
from .table import Table, Target
from .tools import REPO

RESULTS = REPO / "benchmarks" / "results"
FIGURES: dict[str, Callable[[Context], Table]] = {
    "crash": fig_faults.crash,
    "hang": fig_faults.hang,
    "oom": fig_faults.oom,
    "preempt": fig_lifecycle.preempt,
    "goodput": fig_lifecycle.goodput,
    "cold": fig_lifecycle.cold,
    "sdk": fig_sdk.sdk,
    "checkpoint": fig_checkpoint.checkpoint,
    "checkpoint_stall": fig_ckpt_stall.stall,
    "footprint": fig_footprint.footprint,
    "scale": fig_footprint.scale,
    "slow": fig_slow.slow,
    "anomaly": fig_anomaly.anomaly,
    "live": fig_live.live,
    "memory_goodput": fig_memory_goodput.memory_goodput,
}
SMOKE_FIGURES = ("crash", "sdk", "checkpoint", "scale", "anomaly")
NVRX_ENV = "RVSUP_BENCH_NVRX_VENV"
TORCHFT_ENV = "RVSUP_BENCH_TORCHFT_VENV"


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="n=3 and shorter runs")
    mode.add_argument("--smoke", action="store_true", help="n=1, tiny runs (seconds)")
    parser.add_argument("--only", default="", help=f"comma-separated: {','.join(FIGURES)}")
    parser.add_argument(
        "--nvrx-venv",
        default=os.environ.get(NVRX_ENV),
        help=f"virtualenv with nvidia-resiliency-ext (default: ${NVRX_ENV})",
    )
    parser.add_argument(
        "--torchft-venv",
        default=os.environ.get(TORCHFT_ENV),
        help=f"virtualenv with torchft (default: ${TORCHFT_ENV})",
    )
    parser.add_argument(
        "--scratch",
        help="where trials run and checkpoints are written "
        "(default: a new temporary directory, removed at the end)",
    )
    parser.add_argument("--out", help="JSON result file (default: benchmarks/results/)")
    return parser.parse_args(argv)


def cross_figure_targets(tables: dict[str, Table]) -> list[Target]:
    """Targets that need two figures: crash MTTR against the cold start."""
    out: list[Target] = []
    crash, cold = tables.get("crash"), tables.get("cold")
    if crash is None or cold is None:
        return out
    mttr = crash.cell("MTTR (kill -> resumed step on all ranks)", "rvsup (auto)")
    start = cold.cell("launch -> first step on all ranks", "rvsup")
    if mttr is not None and start is not None and mttr.median is not None and start.median:
        out.append(
            Target(
                "crash MTTR <= cold start + 0.5 s",
                f"{mttr.median:.2f} s vs {start.median:.2f} + 0.5 s",
                mttr.median <= start.median + 0.5,
            )
        )
    for tool, cold_col in (("rvsup (auto)", "rvsup"), ("torchrun (workaround)", "torchrun")):
        m = crash.cell("MTTR (kill -> resumed step on all ranks)", tool)
        c = cold.cell("launch -> first step on all ranks", cold_col)
        if m is not None and c is not None and m.median is not None and c.median:
            out.append(Target(f"MTTR / cold start, {tool}", f"{m.median / c.median:.2f}x", None))
    return out


def _error_table(name: str, exc: BaseException) -> Table:
    t = Table(name, f"{name}: failed", ["error"])
    t.row("error", {"error": f"{type(exc).__name__}: {exc}"})
    t.notes += traceback.format_exc().strip().splitlines()[-6:]
    return t


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    profile = PROFILES["quick" if args.quick else "smoke" if args.smoke else "full"]
    default = SMOKE_FIGURES if profile.smoke else tuple(FIGURES)
    only = [s.strip() for s in args.only.split(",") if s.strip()] or list(default)
    unknown = [s for s in only if s not in FIGURES]
    if unknown:
        print(f"unknown figure(s) {unknown}; valid: {', '.join(FIGURES)}", file=sys.stderr)
        return 2
    scratch = Path(args.scratch) if args.scratch else Path(tempfile.mkdtemp(prefix="rvsup-bench-"))
    scratch.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().astimezone().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else RESULTS / f"{profile.name}-{stamp}.json"
    ctx = Context(profile, scratch, args.nvrx_venv, args.torchft_venv)
    info = machine.describe(args.nvrx_venv, args.torchft_venv)
    print(machine.render(info))
    print(f"mode: {profile.name}; figures: {', '.join(only)}\n", flush=True)
    began = time.monotonic()
    tables: dict[str, Table] = {}
    result: dict[str, Any] = {"mode": profile.name, "started": stamp, "machine": info}
    try:
        for name in only:
            t0 = time.monotonic()
            try:
                table = FIGURES[name](ctx)
            except Exception as exc:  # noqa: BLE001 -- one broken figure must not hide the others
                table = _error_table(name, exc)
            table.wall_s = time.monotonic() - t0
            tables[name] = table
            print(table.render() + "\n", flush=True)
            result["figures"] = {k: v.to_json() for k, v in tables.items()}
            _write(out, result)
        summary = cross_figure_targets(tables)
        if summary:
            print("== Targets across figures")
            print("\n".join(t.render() for t in summary))
        wall = time.monotonic() - began
        result["machine"]["load_avg_at_end"] = [round(x, 2) for x in os.getloadavg()]
        print(f"\nload average at the end {result['machine']['load_avg_at_end']}")
        print(f"total wall time {wall:.0f} s ({wall / 60:.1f} min); JSON: {out}")
        result["summary"] = [
            {"goal": t.goal, "measured": t.measured, "hit": t.hit} for t in summary
        ]
        result["wall_s"] = round(wall, 1)
        _write(out, result)
    finally:
        if not args.scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    failed = [n for n, t in tables.items() if t.columns == ["error"]]
    return 1 if failed else 0


def _write(path: Path, result: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(result, indent=1, default=str))
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(main())
