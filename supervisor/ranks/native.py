"""Native (C/C++) stacks of a hung group's ranks, taken by py-spy where it is installed.

faulthandler shows where each rank's Python is; a rank blocked inside gloo, NCCL or a C
extension shows as one Python line. ``py-spy dump --native`` adds the C/C++ frames under it. It
is optional: rvsup uses the ``py-spy`` beside its own interpreter or on its PATH
(``pip install py-spy``), and does nothing when there is none. py-spy attaches with ptrace, which
the kernel allows to a process's ancestors (the supervisor is the ranks' ancestor) unless
``kernel.yama.ptrace_scope`` is 2 or 3, or a container lacks ``CAP_SYS_PTRACE``: then the rank's
``.native`` file says why there is no stack. Every py-spy is killed and reaped at its deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

__all__ = ["NATIVE_WAIT_S", "collect_native", "dump_native", "find_py_spy", "native_file"]

NATIVE_WAIT_S: Final = 3.0  # the longest one rank's py-spy may take
_ERROR_HEAD: Final = 600  # characters of py-spy's error message kept


def native_file(rank: int) -> str:
    """``rank-00001.native``: rank ``rank``'s native stacks in the diagnostics folder."""
    return f"rank-{rank:05d}.native"


def find_py_spy(path: str | None = None) -> str | None:
    """The py-spy to use: beside this interpreter (the same virtual environment), else on
    ``path`` (default: PATH); None when there is none."""
    beside = Path(sys.executable).parent / "py-spy"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which("py-spy", path=path)


def dump_native(py_spy: str, pid: int, out: Path, timeout_s: float = NATIVE_WAIT_S) -> bool:
    """Write ``pid``'s native stacks to ``out`` (or why there are none); True when py-spy
    answered with stacks. Blocking: run it in a thread from async code.

    py-spy fails a whole ``--native`` dump when one thread's native and Python frames do not
    line up, as when a thread is between two frames at the instant it is read: such a failure
    is tried once more, then py-spy's Python-only stacks are written under the reason native
    ones are missing. All tries share one deadline of ``timeout_s``."""
    deadline = time.monotonic() + timeout_s
    first = _py_spy(py_spy, pid, deadline, native=True)
    answer = first
    if isinstance(first, _Failed):
        answer = _py_spy(py_spy, pid, deadline, native=True)
        if isinstance(answer, _Failed):
            answer = _py_spy(py_spy, pid, deadline, native=False)
            if isinstance(answer, str):
                answer = f"no native stacks: {first.text}Python stacks only:\n{answer}"
    if isinstance(answer, str):
        text = answer
    else:
        text = first.text if isinstance(first, _Failed) else _no_stacks(timeout_s)
    with contextlib.suppress(OSError):
        out.write_text(text)
    return isinstance(answer, str)


@dataclass(frozen=True, slots=True)
class _Failed:
    """py-spy ran and failed: ``text`` says how, in its own words (ending in a newline)."""

    text: str


def _no_stacks(timeout_s: float) -> str:
    return f"py-spy gave no stacks within {timeout_s:g} s\n"


def _py_spy(py_spy: str, pid: int, deadline: float, *, native: bool) -> str | _Failed | None:
    """One ``py-spy dump``: its stacks, how it failed, or None when it could not answer
    before ``deadline`` (killed and reaped then)."""
    argv = [py_spy, "dump", *(["--native"] if native else []), "--pid", str(pid)]
    left = deadline - time.monotonic()
    if left <= 0:
        return None
    try:
        done = subprocess.run(  # kills and reaps py-spy at the deadline
            argv, capture_output=True, text=True, errors="replace", timeout=left, check=False
        )
    except subprocess.TimeoutExpired:
        return None
    except OSError as e:
        return _Failed(f"py-spy could not run: {e}\n")
    if done.returncode == 0 and "\nThread " in done.stdout:
        return done.stdout
    if done.returncode == 0:
        return _Failed("py-spy answered without a thread's stack\n")
    # its message comes first; with RUST_BACKTRACE set, py-spy's own backtrace follows it
    error = (done.stderr or done.stdout).split("Stack backtrace:")[0].strip()[:_ERROR_HEAD]
    return _Failed(f"py-spy failed (exit {done.returncode}): {error}\n")


async def collect_native(ranks: Mapping[int, int], directory: Path, py_spy: str) -> int:
    """Every rank's (pid -> rank) native stacks into ``directory``, side by side; returns how
    many ranks py-spy answered for."""
    results = await asyncio.gather(
        *(
            asyncio.to_thread(dump_native, py_spy, pid, directory / native_file(rank))
            for pid, rank in ranks.items()
        )
    )
    return sum(results)
