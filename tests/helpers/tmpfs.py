"""A small tmpfs mounted for one test: a disk that fills up for real (ENOSPC)."""

from __future__ import annotations

import contextlib
import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["tmpfs"]


@contextlib.contextmanager
def tmpfs(where: Path, size: str, *, mode: str | None = None) -> Iterator[Path]:
    """A tmpfs of ``size`` (mount's ``size=``: ``64k``, ``64m``) mounted on the new directory
    ``where`` (with ``mode``: its root's permissions), unmounted at the end; the test is skipped
    without root or where it cannot be mounted."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where.mkdir()
    options = f"size={size}" + (f",mode={mode}" if mode is not None else "")
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {done.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)
