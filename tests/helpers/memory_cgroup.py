"""A memory cgroup with a limit, for the tests that need one (root, a writable memory controller,
cgroup v1 or v2; otherwise the test is skipped): the kernel's OOM killer and the memory tier's
room check both answer to it."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.harness import rvsup_env
from worker_sdk.checkpoint.memory.room import memory_groups

__all__ = ["limited", "own_memory_cgroup", "start_in"]


def own_memory_cgroup() -> Path | None:
    """This process's memory cgroup directory (v1's memory controller, else v2), or None."""
    for directory, v2 in memory_groups():
        base = Path(directory)
        if (base / ("memory.max" if v2 else "memory.limit_in_bytes")).exists():
            return base
    return None


@contextlib.contextmanager
def limited(limit_bytes: int, name: str) -> Iterator[Path]:
    """A child memory cgroup of this process's, limited to ``limit_bytes`` (removed after)."""
    parent = own_memory_cgroup()
    if parent is None or not os.access(parent, os.W_OK):
        pytest.skip("no writable memory cgroup on this machine")
    child = parent / f"rvsup-{name}-{os.getpid()}"
    try:
        child.mkdir()
        limit = str(limit_bytes)
        if (child / "memory.limit_in_bytes").exists():
            (child / "memory.limit_in_bytes").write_text(limit)
        else:
            (child / "memory.max").write_text(limit)
    except OSError as exc:
        with contextlib.suppress(OSError):
            child.rmdir()
        pytest.skip(f"cannot create a memory-limited cgroup: {exc}")
    try:
        yield child
    finally:
        with contextlib.suppress(OSError):
            child.rmdir()


def start_in(group: Path, job: Path, *, timeout: float) -> subprocess.CompletedProcess[str]:
    """``rvsup start JOB`` to completion, started inside ``group`` (every process of the job
    is in it: the daemon joins it before it execs)."""
    script = f'echo $$ > "{group}/cgroup.procs" && exec "$0" -m supervisor start "$1"'
    return subprocess.run(
        ["sh", "-c", script, sys.executable, str(job)],
        env=rvsup_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
