"""Which nodes of the allocation are lost, and how that was established: the evidence that tells
a node failure from a crash, read when an attempt ends in a failure.

Three sources, the first two at once and both bounded:

- the controller's node state (``sinfo``): down, failed, or not responding, which the controller
  notices only after ``SlurmdTimeout``;
- a TCP connection to each node's slurmd (the address and port ``scontrol show node`` gives),
  made from here with a :data:`CONNECT_TIMEOUT_S` bound: refused (no slurmd listens: the node
  crashed and came back bare, or slurmd died), unreachable, or unanswered (the machine is gone or
  cut off) is a lost node. A slurmd that accepts the connection is alive; it logs the probe as
  a connection that sent nothing;
- only for nodes whose address Slurm does not give: a probe step, ``srun --overlap ... true``
  on those nodes, whose launch fails on a node whose slurmd is dead or unreachable, which can
  take up to Slurm's ``MessageTimeout`` (10 s by default), bounded by :data:`PROBE_TIMEOUT_S`.

A failed Slurm command adds nothing (the answer is then what the other sources said); nothing
here raises for one.
"""

from __future__ import annotations

import errno
import os
import selectors
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from typing import Final

from supervisor.slurm.commands import Allocation, SlurmError, run_once
from supervisor.slurm.text import (
    PROBE_FAILED_NODE,
    parse_lost_nodes,
    parse_node_addresses,
    parse_probe_failures,
    parse_slurmd_port,
)

__all__ = ["CONNECT_TIMEOUT_S", "PROBE_TIMEOUT_S", "lost_nodes", "slurmd_unreachable"]

#: How long a connection to a node's slurmd may take before the node counts as gone.
CONNECT_TIMEOUT_S: Final = 2.0
#: How long the probe step may take (a dead slurmd answers at once, an unreachable node after
#: the cluster's MessageTimeout, 10 s by default).
PROBE_TIMEOUT_S: Final = 20.0
#: How long the probe still listens after srun named the first failed node.
PROBE_GRACE_S: Final = 1.0
_DEFAULT_SLURMD_PORT: Final = 6818


def lost_nodes(alloc: Allocation) -> dict[str, str]:
    """The nodes of ``alloc`` that are lost, in allocation order, each with how that was
    established (``"slurmd at 10.0.0.2:6818 refused the connection"``); empty when every node
    answers."""
    found = {node: f"Slurm marks it {state}" for node, state in _marked(alloc.nodes).items()}
    addresses = _addresses(alloc.nodes)
    for node, how in slurmd_unreachable(addresses, CONNECT_TIMEOUT_S).items():
        found.setdefault(node, how)
    unknown = [node for node in alloc.nodes if node not in addresses and node not in found]
    if unknown:
        for node in _probe_failures(alloc, unknown, PROBE_TIMEOUT_S):
            found.setdefault(node, "Slurm could not start a task there")
    return {node: found[node] for node in alloc.nodes if node in found}


def slurmd_unreachable(
    addresses: Mapping[str, tuple[str, int]], timeout_s: float
) -> dict[str, str]:
    """The nodes whose slurmd does not accept a TCP connection within ``timeout_s`` (all tried
    at once), each with what happened."""
    pending: dict[socket.socket, tuple[str, str]] = {}
    found: dict[str, str] = {}
    with selectors.DefaultSelector() as selector:
        for node, (addr, port) in addresses.items():
            where = f"slurmd at {addr}:{port}"
            try:
                info = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
            except OSError as e:
                found[node] = f"{where}: its address does not resolve ({e})"
                continue
            sock = socket.socket(info[0], info[1], info[2])
            sock.setblocking(False)
            code = sock.connect_ex(info[4])
            if code in (0, errno.EINPROGRESS):
                pending[sock] = (node, where)
                selector.register(sock, selectors.EVENT_WRITE)
            else:
                found[node] = _refusal(where, code)
                sock.close()
        end = time.monotonic() + timeout_s
        while pending and (left := end - time.monotonic()) > 0:
            for key, _ in selector.select(left):
                ready = key.fileobj
                assert isinstance(ready, socket.socket)
                sock = ready
                node, where = pending.pop(sock)
                selector.unregister(sock)
                code = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                if code != 0:
                    found[node] = _refusal(where, code)
                sock.close()
        for sock, (node, where) in pending.items():
            found[node] = f"{where} did not answer within {timeout_s:g} s"
            sock.close()
    return found


def _refusal(where: str, code: int) -> str:
    if code == errno.ECONNREFUSED:
        return f"{where} refused the connection (no slurmd listens)"
    return f"{where}: {os.strerror(code)}"


def _marked(nodes: Sequence[str]) -> dict[str, str]:
    try:
        out = run_once(["sinfo", "-h", "-N", "-n", ",".join(nodes), "-o", "%N %T"], timeout_s=10.0)
    except SlurmError:
        return {}
    return parse_lost_nodes(out)


def _addresses(nodes: Sequence[str]) -> dict[str, tuple[str, int]]:
    """Where each node's slurmd listens, as far as Slurm says."""
    try:
        config = run_once(["scontrol", "show", "config"], timeout_s=10.0)
        shown = run_once(["scontrol", "show", "node", "-o", ",".join(nodes)], timeout_s=10.0)
    except SlurmError:
        return {}
    port = parse_slurmd_port(config) or _DEFAULT_SLURMD_PORT
    return {n: a for n, a in parse_node_addresses(shown, port).items() if n in nodes}


def _probe_failures(alloc: Allocation, nodes: Sequence[str], timeout_s: float) -> list[str]:
    """Nodes srun names as failed when it starts ``true`` on each of ``nodes``.

    srun reports every failed launch at once and then lingers (KillWait and message time-outs)
    before it exits: it is killed PROBE_GRACE_S after it first named a node, or at ``timeout_s``.
    """
    count = len(nodes)
    argv = [
        "srun",
        f"--jobid={alloc.job_id}",
        f"--nodes={count}",
        f"--ntasks={count}",
        f"--nodelist={','.join(nodes)}",
        "--ntasks-per-node=1",
        "--overlap",
        "--kill-on-bad-exit=0",
        "--mpi=none",
        "--job-name=rvsup-probe",
        "--",
        "true",
    ]
    try:
        proc = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
        )
    except OSError:
        return []
    assert proc.stderr is not None
    text = ""
    try:
        with selectors.DefaultSelector() as selector:
            selector.register(proc.stderr, selectors.EVENT_READ)
            end = time.monotonic() + timeout_s
            while (left := end - time.monotonic()) > 0:
                if not selector.select(left):
                    continue
                chunk = os.read(proc.stderr.fileno(), 65536)
                if not chunk:
                    break  # srun ended
                text += chunk.decode(errors="replace")
                if PROBE_FAILED_NODE.search(text):
                    end = min(end, time.monotonic() + PROBE_GRACE_S)
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
    return parse_probe_failures(text, nodes)
