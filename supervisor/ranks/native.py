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
from collections.abc import Mapping
from pathlib import Path
from typing import Final

__all__ = ["NATIVE_WAIT_S", "collect_native", "dump_native", "find_py_spy", "native_file"]

NATIVE_WAIT_S: Final = 3.0  # the longest one rank's py-spy may take
_ERROR_TAIL: Final = 600  # characters of py-spy's error output kept


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
    answered with stacks. Blocking: run it in a thread from async code."""
    argv = [py_spy, "dump", "--native", "--pid", str(pid)]
    ok = False
    try:
        done = subprocess.run(  # kills and reaps py-spy at the deadline
            argv, capture_output=True, text=True, errors="replace", timeout=timeout_s, check=False
        )
    except subprocess.TimeoutExpired:
        text = f"py-spy gave no stacks within {timeout_s:g} s\n"
    except OSError as e:
        text = f"py-spy could not run: {e}\n"
    else:
        ok = done.returncode == 0
        if ok:
            text = done.stdout
        else:
            error = (done.stderr or done.stdout).strip()[-_ERROR_TAIL:]
            text = f"py-spy failed (exit {done.returncode}): {error}\n"
    with contextlib.suppress(OSError):
        out.write_text(text)
    return ok


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
