"""Figure 8: checkpoint write throughput on one disk: rvsup's atomic save vs torch.save vs dd.

Each repetition writes the same payload (one float32 tensor of the size) with: the SDK's
``Checkpointer.save`` (world size 1: temporary directory, fsync of every file, manifest, atomic
rename, directory fsync), plain ``torch.save`` to a file (no fsync: how most scripts save),
``torch.save`` followed by ``fsync``, and ``dd if=/dev/zero bs=1M conv=fsync`` (the disk's streaming
write speed). ``sync`` runs before each write so that one write's dirty pages do not slow the next.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .profiles import Context
from .table import Cell, Table, Target

MB = 1 << 20


class _Blob:
    """A Stateful holding one tensor of ``nbytes``."""

    def __init__(self, nbytes: int) -> None:
        import torch

        self.tensor = torch.ones(nbytes // 4, dtype=torch.float32)

    def state_dict(self) -> Mapping[str, Any]:
        return {"weights": self.tensor}

    def load_state_dict(self, state_dict: Any, /) -> Any:
        self.tensor = state_dict["weights"]


def _timed(fn: Callable[[], None]) -> float:
    subprocess.run(["sync"], check=False)
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def measure(directory: Path, size_mb: int, reps: int) -> dict[str, list[float]]:
    """MB/s of each writer over ``reps`` interleaved repetitions."""
    import torch

    from worker_sdk.checkpoint import Checkpointer

    directory.mkdir(parents=True, exist_ok=True)
    blob = _Blob(size_mb * MB)
    ck = Checkpointer(directory / "atomic", rank=0, world_size=1, attempt_tag="bench", keep_last=1)
    plain, synced, raw = directory / "plain.pt", directory / "synced.pt", directory / "dd.bin"

    def save_plain() -> None:
        torch.save(blob.state_dict(), plain)

    def save_synced() -> None:
        with open(synced, "wb") as f:
            torch.save(blob.state_dict(), f)
            f.flush()
            os.fsync(f.fileno())

    def dd() -> None:
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={raw}", "bs=1M", f"count={size_mb}", "conv=fsync"],
            check=True,
            capture_output=True,
        )

    out: dict[str, list[float]] = {"atomic": [], "torch.save": [], "torch.save+fsync": [], "dd": []}
    for rep in range(reps):

        def atomic(step: int = rep) -> None:
            ck.save(step, [blob], None)

        out["atomic"].append(size_mb / _timed(atomic))
        out["torch.save"].append(size_mb / _timed(save_plain))
        out["torch.save+fsync"].append(size_mb / _timed(save_synced))
        out["dd"].append(size_mb / _timed(dd))
    shutil.rmtree(directory, ignore_errors=True)
    return out


def checkpoint(ctx: Context) -> Table:
    p = ctx.profile
    cols = ["rvsup atomic save", "torch.save", "torch.save + fsync", "dd conv=fsync"]
    keys = ["atomic", "torch.save", "torch.save+fsync", "dd"]
    t = Table(
        "checkpoint",
        f"8. Checkpoint write throughput (MB/s, {p.ckpt_reps} interleaved "
        f"repetitions) in {ctx.scratch}",
        cols,
    )
    for size in p.ckpt_sizes_mb:
        ctx.log(f"checkpoint {size} MB")
        m = measure(ctx.scratch / f"ckpt-{size}", size, p.ckpt_reps)
        cells = {c: Cell(m[k], " MB/s", digits=0) for c, k in zip(cols, keys, strict=True)}
        t.row(f"{size} MB", dict(cells))
        t.add_ratio(f"{size} MB: atomic / torch.save", cells[cols[0]], cells[cols[1]])
        t.add_ratio(f"{size} MB: atomic / torch.save + fsync", cells[cols[0]], cells[cols[2]])
        t.add_ratio(f"{size} MB: atomic / dd", cells[cols[0]], cells[cols[3]])
        if size >= 1000:
            a, b = cells[cols[0]].median, cells[cols[1]].median
            if a is not None and b is not None:
                t.targets.append(
                    Target("atomic save >= 0.9x torch.save at 1 GB", f"{a / b:.2f}x", a / b >= 0.9)
                )
    if not any(s >= 1000 for s in p.ckpt_sizes_mb):
        t.notes.append("the 1 GB target is measured by the full run only")
    return t
