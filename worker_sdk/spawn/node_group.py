"""One node's part of a multi-node attempt, in a cgroup of its own, ended with the attempt.

``python -m worker_sdk.spawn.node_group TERM_TIMEOUT_S [--agent] CMD [ARGS...]`` is what srun runs on
every node of an attempt's step, in front of torchrun. It makes a group ``rvsup-node-PID`` under its own
cgroup v2 group (Slurm's step group where Slurm uses cgroup v2, slurmd's otherwise) and starts
``CMD`` there: the wrapper places the child into the group (the rule of :mod:`.cgroup`) while
the child waits, and the child checks it is there and arms the parent-death signal before it
execs, so everything torchrun and the ranks start is a member, whatever session or parent it
ends up with.
It passes signals on to ``CMD``, and once ``CMD`` has ended it ends what is left in the group
(SIGTERM, ``TERM_TIMEOUT_S``, ``cgroup.kill``), removes the group and ends like ``CMD``.
torchrun's node rank in the attempt's static rendezvous is this node's ``SLURM_NODEID``
(``PET_NODE_RANK``, the variable torchrun reads for ``--node-rank``).
With ``--agent`` it first starts the node's agent (``python -m supervisor.agent``, the daemon's
part on this node) the same way, beside ``CMD``: it ends with the group, or with the wrapper.
The ranks then talk to the daemon through the agent: ``CMD`` gets as ``RVSUP_ENDPOINT`` an IPC
socket the agent binds in a directory made for it here (``mkdtemp``: this user's alone, 0700,
on the node's own temporary file system), removed at the end.

A wrapper killed with SIGKILL (srun's own hard stop) cannot do that: the next attempt's wrapper
on the node first ends what is left in the groups of wrappers that are gone. Where no group can
be made, it execs ``CMD`` as it is (Slurm's own tracking of the step is all there is).

Where the node's group has no memory controller (cgroup v1 hosts), the wrapper first places
itself in a cgroup v1 memory group of the same name under its own, so that everything it starts
is in it: the node's agent counts the kernel's OOM kills of the node's processes there
(``supervisor.agent``), as the daemon does for its own node. Empty ones left by wrappers that
are gone are removed first.
Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import NoReturn

from worker_sdk.contract import protocol as p
from worker_sdk.contract.private_paths import verify_private_dir

from .cgroup import (
    Group,
    join_memory_group,
    leave_memory_group,
    own_group_dir,
    place,
    stale_groups,
    wait_placed,
)
from .exit_report import FORWARDED, end_like
from .pdeathsig import die_with_parent

__all__ = ["main"]

GROUP_PREFIX = p.NODE_GROUP_PREFIX
AGENT_FLAG = "--agent"
_AGENT = "supervisor.agent"  # the module run as the node's agent (rvsup's, never torch)
_SOCKET_PARENT_MAX = 60  # sun_path holds 107 bytes: parent, "/rvsup-agent-XXXXXXXX/ranks.sock"


def make_group() -> Path | None:
    """This wrapper's group, made (after ending the stale ones beside it); None: none can be."""
    own = own_group_dir()
    if own is None:
        return None
    for group in stale_groups(Path(own), GROUP_PREFIX):
        group.end()
    path = Path(own) / f"{GROUP_PREFIX}{os.getpid()}"
    try:
        path.mkdir()
    except OSError:
        return None
    return path


def main(argv: list[str]) -> NoReturn:
    """Run ``CMD`` in the node's group of the attempt (see the module docstring)."""
    agent = len(argv) > 1 and argv[1] == AGENT_FLAG
    if agent:
        argv = [argv[0], *argv[2:]]
    if len(argv) < 2:
        usage = (
            "usage: python -m worker_sdk.spawn.node_group TERM_TIMEOUT_S [--agent] CMD [ARGS...]"
        )
        print(usage, file=sys.stderr)
        sys.exit(2)
    term_timeout_s, command = float(argv[0]), argv[1:]
    node_id = os.environ.get("SLURM_NODEID")
    if node_id is not None:
        os.environ.setdefault("PET_NODE_RANK", node_id)
    path = make_group()
    memory = None if path and (path / "memory.events").exists() else join_memory_group(GROUP_PREFIX)
    agent_pid, sockets = None, None
    if agent:
        sockets = tempfile.mkdtemp(prefix="rvsup-agent-", dir=_socket_parent())
        verify_private_dir(Path(sockets))  # made just now, exclusively: ours, 0700
        ranks_socket = os.path.join(sockets, "ranks.sock")
        env = {**os.environ, p.ENV_AGENT_SOCKET: ranks_socket}
        agent_pid = start(path, [sys.executable, "-m", _AGENT], env)
        os.environ[p.ENV_ENDPOINT] = f"ipc://{ranks_socket}"
    if path is None:
        os.execvp(command[0], command)  # noqa: S606 -- the attempt's torchrun
    pid = start(path, command)
    for sig in FORWARDED:
        signal.signal(sig, lambda number, _frame: _pass_on(pid, number))
    _, status = os.waitpid(pid, 0)
    for sig in FORWARDED:
        signal.signal(sig, signal.SIG_IGN)  # the teardown below must run to its end
    end(Group(path), term_timeout_s)
    if agent_pid is not None:
        with contextlib.suppress(ChildProcessError):
            os.waitpid(agent_pid, 0)
    if sockets is not None:
        shutil.rmtree(sockets, ignore_errors=True)
    if isinstance(memory, tuple):
        leave_memory_group(*memory)
    end_like(status)


def _socket_parent() -> str | None:
    """Where the agent's socket directory goes: the temporary directory, unless its path is
    too long for a socket's name (then /tmp)."""
    parent = tempfile.gettempdir()
    return parent if len(parent) <= _SOCKET_PARENT_MAX else "/tmp"


def start(path: Path | None, command: list[str], env: dict[str, str] | None = None) -> int:
    """Start ``command`` in the group at ``path`` (see the module docstring): placed there
    before it execs, and ended by the kernel if this wrapper dies. Without a group, it only
    gets the parent-death signal."""
    parent = os.getpid()
    held, release = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(release)
        try:
            wrong = None if path is None else wait_placed(held, str(path))
            if wrong is not None:
                print(f"rvsup: cannot start {command[0]!r}: {wrong}", file=sys.stderr)
                os._exit(126)
            die_with_parent(parent=parent)
            if env is None:
                os.execvp(command[0], command)  # noqa: S606 -- the attempt's torchrun
            os.execvpe(command[0], command, env)  # noqa: S606 -- the node's agent
        except OSError as exc:
            print(f"rvsup: cannot start {command[0]!r} in {path}: {exc}", file=sys.stderr)
        os._exit(127)
    os.close(held)
    try:
        if path is not None:
            place(pid, str(path))
    except OSError as exc:  # the child says where it is, and ends
        print(f"rvsup: cannot place {command[0]!r} in {path}: {exc}", file=sys.stderr)
    finally:
        os.close(release)
    return pid


def _pass_on(pid: int, number: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, number)


def end(group: Group, term_timeout_s: float) -> None:
    """SIGTERM (and SIGCONT) to every member, then, after ``term_timeout_s`` at most, SIGKILL to
    all; the group removed."""
    for sig in (signal.SIGTERM, signal.SIGCONT):
        for member in group.pids():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(member, sig)
    group.wait_empty(term_timeout_s)
    group.end()


if __name__ == "__main__":
    main(sys.argv[1:])
