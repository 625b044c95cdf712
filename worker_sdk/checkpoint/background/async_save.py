"""Asynchronous saves, the rank's side: stage, hand to the writer process, hear how it ended.

``step()`` blocks only while :meth:`AsyncSaver.submit` runs: capture, copy into the staging arenas
(shared memory, reused by every save) and, with sharded state, DCP's planning (a collective, as in
a synchronous save). Writing, fsync and commit run in this rank's writer process
(:mod:`worker_sdk.checkpoint.background.writer`), so the interpreter's lock never slows training
down while they run.

At most one save is in flight: a save that finds the previous one still running first waits for
it (the staging arenas are the previous save's until it ends). While one is in flight the rank
checks for its outcome after every step (one ``poll`` on a socket: the only syscall ``step()``
makes between heartbeats), so a failure reaches the supervisor within one step.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from multiprocessing.reduction import send_handle
from pathlib import Path
from typing import Any, ClassVar, Final

from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.checkpoint.parallel import Stateful
from worker_sdk.contract.layout import committed_name
from worker_sdk.contract.protocol import ENV_FORKED_WRITER

from . import markers
from .arena import Arena
from .writer import SaveJob, mark_failed

__all__ = ["AsyncSaver", "Outcome", "release_forked_writer"]

_PART_WAIT_S: Final = 600.0  # rank 0's writer: how long to wait for the other ranks' parts
_RELEASE_WAIT_S: Final = 2.0  # for a forked writer let go to end
_SLACK: Final = 1.0625  # an arena is allocated this much larger than needed (state may grow)


@dataclass(frozen=True, slots=True)
class Outcome:
    """How one asynchronous save ended (as this rank saw it)."""

    step: int
    committed: bool  # rank 0: the checkpoint is committed
    failed: str | None  # why this rank's part (or, on rank 0, the commit) failed
    path: Path
    nbytes: int
    seconds: float  # from the start of the save until durable (or failed)
    blocked_s: float  # how long step() was blocked by it
    errno: int = 0  # a failure's OSError number (ENOSPC: a full tmpfs), 0 otherwise


@dataclass(slots=True)
class _InFlight:
    job: SaveJob
    began: float  # monotonic


class AsyncSaver:
    """This rank's asynchronous saves and their writer process."""

    #: The module run as the writer process (``python -m``; its ``main`` serves the rank).
    writer_module: ClassVar[str] = "worker_sdk.checkpoint.background.writer"

    def __init__(self, checkpointer: Checkpointer) -> None:
        self.ck = checkpointer
        self.in_flight: _InFlight | None = None
        self._arenas: dict[str, Arena] = {}
        self._proc: subprocess.Popen[bytes] | _ForkedWriter | None = None
        self._conn: Connection | None = None
        self.job_fields: dict[str, Any] = {}
        """Set on every job (several nodes: ``peers``, ``replica_key``, ``leader``)."""
        self.marker_key = markers.job_key()  # the writers' markers are signed with it
        self._listening = False
        self._endpoint: str | None = None
        self.before_growth: Callable[[str, int, dict[str, int]], None] | None = None
        """Called before a staging arena is allocated or grown, with its key, the bytes it
        adds and the size of every arena after; may raise (nothing is staged then: the memory
        tier's room check, :mod:`worker_sdk.checkpoint.memory.room`)."""

    def start(self) -> None:
        """Start the writer now, so that its start-up (importing torch) overlaps training."""
        self._ensure_writer()

    def adopt_forked(self) -> bool:
        """Take the writer forked beside this rank before its code ran, where there is one and
        it lives (``RVSUP_FORKED_WRITER``, set by the zygote's child: docs/memory-tier.md): no
        interpreter to start, no torch to import. Once per process: the variable is removed."""
        if self._proc is not None:
            return False
        forked = _forked_writer()
        if forked is None:
            return False
        self._proc, self._conn = forked[0], Connection(forked[1])
        return True

    # ------------------------------------------------------------------ the save
    def submit(self, step: int, objects: Sequence[Stateful], extra: Any) -> Outcome | None:
        """Stage the checkpoint of ``step`` and hand it to the writer; returns the outcome of
        the previous save if this call had to wait for it. Raises if staging failed (nothing is
        in flight then)."""
        began = time.monotonic()
        previous = self.wait() if self.in_flight is not None else None
        self._ensure_writer()
        job = self.ck.stage_async(step, objects, extra, self._arena_for, _PART_WAIT_S)
        job = dataclasses.replace(
            job,
            blocked_s=time.monotonic() - began,
            marker_key=self.marker_key,
            **self.job_fields,
        )
        assert self._conn is not None
        try:
            self._conn.send(("save", job))
        except OSError:
            self._writer_gone()
            raise
        self.in_flight = _InFlight(job, began)
        return previous

    def listen(self, directory: Path, key: bytes, address: str) -> None:
        """Several nodes: the writer receives the other nodes' parts into ``directory`` (its
        endpoint: :meth:`endpoint`). A writer that dies then is not replaced: the other nodes
        know this one's endpoint only."""
        self._ensure_writer()
        assert self._conn is not None
        self._conn.send(("listen", directory, key, address, self.ck.attempt_tag))
        self._listening = True

    def endpoint(self, timeout_s: float) -> str:
        """Where the writer receives (waiting for its start-up at most ``timeout_s``); raises
        OSError when it could not or did not answer."""
        if self._endpoint is None:
            if self._conn is None or not self._conn.poll(timeout_s):
                raise OSError(f"the snapshot writer did not start receiving in {timeout_s:g} s")
            try:
                kind, value = self._conn.recv()
            except (EOFError, ValueError) as e:
                raise OSError(f"the snapshot writer did not start receiving: {e!r}") from None
            if kind != "listening":
                raise OSError(f"the snapshot writer cannot receive: {value}")
            self._endpoint = value
        return self._endpoint

    def poll(self) -> Outcome | None:
        """The in-flight save's outcome if it has ended; never blocks."""
        if self.in_flight is None or self._conn is None:
            return None
        try:
            if not self._conn.poll(0):
                return None
        except OSError:
            return self._lost()
        return self._receive()

    def wait(self) -> Outcome | None:
        """Block until the in-flight save (if any) has ended; its outcome."""
        if self.in_flight is None or self._conn is None:
            return None
        return self._receive()

    def close(self) -> None:
        """Wait for the save in flight, stop the writer, free the arenas."""
        self.wait()
        if self._conn is not None:
            with contextlib.suppress(OSError):
                self._conn.send(("quit",))
            self._conn.close()
            self._conn = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
            self._proc = None
        for arena in self._arenas.values():
            arena.close()
        self._arenas.clear()

    def abandon(self) -> None:
        """Stop the writer now, without waiting for the save in flight (which is then never
        committed), and free the arenas."""
        self.in_flight = None
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
        self._writer_gone()

    # ------------------------------------------------------------------ internals
    def _receive(self) -> Outcome | None:
        assert self.in_flight is not None
        assert self._conn is not None
        try:
            answer = self._conn.recv()
        except (EOFError, OSError):
            return self._lost()
        flight, self.in_flight = self.in_flight, None
        job = flight.job
        final = self.ck.directory / committed_name(job.step)
        if answer[0] == "done":
            _, _, committed, nbytes, ended = answer
            return Outcome(
                job.step, committed, None, final, nbytes, ended - flight.began, job.blocked_s
            )
        return Outcome(
            job.step,
            False,
            str(answer[2]),
            final,
            0,
            time.monotonic() - flight.began,
            job.blocked_s,
            errno=int(answer[3]) if len(answer) > 3 else 0,
        )

    def _lost(self) -> Outcome:
        """The writer died with a save in flight: fail it, so rank 0 stops waiting for us."""
        assert self.in_flight is not None
        flight, self.in_flight = self.in_flight, None
        code = self._writer_gone()
        reason = f"the background writer process died ({_describe_exit(code)})"
        mark_failed(flight.job.tmp, self.ck.rank, reason)
        return Outcome(
            flight.job.step,
            False,
            reason,
            flight.job.tmp,
            0,
            time.monotonic() - flight.began,
            flight.job.blocked_s,
        )

    def _writer_gone(self) -> int | None:
        """Forget a dead (or unreachable) writer: the next save starts a new one."""
        code = None
        if self._proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                code = self._proc.wait(timeout=5)
            if code is None:
                self._proc.kill()
                code = self._proc.wait()
            self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        for arena in self._arenas.values():  # a new writer must be sent them again
            arena.close()
        self._arenas.clear()
        return code

    def _ensure_writer(self) -> None:
        if self._proc is not None and self._proc.poll() is None and self._conn is not None:
            return
        if self._proc is not None or self._conn is not None:
            self._writer_gone()
        if self._listening:
            raise OSError("the snapshot writer died, and the other nodes know its endpoint only")
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        package_root = str(Path(__file__).resolve().parents[3])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        env.setdefault("OMP_NUM_THREADS", "1")
        with theirs:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    self.writer_module,
                    str(theirs.fileno()),
                    str(os.getpid()),
                ],
                pass_fds=(theirs.fileno(),),
                env=env,
                stdin=subprocess.DEVNULL,
            )
        self._conn = Connection(mine.detach())

    def _arena_for(self, key: str, nbytes: int) -> Arena:
        """An arena of at least ``nbytes`` for ``key``, shared with the writer."""
        arena = self._arenas.get(key)
        if arena is not None and arena.size >= nbytes:
            return arena
        size = int(nbytes * _SLACK)
        if self.before_growth is not None:
            sizes = {k: a.size for k, a in self._arenas.items()} | {key: size}
            self.before_growth(key, size - (0 if arena is None else arena.size), sizes)
        fresh = Arena.create(f"{key}-{self.ck.rank}", size)
        assert self._proc is not None
        assert self._conn is not None
        self._conn.send(("arena", key, fresh.size))
        send_handle(self._conn, fresh.fd, self._proc.pid)
        if arena is not None:
            arena.close()
        self._arenas[key] = fresh
        return fresh


def release_forked_writer() -> None:
    """Let the writer forked beside this rank go, where nothing will adopt it (a framework
    that saves its own checkpoints): its socket closed, it ends, and is reaped here."""
    forked = _forked_writer()
    if forked is None:
        return
    writer, fd = forked
    os.close(fd)  # the writer reads the end of its socket and returns
    try:
        writer.wait(_RELEASE_WAIT_S)
    except subprocess.TimeoutExpired:
        writer.kill()
        writer.wait()


def _forked_writer() -> tuple[_ForkedWriter, int] | None:
    """The writer forked beside this rank and its socket (``RVSUP_FORKED_WRITER``, removed:
    once per process), where there is one, it lives and is this process's child."""
    raw = os.environ.pop(ENV_FORKED_WRITER, None)
    if raw is None:
        return None
    try:
        fd, pid = (int(word) for word in raw.split())
    except ValueError:
        return None
    writer = _ForkedWriter(pid)
    try:
        ours = stat.S_ISSOCK(os.fstat(fd).st_mode) and writer.poll() is None
    except (OSError, ChildProcessError):  # not our child, or not our socket
        return None
    if not ours:
        with contextlib.suppress(OSError):
            os.close(fd)
        return None
    return writer, fd


class _ForkedWriter:
    """A writer forked beside the rank (this process's child), seen as a ``Popen`` is."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        """The exit code once it has ended (reaped here); raises ChildProcessError when the
        pid is not this process's child."""
        if self.returncode is None:
            done, status = os.waitpid(self.pid, os.WNOHANG)
            if done:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            try:
                code = self.poll()
            except ChildProcessError:  # reaped elsewhere (a script's own os.wait())
                code = self.returncode = -1
            if code is not None:
                return code
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(f"writer {self.pid}", timeout or 0.0)
            time.sleep(0.005)

    def kill(self) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGKILL)


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        import signal

        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exit code {code}"
