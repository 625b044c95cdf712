"""Figure 8b: how long a checkpoint stalls training, 2 ranks (torchrun, gloo, CPU), DDP and FSDP2.

Per model size and parallelism one torchrun runs :mod:`benchmarks.ckpt_stall_worker`: every
repetition saves the same model with rvsup's synchronous save, rvsup's asynchronous save (stall:
the call; durable: until the writer process committed), ``torch.save`` + fsync of each rank's
state to a new file, and ``torch.distributed.checkpoint.save`` as shipped (not atomic), in a
rotating order. Then ``RSS_SAVES`` asynchronous saves in a row measure the resident memory of
rank 0 and its writer (shared-memory staging included) after each.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from .profiles import Context
from .table import Cell, Table, Target
from .tools import REPO

WORKER = Path(__file__).with_name("ckpt_stall_worker.py")
KINDS = ("ddp", "fsdp2")
RSS_SAVES = 20


def run_worker(
    ctx: Context, kind: str, size_mb: int, reps: int, rss_saves: int
) -> dict[str, object]:
    """One torchrun of the worker; its JSON results."""
    where = ctx.scratch / f"stall-{kind}-{size_mb}"
    out = where / "out.json"
    where.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "KIND": kind,
        "SIZE_MB": str(size_mb),
        "REPS": str(reps),
        "RSS_SAVES": str(rss_saves),
        "DIR": str(where),
        "OUT": str(out),
    }
    argv = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2"]
    done = subprocess.run(
        [*argv, str(WORKER)], env=env, capture_output=True, text=True, timeout=3600, check=False
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"{kind} {size_mb} MB failed:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
    result: dict[str, object] = json.loads(out.read_text())
    subprocess.run(["rm", "-rf", str(where)], check=False)
    return result


def stall(ctx: Context) -> Table:
    p = ctx.profile
    cols = [
        "rvsup sync (stall = durable)",
        "rvsup async: stall",
        "rvsup async: durable",
        "torch.save + fsync, new file",
        "dcp.save as shipped",
    ]
    t = Table(
        "checkpoint_stall",
        f"8b. Training stall per save and time until durable (s, 2 ranks, {p.ckpt_reps} "
        f"rotating repetitions) in {ctx.scratch}",
        cols,
    )
    rss_saves = RSS_SAVES if not p.smoke else 3
    for size in p.ckpt_sizes_mb:
        for kind in KINDS:
            ctx.log(f"checkpoint stall {kind} {size} MB")
            r = run_worker(ctx, kind, size, p.ckpt_reps, rss_saves)
            stall_s, durable_s = r["stall"], r["durable"]
            assert isinstance(stall_s, dict)
            assert isinstance(durable_s, dict)
            cells = {
                cols[0]: Cell(stall_s["rvsup sync"], " s", digits=3),
                cols[1]: Cell(stall_s["rvsup async"][1:] or stall_s["rvsup async"], " s", digits=3),
                cols[2]: Cell(durable_s["rvsup async"], " s", digits=3),
                cols[3]: Cell(stall_s["torch.save+fsync new"], " s", digits=3),
                cols[4]: Cell(stall_s["dcp.save"], " s", digits=3),
            }
            label = f"{kind} {size} MB"
            t.row(label, dict(cells))
            first = stall_s["rvsup async"][0]
            t.notes.append(
                f"{label}: first async save stalled {first:.3f} s (staging memory "
                "allocated); the async stall cell is the steady state after it"
            )
            t.add_ratio(f"{label}: async stall / sync save", cells[cols[1]], cells[cols[0]])
            t.add_ratio(f"{label}: dcp.save / rvsup sync (time)", cells[cols[4]], cells[cols[0]])
            t.add_ratio(
                f"{label}: torch.save + fsync / rvsup sync (time)", cells[cols[3]], cells[cols[0]]
            )
            rss = r["rss"]
            assert isinstance(rss, list)
            grown = (rss[-1] - rss[min(4, len(rss) - 1)]) / (1 << 20)
            t.notes.append(
                f"{label}: RSS of rank 0 + writer over {len(rss)} async saves: "
                f"{rss[0] / (1 << 20):.0f} MB after the first, {rss[-1] / (1 << 20):.0f} MB "
                f"after the last ({grown:+.1f} MB since the 5th)"
            )
            if size >= 1000:
                a, s_ = cells[cols[1]].median, cells[cols[0]].median
                if a is not None and s_:
                    t.targets.append(
                        Target(
                            f"{label}: async stall <= 5% of the sync save",
                            f"{a / s_:.1%}",
                            a / s_ <= 0.05,
                        )
                    )
                d = cells[cols[4]].median
                if d is not None and s_:
                    t.targets.append(
                        Target(
                            f"{label}: sync atomic save >= 0.9x dcp.save",
                            f"{d / s_:.2f}x",
                            d / s_ >= 0.9,
                        )
                    )
                t.targets.append(
                    Target(
                        f"{label}: no RSS growth over {len(rss)} saves",
                        f"{grown:+.1f} MB",
                        abs(grown) < 16,
                    )
                )
    return t
