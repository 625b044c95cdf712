"""The bootstrap's exit reporter (multi-node attempts) on real processes: it reports how the rank
ended over the authenticated channel, passes signals on, and ends the way the rank ended."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psutil
import pytest
import zmq

from supervisor.ranks.reports import exit_from_report
from tests.helpers.harness import reaped
from worker_sdk.contract import protocol as p

pytestmark = [pytest.mark.process, pytest.mark.timeout(60)]

REPO = Path(__file__).resolve().parents[3]
RANK = 2
ATTEMPT = 3


@dataclass
class Router:
    sock: zmq.Socket[bytes]
    secret: bytes
    env: dict[str, str]

    def report(self) -> p.Message:
        """The next message, authenticated (at most 10 s away)."""
        assert self.sock.poll(10_000), "no report within 10 s"
        _identity, frame = self.sock.recv_multipart()
        return p.decode(self.secret, frame)


@pytest.fixture
def router(tmp_path: Path) -> Iterator[Router]:
    """A ROUTER the reporter connects to, and the environment a reported rank gets."""
    secret = p.new_secret()
    secret_file = tmp_path / "secret"
    p.write_secret(str(secret_file), secret)
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    endpoint = f"ipc://{tmp_path}/hb.sock"
    sock.bind(endpoint)
    env = dict(
        os.environ,
        PYTHONPATH=str(REPO),
        RANK=str(RANK),
        **{
            p.ENV_REPORT_EXIT: "1",
            p.ENV_ENDPOINT: endpoint,
            p.ENV_SECRET_FILE: str(secret_file),
            p.ENV_ATTEMPT: str(ATTEMPT),
        },
    )
    try:
        yield Router(sock, secret, env)
    finally:
        sock.close()
        ctx.term()


@contextlib.contextmanager
def bootstrapped(argv: list[str], env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m worker_sdk.spawn.bootstrap ARGV``; killed (with whatever it started) and reaped."""
    proc = subprocess.Popen([sys.executable, "-m", "worker_sdk.spawn.bootstrap", *argv], env=env)
    with reaped(proc):
        yield proc


def the_rank(proc: subprocess.Popen[bytes]) -> psutil.Process:
    """The rank process (the waiter's child), once it runs the command."""
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        children = psutil.Process(proc.pid).children()
        if children and "sleep" in " ".join(children[0].cmdline()):
            return children[0]
        time.sleep(0.02)
    raise AssertionError("the rank never started")


def test_a_sigkilled_rank_is_reported_and_the_waiter_dies_the_same_way(router: Router) -> None:
    """SIGKILL of the rank: one authenticated RANK_EXIT naming the rank, its pid, SIGKILL and
    this host; the waiter then ends killed by SIGKILL too, as torchrun would have seen it."""
    env = router.env
    with bootstrapped(["sleep", "30"], env) as proc:
        rank = the_rank(proc)
        rank.kill()
        msg = router.report()
        assert proc.wait(timeout=10) == -signal.SIGKILL
    assert (msg.kind, msg.rank, msg.attempt) == (p.Kind.RANK_EXIT, RANK, ATTEMPT)
    ended = exit_from_report(msg)
    assert ended is not None
    assert (ended.pid, ended.exit_code, ended.signal) == (rank.pid, None, signal.SIGKILL)
    assert ended.node == os.uname().nodename


def test_sigterm_to_the_waiter_reaches_the_rank(router: Router) -> None:
    """torchrun's SIGTERM goes to the waiter, which passes it on: the rank dies of SIGTERM, the
    report says so, and the waiter ends by SIGTERM."""
    env = router.env
    with bootstrapped(["sleep", "30"], env) as proc:
        rank = the_rank(proc)
        proc.send_signal(signal.SIGTERM)
        msg = router.report()
        assert proc.wait(timeout=10) == -signal.SIGTERM
    ended = exit_from_report(msg)
    assert ended is not None and (ended.pid, ended.signal) == (rank.pid, signal.SIGTERM)


def test_an_exit_code_is_reported_and_passed_on(router: Router) -> None:
    """A rank that exits with code 3 is reported with code 3 and the waiter exits with 3."""
    env = router.env
    with bootstrapped(["sh", "-c", "exit 3"], env) as proc:
        msg = router.report()
        assert proc.wait(timeout=10) == 3
    ended = exit_from_report(msg)
    assert ended is not None and (ended.exit_code, ended.signal) == (3, None)


def test_without_the_switch_the_bootstrap_execs(router: Router) -> None:
    """Single-node attempts: no waiter, the bootstrap becomes the command (same pid)."""
    env = router.env
    del env[p.ENV_REPORT_EXIT]
    with bootstrapped(["sleep", "30"], env) as proc:
        deadline = time.monotonic() + 20
        while "sleep" not in " ".join(psutil.Process(proc.pid).cmdline()):
            assert time.monotonic() < deadline, "never exec'd"
            time.sleep(0.02)
        assert psutil.Process(proc.pid).children() == []
