"""Multi-node attempts: the rank's parent tells the supervisor how the rank ended.

The supervisor watches the ranks of its own node through pidfds; a rank on another node is a
process it cannot see, and when one dies there the first it would hear of it is its peers failing
with a broken connection, which then look like the culprits. So on multi-node attempts the
bootstrap forks: the child becomes the rank, and the parent stays behind as a small waiter that

- takes the signals torchrun (or srun, or a user) sends it and passes each on to the rank;
- reaps the rank and sends ``RANK_EXIT`` (pid, exit code or signal, host, and the rank's last
  finished step, read from its step slot) over the job's
  authenticated channel, as soon as the rank has ended;
- then ends the way the rank ended (the same exit code, or killed by the same signal), so
  torchrun sees what it would have seen without it.

No signal handlers: the signals are blocked and taken with ``sigwaitinfo``. The rank gets the
signal mask it would have had and ``PR_SET_PDEATHSIG`` (it dies with the waiter, which dies with
torchrun). The waiter imports ZeroMQ but never torch.
"""

from __future__ import annotations

import contextlib
import os
import resource
import signal
import socket
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final, NoReturn

from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

if TYPE_CHECKING:
    from worker_sdk.runtime.channel import Channel

#: Passed on to the rank. SIGCHLD is waited for as well; SIGKILL and SIGSTOP cannot be caught
#: (a SIGKILLed waiter takes the rank with it through the parent-death signal).
FORWARDED: Final = (
    signal.SIGTERM,
    signal.SIGINT,
    signal.SIGHUP,
    signal.SIGQUIT,
    signal.SIGUSR1,
    signal.SIGUSR2,
    signal.SIGCONT,
    signal.SIGALRM,
)
_LINGER_S: Final = 1.0  # how long the report may take to leave before the waiter ends anyway


@dataclass(frozen=True, slots=True)
class ReportTo:
    """Where and as whom to report: read from the rank's environment."""

    endpoint: str
    secret_file: str
    rank: int
    attempt: int
    step_slot: str | None = None  # the rank's step slot file (protocol.step_slot_file)

    @staticmethod
    def from_env(env: Mapping[str, str]) -> ReportTo | None:
        """The reporting settings, or None when this rank is not to be reported on."""
        if env.get(p.ENV_REPORT_EXIT) != "1":
            return None
        try:
            return ReportTo(
                endpoint=env[p.ENV_ENDPOINT],
                secret_file=env[p.ENV_SECRET_FILE],
                rank=int(env["RANK"]),
                attempt=int(env[p.ENV_ATTEMPT]),
                step_slot=os.path.join(
                    env[p.ENV_DIAGNOSTICS_DIR], p.step_slot_file(int(env["RANK"]))
                )
                if env.get(p.ENV_DIAGNOSTICS_DIR)
                else None,
            )
        except (KeyError, ValueError):
            return None


def run_and_report(
    argv: Sequence[str], to: ReportTo, arm_pdeathsig: Callable[[], bool]
) -> NoReturn:
    """Fork; the child execs ``argv``; this process waits, reports and ends like the child."""
    waited = {*FORWARDED, signal.SIGCHLD}
    old_mask = signal.pthread_sigmask(signal.SIG_BLOCK, waited)
    me = os.getpid()
    child = os.fork()
    if child == 0:
        _become_rank(argv, old_mask, me, arm_pdeathsig)
    channel = connect(to)
    status = _wait_passing_signals(child, waited)
    send_report(channel, to, child, status)
    end_like(status)


def report(to: ReportTo, pid: int, status: int) -> None:
    """Tell the supervisor that rank process ``pid`` ended with wait status ``status``."""
    send_report(connect(to), to, pid, status)


def send_report(channel: Channel | None, to: ReportTo, pid: int, status: int) -> None:
    """:func:`report` on a channel :func:`connect` opened while the rank ran."""
    if channel is None:
        return
    code = os.waitstatus_to_exitcode(status)
    last_step = None if to.step_slot is None else p.read_step_slot(to.step_slot)
    channel.send(
        m.RankExit(
            pid,
            code if code >= 0 else None,
            -code if code < 0 else None,
            p.node_name(os.environ.get("SLURMD_NODENAME"), socket.gethostname()),
            last_step,
        )
    )
    channel.close(linger_s=_LINGER_S)


def _become_rank(
    argv: Sequence[str],
    old_mask: set[int | signal.Signals],
    parent: int,
    arm_pdeathsig: Callable[[], bool],
) -> NoReturn:
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, old_mask)
        arm_pdeathsig()
        if os.getppid() != parent:  # the waiter died before the signal was armed
            os._exit(1)
        os.execvp(argv[0], list(argv))  # noqa: S606 - the command is the user's job
    except OSError as exc:
        print(f"rvsup: cannot run {argv[0]!r}: {exc.strerror}", file=sys.stderr, flush=True)
    os._exit(127)


def connect(to: ReportTo) -> Channel | None:
    """A channel to the supervisor, or None (then the rank just runs, unreported). Opened
    while the rank runs, so that its end is reported at once (not after importing ZeroMQ)."""
    try:
        from worker_sdk.runtime.channel import Channel  # only the waiter needs ZeroMQ

        secret = p.read_secret(to.secret_file)
        return Channel(to.endpoint, secret, rank=to.rank, attempt=to.attempt)
    except Exception as exc:  # noqa: BLE001 -- best effort: the rank must run
        print(f"rvsup: rank {to.rank} exit will not be reported: {exc}", file=sys.stderr)
        return None


def _wait_passing_signals(child: int, waited: set[signal.Signals]) -> int:
    """Pass every waited-for signal on to ``child`` until it ends; its wait status."""
    while True:
        info = signal.sigwaitinfo(waited)
        if info.si_signo == signal.SIGCHLD:
            pid, status = os.waitpid(child, os.WNOHANG)
            if pid == child:
                return status
            continue
        with contextlib.suppress(ProcessLookupError):  # it ended: SIGCHLD is pending
            os.kill(child, info.si_signo)


def end_like(status: int) -> NoReturn:
    """Exit with the child's code, or die of the child's signal (without a core dump)."""
    code = os.waitstatus_to_exitcode(status)
    if code >= 0:
        os._exit(code)
    sig = -code
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    with contextlib.suppress(OSError, ValueError):  # SIGKILL has no action to restore
        signal.signal(sig, signal.SIG_DFL)  # e.g. SIGPIPE, which Python ignores
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {sig})
    os.kill(os.getpid(), sig)
    os._exit(128 + sig)  # a signal whose default action is not to end the process
