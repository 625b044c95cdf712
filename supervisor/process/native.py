"""Native (C/C++) stacks of a hung group's ranks, taken by py-spy where it is installed.

faulthandler shows where each rank's Python is; a rank blocked inside gloo, NCCL or a C
extension shows as one Python line. ``py-spy dump --native`` adds the C/C++ frames under it. It
is optional: rvsup uses the ``py-spy`` beside its own interpreter or on its PATH
(``pip install py-spy``), and does nothing when there is none. py-spy attaches with ptrace, which
the kernel allows to a process's ancestors (the supervisor is the ranks' ancestor) unless
``kernel.yama.ptrace_scope`` is 2 or 3, or a container lacks ``CAP_SYS_PTRACE``: then the rank's
``.native`` file says why there is no stack. Every py-spy is killed and reaped at its deadline.

py-spy needs about a second a rank (it reads libtorch's symbols), which a restart would wait for
after the hang was declared: :class:`EarlyNative` takes the native stacks while the hang is still
being confirmed, once the ranks have been silent for all but :data:`LEAD_S` of their timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from supervisor.process import activity
from worker_sdk.contract import protocol as p

__all__ = [
    "LEAD_S",
    "NATIVE_WAIT_S",
    "RETAKE_AFTER_S",
    "STOPPED_HEADER",
    "EarlyNative",
    "collect_native",
    "collect_stopped",
    "dump_native",
    "dump_stopped",
    "faulthandler_text",
    "find_py_spy",
    "native_file",
]

NATIVE_WAIT_S: Final = 3.0  # the longest one rank's py-spy may take
LEAD_S: Final = 2.0  # native stacks are taken this long before the hang timeout runs out
RETAKE_AFTER_S: Final = 30.0  # after ranks went on despite early stacks, none again this long
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


def _py_spy(
    py_spy: str, pid: int, deadline: float, *, native: bool, stopped: bool = False
) -> str | _Failed | None:
    """One ``py-spy dump``: its stacks, how it failed, or None when it could not answer
    before ``deadline`` (killed and reaped then). ``stopped``: read without pausing the
    process (a stopped one stays stopped; Python frames only), as JSON, rendered as
    faulthandler prints stacks (:func:`faulthandler_text`)."""
    flags = ["--nonblocking", "--json"] if stopped else ["--native"] if native else []
    argv = [py_spy, "dump", *flags, "--pid", str(pid)]
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
    if done.returncode == 0:
        if stopped:
            text = faulthandler_text(done.stdout, pid)
            if text is not None:
                return text
        elif "\nThread " in done.stdout:
            return done.stdout
        return _Failed("py-spy answered without a thread's stack\n")
    # its message comes first; with RUST_BACKTRACE set, py-spy's own backtrace follows it
    error = (done.stderr or done.stdout).split("Stack backtrace:")[0].strip()[:_ERROR_HEAD]
    return _Failed(f"py-spy failed (exit {done.returncode}): {error}\n")


def faulthandler_text(dump_json: str, pid: int) -> str | None:
    """``py-spy dump --json``'s threads as :mod:`faulthandler` prints them (what the SDK's own
    dumps look like, and what :mod:`supervisor.rules.culprits` reads): the main thread (its OS
    thread id is the pid) as ``Current thread``, innermost frame first. None when it is not
    such JSON."""
    try:
        threads = json.loads(dump_json)
        blocks = []
        for thread in sorted(threads, key=lambda t: t.get("os_thread_id") != pid):
            head = "Current thread" if thread.get("os_thread_id") == pid else "Thread"
            lines = [f"{head} 0x{int(thread['thread_id']):016x} (most recent call first):"]
            lines += [
                f'  File "{frame["filename"]}", line {int(frame["line"])} in {frame["name"]}'
                for frame in thread["frames"]
            ]
            blocks.append("\n".join(lines))
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return "\n\n".join(blocks) + "\n" if blocks else None


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


STOPPED_HEADER: Final = (
    "(Python stacks read by py-spy while the rank stayed stopped: it was never continued, so "
    "it took no step after the hang was caught)\n"
)


def dump_stopped(py_spy: str, pid: int, stacks: Path, native_out: Path) -> bool:
    """A stopped rank's Python stacks into ``stacks``, read without continuing it, and into
    ``native_out`` why it has no native ones; True when py-spy answered with stacks. Blocking:
    run it in a thread from async code."""
    answer = _py_spy(py_spy, pid, time.monotonic() + NATIVE_WAIT_S, native=False, stopped=True)
    text = answer if isinstance(answer, str) else None
    with contextlib.suppress(OSError):
        if text is not None:
            stacks.write_text(STOPPED_HEADER + text)
        why = answer.text if isinstance(answer, _Failed) else _no_stacks(NATIVE_WAIT_S)
        native_out.write_text(
            "no native stacks: the rank was stopped by a signal, and py-spy reads native stacks "
            "only by pausing a running process (it was left stopped instead)\n"
            + ("" if text is not None else why)
        )
    return text is not None


async def collect_stopped(ranks: Mapping[int, int], directory: Path, py_spy: str) -> int:
    """Every stopped rank's (pid -> rank) Python stacks into ``directory``, none continued
    (:func:`dump_stopped`); how many py-spy answered for."""
    directory.mkdir(parents=True, exist_ok=True)
    results = await asyncio.gather(
        *(
            asyncio.to_thread(
                dump_stopped,
                py_spy,
                pid,
                directory / p.stacks_file(rank),
                directory / native_file(rank),
            )
            for pid, rank in ranks.items()
        )
    )
    return sum(results)


class EarlyNative:
    """Native stacks of a suspected hang, taken before it is declared (see the module docstring).

    :meth:`start` runs py-spy on every given rank that is not stopped (py-spy cannot read a
    stopped process: such a rank's native stacks are taken when the hang is declared), into a
    staging folder. If the hang is declared, :meth:`take` waits for those dumps and moves the
    ones with stacks into the diagnostics folder, each headed with how long before the
    declaration it was taken (a rank py-spy gave no stacks for is tried again then).
    If the ranks go on instead, :meth:`drop` discards them, and no early dump is taken again for
    :data:`RETAKE_AFTER_S`: a job that keeps coming close to its timeout is paused by py-spy
    (about a second) at most that often. Times are monotonic.
    """

    def __init__(self, py_spy: str, directory: Path) -> None:
        self._py_spy = py_spy
        self._staging = directory / ".native-early"
        self._task: asyncio.Future[list[bool]] | None = None
        self._ranks: tuple[int, ...] = ()
        self._started_t = 0.0
        self._dropped_t: float | None = None

    @property
    def pending(self) -> bool:
        """True between :meth:`start` and :meth:`take` or :meth:`drop`."""
        return self._task is not None

    def start(self, ranks: Mapping[int, int], now: float) -> None:
        """Take the native stacks of ``ranks`` (pid -> rank) now, unless under way, or dropped
        less than :data:`RETAKE_AFTER_S` ago."""
        if self._task is not None:
            return
        if self._dropped_t is not None and now - self._dropped_t < RETAKE_AFTER_S:
            return
        running = {pid: rank for pid, rank in ranks.items() if not activity.is_stopped(pid)}
        if not running:
            return
        self._staging.mkdir(parents=True, exist_ok=True)
        self._ranks = tuple(running.values())
        self._started_t = now
        self._task = asyncio.ensure_future(
            asyncio.gather(
                *(
                    asyncio.to_thread(
                        dump_native, self._py_spy, pid, self._staging / native_file(rank)
                    )
                    for pid, rank in running.items()
                )
            )
        )

    def drop(self, now: float) -> None:
        """The ranks went on: discard the dumps (once they are written, if under way)."""
        task, self._task = self._task, None
        if task is None:
            return
        self._dropped_t = now
        staging = self._staging
        task.add_done_callback(lambda _: shutil.rmtree(staging, ignore_errors=True))

    async def take(self, directory: Path, now: float) -> frozenset[int]:
        """The hang was declared at ``now``: the ranks whose early native stacks are now in
        ``directory``, after the dumps under way ended."""
        task, self._task = self._task, None
        if task is None:
            return frozenset()
        answered: list[bool] = []
        try:
            answered = await asyncio.shield(task)
        finally:
            good = [rank for rank, ok in zip(self._ranks, answered, strict=False) if ok]
            taken = frozenset(self._move(good, directory, now))
            shutil.rmtree(self._staging, ignore_errors=True)
        return taken

    def _move(self, ranks: list[int], directory: Path, now: float) -> list[int]:
        """Move the dumps of ``ranks`` into ``directory``; the ranks moved."""
        ahead = now - self._started_t
        moved = []
        for rank in ranks:
            source = self._staging / native_file(rank)
            try:
                text = source.read_text(errors="replace")
                (directory / native_file(rank)).write_text(
                    f"(native stacks taken {ahead:.1f} s before the hang was declared, while the"
                    f" rank was silent)\n{text}"
                )
            except OSError:
                continue
            moved.append(rank)
        return moved
