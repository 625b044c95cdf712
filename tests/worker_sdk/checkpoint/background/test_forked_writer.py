"""A rank takes the snapshot writer forked beside it (``RVSUP_FORKED_WRITER``) only when it is
this process's living child at the other end of a socket; otherwise it starts its own. The
fork itself, under rvsup: tests/jobs/test_memory_tier.py."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from worker_sdk.checkpoint.background.async_save import AsyncSaver
from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.contract.protocol import ENV_FORKED_WRITER


@pytest.fixture
def saver(tmp_path: Path) -> AsyncSaver:
    return AsyncSaver(Checkpointer(tmp_path, rank=0, world_size=1, attempt_tag="a1", keep_last=2))


@pytest.fixture
def child() -> Iterator[subprocess.Popen[bytes]]:
    """A child of this process standing in for the forked writer."""
    proc = subprocess.Popen(["sleep", "60"])
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


def test_a_living_child_at_the_end_of_a_socket_is_taken_once(
    saver: AsyncSaver, child: subprocess.Popen[bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The writer is adopted, the variable removed (a second saver finds none), and abandoning
    it kills the child."""
    mine, theirs = socket.socketpair()
    monkeypatch.setenv(ENV_FORKED_WRITER, f"{mine.detach()} {child.pid}")
    assert saver.adopt_forked()
    assert ENV_FORKED_WRITER not in os.environ
    assert saver._proc is not None and saver._proc.pid == child.pid
    assert not saver.adopt_forked()
    saver.abandon()
    assert saver._proc is None
    theirs.close()
    with pytest.raises(ProcessLookupError):  # killed and reaped
        os.kill(child.pid, 0)


@pytest.mark.parametrize("value", ["", "7", "x 12", "3 4 5"])
def test_a_malformed_variable_is_ignored(
    saver: AsyncSaver, value: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A variable that is not "FD PID" is removed and ignored."""
    monkeypatch.setenv(ENV_FORKED_WRITER, value)
    assert not saver.adopt_forked()
    assert ENV_FORKED_WRITER not in os.environ
    assert saver._proc is None


def test_a_process_not_our_child_is_not_taken(
    saver: AsyncSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pid that is not this process's child (a variable inherited by a program the rank
    started) is not taken."""
    mine, theirs = socket.socketpair()
    with mine, theirs:
        monkeypatch.setenv(ENV_FORKED_WRITER, f"{mine.fileno()} 1")
        assert not saver.adopt_forked()
        assert saver._proc is None


def test_a_writer_that_died_is_not_taken(
    saver: AsyncSaver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A forked writer that ended (its imports failed) is not taken, and its socket is closed:
    the rank starts a writer of its own."""
    dead = subprocess.Popen(["true"])
    os.waitid(os.P_PID, dead.pid, os.WEXITED | os.WNOWAIT)  # ended, not yet reaped
    mine, theirs = socket.socketpair()
    fd = mine.detach()
    monkeypatch.setenv(ENV_FORKED_WRITER, f"{fd} {dead.pid}")
    assert not saver.adopt_forked()
    with pytest.raises(OSError, match="Bad file descriptor"):
        os.fstat(fd)
    theirs.close()
    dead.wait()


def test_a_writer_nothing_adopts_is_let_go_and_reaped(monkeypatch: pytest.MonkeyPatch) -> None:
    """A framework that saves its own checkpoints takes no snapshot: the writer forked beside
    the rank reads the end of its socket, ends, and is reaped (no idle process beside every
    rank, no zombie); the variable is removed."""
    from worker_sdk.checkpoint.background.async_save import release_forked_writer

    mine, theirs = socket.socketpair()
    # stands in for the writer: serves until its socket ends, as writer.serve does
    serve = "import socket, sys; socket.socket(fileno=int(sys.argv[1])).recv(1); sys.exit(7)"
    proc = subprocess.Popen(
        [sys.executable, "-c", serve, str(theirs.fileno())], pass_fds=(theirs.fileno(),)
    )
    theirs.close()
    try:
        monkeypatch.setenv(ENV_FORKED_WRITER, f"{mine.detach()} {proc.pid}")
        release_forked_writer()
        assert ENV_FORKED_WRITER not in os.environ
        with pytest.raises(ProcessLookupError):  # ended and reaped here
            os.kill(proc.pid, 0)
    finally:
        proc.kill()
        proc.wait()
