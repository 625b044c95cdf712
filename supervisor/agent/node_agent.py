"""A node's agent: the daemon's part on every node of a multi-node attempt.

Started by the node wrapper (``worker_sdk.spawn.node_group --agent``) on every node of the
attempt, in the node's group beside torchrun, and ended with it. It connects to the daemon's
rank channel as the ranks would (``RVSUP_ENDPOINT``, the job's secret, CurveZMQ across nodes),
and the node's ranks connect to it (an IPC socket in a 0700 directory the wrapper made,
``RVSUP_AGENT_SOCKET``). It

- relays its ranks' messages both ways (:mod:`.relay`): heartbeats go up together, one
  ``NODE_BEAT`` per heartbeat interval carrying every rank's newest (and the exact step of each
  rank whose step slot moved), and the rest at once;
- beats even with nothing to carry: the daemon takes an agent that falls silent for
  :func:`supervisor.ranks.agents.silence_limit` as its node lost (a node failure, never a
  silent gap); every beat says the node's health (:mod:`.node_health`: the OOM kills of its
  processes, the memory available), and a rank's exit report is followed by a beat at once, so
  that a rank the kernel's OOM killer killed is known as such before the daemon judges;
- answers the daemon's ``NODE_ASK``: it looks at the ranks named there (their process state,
  CPU time, wait channels, Python stacks: :mod:`supervisor.process.evidence_window`) over the
  window asked for and sends a ``NODE_LOOK`` for each, so the busy-or-stuck judgment of a
  silence sees every node's ranks; for a declared hang it collects their stacks as the daemon
  does for its own (:func:`supervisor.process.diagnostics.collect_stacks`) and sends them, the
  native ones too when asked (where py-spy is installed).

Single threaded, two ZeroMQ sockets; it never imports torch. It acts only on the processes of
its own user, and only when the daemon asks, with the job's key, in a message numbered past
the last one it took (a replayed request is dropped).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import time
from pathlib import Path
from types import FrameType

import zmq

from supervisor.agent import wire
from supervisor.agent.node_health import NodeHealth, node_counter
from supervisor.agent.relay import Relay
from supervisor.process import activity, diagnostics, evidence_window, native
from supervisor.rules.stuck import RankEvidence
from worker_sdk.contract import curve
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

__all__ = ["NodeAgent", "main"]

_POLL_MAX_S = 0.2  # the longest a wait for the daemon lasts between two looks at the clock
_BATCH = 1024  # the ranks' frames taken per wake-up


class NodeAgent:
    """One node's agent (see the module docstring)."""

    def __init__(
        self,
        endpoint: str,
        secret: bytes,
        *,
        attempt: int,
        node_id: int,
        node: str,
        diag_dir: Path,
        interval_s: float,
        ranks_socket: str | None = None,
    ) -> None:
        self._ranks_socket = ranks_socket
        self._key = secret
        self.attempt = attempt
        self.node_id = node_id
        self.node = node
        self.diag_dir = diag_dir
        self.interval_s = interval_s
        self.pid = os.getpid()
        self._seq = 0
        self._asked_seq = 0  # the daemon's newest request taken: an older number is a replay
        self._window: tuple[wire.Ask, evidence_window.Window, float] | None = None
        self.stopping = False
        self._ctx = zmq.Context(io_threads=1)
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 1000)  # the last looks go out before it ends
        sock.setsockopt(zmq.SNDHWM, 256)
        sock.setsockopt(zmq.MAXMSGSIZE, p.MAX_MESSAGE_BYTES)
        if endpoint.startswith("tcp://"):
            curve.secure_client(sock, curve.keys(secret, curve.RANKS))
        sock.connect(endpoint)
        self._sock = sock
        self._relay = Relay(secret, attempt)
        self.health = NodeHealth(node_counter())
        self._ranks: zmq.Socket[bytes] | None = None
        if ranks_socket is not None:  # the node's ranks talk to the daemon through this agent
            ranks = self._ctx.socket(zmq.ROUTER)
            ranks.setsockopt(zmq.LINGER, 0)
            ranks.setsockopt(zmq.MAXMSGSIZE, p.MAX_MESSAGE_BYTES)
            ranks.setsockopt(zmq.RCVHWM, 10_000)
            ranks.bind(f"ipc://{ranks_socket}")
            os.chmod(ranks_socket, 0o600)
            self._ranks = ranks
        self._poller = zmq.Poller()
        self._poller.register(sock, zmq.POLLIN)
        if self._ranks is not None:
            self._poller.register(self._ranks, zmq.POLLIN)

    def run(self) -> None:
        """Beat and answer until :attr:`stopping` is set (SIGTERM)."""
        next_beat = time.monotonic()
        while not self.stopping:
            now = time.monotonic()
            if now >= next_beat:
                self._beat()
                next_beat = now + self.interval_s
            if self._window is not None and now >= self._window[2]:
                self._answer_window(now)
            due = next_beat if self._window is None else min(next_beat, self._window[2])
            wait_s = min(max(due - now, 0.0), _POLL_MAX_S)
            ready = dict(self._poller.poll(int(wait_s * 1000)))
            if self._ranks is not None and self._ranks in ready:
                self._from_ranks(self._ranks)
                if self._relay.exit_passed:  # right behind it: the node's OOM kills
                    next_beat = time.monotonic()
            if self._sock in ready:
                self._on_frame(self._sock.recv(zmq.NOBLOCK))

    def close(self) -> None:
        self._beat()  # nothing a rank said is left behind
        if self._ranks is not None:
            self._ranks.close()
        if self._ranks_socket is not None:  # the wrapper's folder (gone with it where it can)
            with contextlib.suppress(OSError):
                os.unlink(self._ranks_socket)
                os.rmdir(os.path.dirname(self._ranks_socket))
        self._sock.close()
        self._ctx.term()

    def _from_ranks(self, ranks: zmq.Socket[bytes]) -> None:
        """Everything the node's ranks have queued: passed on, or held for the next beat."""
        now = time.monotonic()
        for _ in range(_BATCH):
            try:
                frames = ranks.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            if len(frames) == 2:
                for frame in self._relay.from_rank(frames[0], frames[1], now):
                    self._send(frame)

    def _send(self, frame: bytes) -> None:
        # the daemon gone or far behind drops it: its silence check judges, not us
        with contextlib.suppress(zmq.Again):
            self._sock.send(frame, zmq.NOBLOCK)

    def _beat(self) -> None:
        slots = diagnostics.read_steps(self.diag_dir, self._relay.ranks)
        health = self.health.read()
        kills = -1 if health.oom_kills is None else health.oom_kills
        available = -1 if health.memory_available is None else health.memory_available
        for beats, steps in self._relay.beats(time.monotonic(), slots):
            body = m.NodeBeat(self.node, beats, steps, kills, health.oom_host_wide, available)
            self._send_body(body)

    def _send_body(self, body: m.Body) -> None:
        self._seq += 1
        rank = p.agent_rank(self.node_id)
        frame = m.encode(
            self._key, body, rank=rank, attempt=self.attempt, pid=self.pid, seq=self._seq
        )
        self._send(frame)

    def _on_frame(self, frame: bytes) -> None:
        try:
            msg = p.decode(self._key, frame)
        except p.BadMessageError:
            return
        if msg.attempt != self.attempt:
            return
        if msg.rank >= 0:  # the daemon's answer to one of the node's ranks
            to = self._relay.to_rank(msg)
            if to is not None and self._ranks is not None:
                with contextlib.suppress(zmq.ZMQError):
                    self._ranks.send_multipart([to, frame], zmq.NOBLOCK)
            return
        if msg.rank != p.agent_rank(self.node_id) or msg.seq <= self._asked_seq:
            return
        self._asked_seq = msg.seq
        body = m.read(msg)
        ask = wire.read_ask(body) if isinstance(body, m.NodeAsk) else None
        if ask is None:
            return
        pids = {pid: rank for rank, pid in ask.ranks.items() if _ours(pid)}
        if ask.dump:
            self._answer_dump(ask, pids)
        else:
            window = evidence_window.open_window(self.diag_dir, pids, time.monotonic())
            self._window = (ask, window, window.t0 + ask.window_s)

    def _answer_window(self, now: float) -> None:
        assert self._window is not None
        ask, window, _ = self._window
        self._window = None
        for look in evidence_window.close(self.diag_dir, window, now):
            self._send_look(wire.Look(ask.request, look.evidence, False, look.stacks))

    def _answer_dump(self, ask: wire.Ask, pids: dict[int, int]) -> None:
        stopped = {rank for pid, rank in pids.items() if activity.is_stopped(pid)}
        sizes = {rank: diagnostics.stacks_size(self.diag_dir, rank) for rank in pids.values()}
        py_spy = native.find_py_spy() if ask.native else None
        asyncio.run(diagnostics.collect_stacks(pids, self.diag_dir, py_spy))
        for rank in pids.values():
            stacks = evidence_window.stacks_since(self.diag_dir, rank, sizes[rank])
            native_stacks = _read(self.diag_dir / native.native_file(rank)) if py_spy else ""
            evidence = RankEvidence(rank, state="T" if rank in stopped else None)
            look = wire.Look(ask.request, evidence, rank in stopped, stacks, native_stacks)
            self._send_look(look)

    def _send_look(self, look: wire.Look) -> None:
        self._send_body(wire.look_body(look))


def _read(path: Path) -> str:
    """A file's text ("" when it cannot be read)."""
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def _ours(pid: int) -> bool:
    """Whether ``pid`` is a process of this agent's user (the only ones it looks at)."""
    try:
        return os.stat(f"/proc/{pid}").st_uid == os.getuid()
    except OSError:
        return False


def main() -> None:
    """Run this node's agent from the attempt's environment until SIGTERM."""
    env = os.environ
    try:
        secret = p.read_secret(env[p.ENV_SECRET_FILE])
        agent = NodeAgent(
            env[p.ENV_ENDPOINT],
            secret,
            attempt=int(env[p.ENV_ATTEMPT]),
            node_id=int(env.get("SLURM_NODEID", "0")),
            node=p.node_name(env.get("SLURMD_NODENAME"), socket.gethostname()),
            diag_dir=Path(env[p.ENV_DIAGNOSTICS_DIR]),
            interval_s=float(env.get(p.ENV_HEARTBEAT_INTERVAL, "1.0")),
            ranks_socket=env.get(p.ENV_AGENT_SOCKET) or None,
        )
    except (KeyError, ValueError, OSError) as exc:
        print(f"rvsup: the node agent cannot start: {exc!r}", file=sys.stderr)
        sys.exit(1)

    def stop(_signum: int, _frame: FrameType | None) -> None:
        agent.stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a terminal's ^C goes to the group: srun's
    try:
        agent.run()
    finally:
        agent.close()
