"""Figure 8: checkpoint write throughput on one disk: rvsup's atomic save vs torch.save vs dd.

Each repetition writes the same payload (one float32 tensor of the size) with: the SDK's
``Checkpointer.save`` (world size 1: temporary directory, fsync of every file, manifest, atomic
rename, directory fsync, the previous checkpoint deleted afterwards), plain ``torch.save`` over one
file (no fsync: how most scripts save), ``torch.save`` + ``fsync`` over one file, ``torch.save`` +
``fsync`` to a new file whose predecessor is deleted afterwards (the file life of any save that
keeps the last checkpoint until the next one is complete, as the atomic save must), and
``dd if=/dev/zero bs=1M conv=fsync`` (the disk's streaming write speed). ``sync`` runs before each
write so that one write's dirty pages do not slow the next, and each repetition starts with the
next writer in turn: a writer that allocates new page cache right after another one freed some
is faster than one that comes after a pause (on a VM that hands freed memory back to its host,
first touches cost), so a fixed order would favour whoever follows a deletion.
"""

from __future__ import annotations

import functools
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
KEYS = ["atomic", "torch.save", "torch.save+fsync", "torch.save+fsync new", "dd"]


class _Blob:
    """A Stateful holding one tensor of ``nbytes``."""

    def __init__(self, nbytes: int) -> None:
        import torch

        self.tensor = torch.ones(nbytes // 4, dtype=torch.float32)

    def state_dict(self) -> Mapping[str, Any]:
        return {"weights": self.tensor}

    def load_state_dict(self, state_dict: Any, /) -> Any:
        self.tensor = state_dict["weights"]


def _timed(fn: Callable[[], object]) -> float:
    subprocess.run(["sync"], check=False)
    t0 = time.monotonic()
    fn()
    return time.monotonic() - t0


def measure(directory: Path, size_mb: int, reps: int) -> dict[str, list[float]]:
    """MB/s of each writer over ``reps`` interleaved repetitions."""
    import torch

    from worker_sdk.checkpoint.checkpointer import Checkpointer

    directory.mkdir(parents=True, exist_ok=True)
    blob = _Blob(size_mb * MB)
    ck = Checkpointer(directory / "atomic", rank=0, world_size=1, attempt_tag="bench", keep_last=1)
    plain, synced, raw = directory / "plain.pt", directory / "synced.pt", directory / "dd.bin"

    def save_plain() -> None:
        torch.save(blob.state_dict(), plain)

    def save_synced(path: Path = synced) -> None:
        with open(path, "wb") as f:
            torch.save(blob.state_dict(), f)
            f.flush()
            os.fsync(f.fileno())

    def save_synced_new(step: int) -> None:
        save_synced(directory / f"new-{step}.pt")
        (directory / f"new-{step - 1}.pt").unlink(missing_ok=True)

    def dd() -> None:
        subprocess.run(
            ["dd", "if=/dev/zero", f"of={raw}", "bs=1M", f"count={size_mb}", "conv=fsync"],
            check=True,
            capture_output=True,
        )

    out: dict[str, list[float]] = {key: [] for key in KEYS}
    for rep in range(reps):
        writers: dict[str, Callable[[], object]] = {
            "atomic": functools.partial(ck.save, rep, [blob], None),
            "torch.save": save_plain,
            "torch.save+fsync": save_synced,
            "torch.save+fsync new": functools.partial(save_synced_new, rep),
            "dd": dd,
        }
        order = KEYS[rep % len(KEYS) :] + KEYS[: rep % len(KEYS)]
        for key in order:
            out[key].append(size_mb / _timed(writers[key]))
    shutil.rmtree(directory, ignore_errors=True)
    return out


def checkpoint(ctx: Context) -> Table:
    p = ctx.profile
    cols = [
        "rvsup atomic save",
        "torch.save",
        "torch.save + fsync",
        "torch.save + fsync, new file",
        "dd conv=fsync",
    ]
    t = Table(
        "checkpoint",
        f"8. Checkpoint write throughput (MB/s, {p.ckpt_reps} interleaved "
        f"repetitions) in {ctx.scratch}",
        cols,
    )
    for size in p.ckpt_sizes_mb:
        ctx.log(f"checkpoint {size} MB")
        m = measure(ctx.scratch / f"ckpt-{size}", size, p.ckpt_reps)
        cells = {c: Cell(m[k], " MB/s", digits=0) for c, k in zip(cols, KEYS, strict=True)}
        t.row(f"{size} MB", dict(cells))
        t.add_ratio(f"{size} MB: atomic / torch.save", cells[cols[0]], cells[cols[1]])
        t.add_ratio(f"{size} MB: atomic / torch.save + fsync", cells[cols[0]], cells[cols[2]])
        t.add_ratio(
            f"{size} MB: atomic / torch.save + fsync, new file", cells[cols[0]], cells[cols[3]]
        )
        t.add_ratio(f"{size} MB: atomic / dd", cells[cols[0]], cells[cols[4]])
        if size >= 1000:
            a, b = cells[cols[0]].median, cells[cols[1]].median
            if a is not None and b is not None:
                t.targets.append(
                    Target("atomic save >= 0.9x torch.save at 1 GB", f"{a / b:.2f}x", a / b >= 0.9)
                )
    t.notes.append(
        "the SDK saves synchronously (every rank writes, all agree, rank 0 commits): there is no "
        "asynchronous save whose training stall could be compared with a plain copy"
    )
    if not any(s >= 1000 for s in p.ckpt_sizes_mb):
        t.notes.append("the 1 GB target is measured by the full run only")
    return t
