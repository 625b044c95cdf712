"""A real second user of this node, for the attack tests (root only): made with ``useradd`` and
removed with ``userdel`` after the test.

Its code runs in a child forked from the test process that drops to the user's uid and gid
(``setgroups([])``, ``setgid``, ``setuid``) before doing anything: the kernel checks every file
and socket access against that user, exactly as for a program the user would start. Forking
instead of starting a new interpreter keeps what the test process imported: the user needs to
read neither the repository nor its virtualenv (CI keeps those in a folder only root reads).
What the child returns comes back as JSON through a pipe. (A module the child would import only
then must be imported before: the user cannot read the interpreter's own library either, where
it lives in root's home. ``encodings.idna``, which a connection to a host name loads, is.)

A place both users reach: :func:`shared_base` makes a folder under ``/tmp`` that every user
may traverse (root's, 0755), removed after the test.
"""

from __future__ import annotations

import contextlib
import encodings.idna  # noqa: F401 - loaded here: the other user's child cannot read it
import json
import os
import pwd
import resource
import shutil
import signal
import subprocess
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

__all__ = ["Background", "User", "another_user", "run_as", "shared_base", "start_as"]


@dataclass(frozen=True, slots=True)
class User:
    name: str
    uid: int
    gid: int


@contextlib.contextmanager
def another_user(tag: str) -> Iterator[User]:
    """A new user (its own group, no home, no shell), removed afterwards; skips the test where
    users cannot be made (not root, no useradd)."""
    if os.geteuid() != 0:
        pytest.skip("making another user needs root")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip("useradd/userdel are not installed")
    name = f"rv{tag}{os.getpid() % 100_000}"[:32]
    subprocess.run(
        ["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name],
        check=True,
        capture_output=True,
    )
    try:
        entry = pwd.getpwnam(name)
        yield User(name, entry.pw_uid, entry.pw_gid)
    finally:
        subprocess.run(["userdel", "--force", name], check=False, capture_output=True)


@contextlib.contextmanager
def shared_base() -> Iterator[Path]:
    """A folder every user may traverse (root's, 0755, under /tmp), removed afterwards."""
    base = Path(tempfile.mkdtemp(prefix="rvsup-shared-", dir="/tmp"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _become(user: User) -> None:
    os.setgroups([])
    os.setgid(user.gid)
    os.setuid(user.uid)
    _soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def _child(user: User, write_fd: int, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
    """In the forked child: become ``user``, run ``fn``, write its JSON result; never returns."""
    code = 0
    try:
        _become(user)
        out: dict[str, Any] = {"ok": True, "value": fn(*args)}
    except BaseException as exc:  # noqa: BLE001 - the test reads what went wrong
        out = {"ok": False, "error": "".join(traceback.format_exception(exc))}
        code = 1
    try:
        with os.fdopen(write_fd, "w") as f:
            json.dump(out, f, default=str)
    finally:
        os._exit(code)


def run_as(user: User, fn: Callable[..., Any], *args: Any, timeout: float = 120) -> Any:
    """``fn(*args)`` run as ``user`` (in a forked child), its JSON result; raises with the
    child's traceback when it raised, AssertionError when it ran past ``timeout``."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        _child(user, write_fd, fn, args)
    os.close(write_fd)
    try:
        with os.fdopen(read_fd) as f:
            deadline = time.monotonic() + timeout
            while not _readable(f.fileno(), deadline - time.monotonic()):
                if time.monotonic() > deadline:
                    raise AssertionError(f"{fn.__name__} as {user.name} ran past {timeout} s")
            text = f.read()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    out = json.loads(text) if text else {"ok": False, "error": "the child wrote nothing"}
    if not out["ok"]:
        raise RuntimeError(f"{fn.__name__} as {user.name} failed:\n{out['error']}")
    return out["value"]


def _readable(fd: int, timeout: float) -> bool:
    import select

    readable, _, _ = select.select([fd], [], [], max(0.0, timeout))
    return bool(readable)


@dataclass
class Background:
    """A child running as another user until :meth:`stop` (SIGTERM, then its JSON result)."""

    pid: int
    read_fd: int
    user: User
    ended: bool = False

    def stop(self, timeout: float = 30) -> Any:
        """Ask it to end (SIGTERM: its function returns), its result."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, signal.SIGTERM)
        self.ended = True  # the descriptor is closed and the child reaped below, whatever comes
        try:
            with os.fdopen(self.read_fd) as f:
                if not _readable(f.fileno(), timeout):
                    raise AssertionError(f"the background child of {self.user.name} did not end")
                text = f.read()
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        out = json.loads(text) if text else {"ok": False, "error": "the child wrote nothing"}
        if not out["ok"]:
            raise RuntimeError(f"the background child of {self.user.name} failed:\n{out['error']}")
        return out["value"]


class Stopping:
    """Set by SIGTERM in a :func:`start_as` child: its loop checks it and returns."""

    requested = False


def _on_term(_signo: int, _frame: Any) -> None:
    Stopping.requested = True


@contextlib.contextmanager
def start_as(user: User, fn: Callable[..., Any], *args: Any) -> Iterator[Background]:
    """``fn(*args)`` running as ``user`` for the block (it loops until ``Stopping.requested``);
    always stopped and reaped on the way out."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read_fd)
        signal.signal(signal.SIGTERM, _on_term)
        _child(user, write_fd, fn, args)
    os.close(write_fd)
    child = Background(pid, read_fd, user)
    try:
        yield child
    finally:
        if not child.ended:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(read_fd)
