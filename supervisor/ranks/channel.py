"""The supervisor's end of the rank channel: a ZeroMQ ROUTER (the ranks' messages, and on
several nodes their node agents'), feeding the per-rank table (:mod:`.rank_table`).

Anything that fails authentication, decoding, the attempt check or the replay check is
dropped and counted by reason (shown by ``rvsup status``); nothing received is unpickled and no
message can raise out of :meth:`HeartbeatEndpoint.receive`.
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import tempfile
import time
from pathlib import Path
from typing import Protocol

import zmq

from worker_sdk.contract import curve
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

__all__ = [
    "Channel",
    "HeartbeatEndpoint",
    "socket_dir",
]

_IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux, keep a margin
_BATCH = 256  # messages taken per wake-up of the receive loop
PACE_S = 0.01  # the shortest time between two batches


def socket_dir(run_dir: Path) -> Path:
    """A 0700 directory for the job's IPC sockets: ``<run_dir>/ctl``, or a private temporary one
    when that path is too long for a Unix socket name."""
    preferred = run_dir / "ctl"
    if len(str(preferred / "control.sock")) <= _IPC_PATH_MAX:
        preferred.mkdir(mode=0o700, exist_ok=True)
        os.chmod(preferred, 0o700)
        return preferred
    return Path(tempfile.mkdtemp(prefix="rvsup-"))


class Channel(Protocol):
    """What the supervisor's core needs of the rank channel (a fake in unit tests)."""

    endpoint: str
    accepted: int
    dropped: collections.Counter[str]

    def new_attempt(self, attempt: int) -> None:
        """Accept messages of ``attempt`` only, from now on."""
        ...

    async def receive_batch(self) -> list[tuple[bytes, p.Message]]:
        """The next accepted messages (at least one), oldest first."""
        ...

    def send(self, identity: bytes, body: m.Body, *, rank: int) -> None:
        """Send to one rank; never blocks."""
        ...


class HeartbeatEndpoint:
    """The bound ROUTER socket; ``endpoint`` is what ranks connect to.

    Over TCP (a job on several nodes) it listens on this node's address as the other nodes
    reach it, never on every interface, and it is a CurveZMQ server that admits only the job's
    own processes (:mod:`worker_sdk.contract.curve`): a stranger's connection never completes
    its handshake, and is dropped at once or within the handshake's bound."""

    def __init__(self, secret: bytes, *, sock_dir: Path, tcp: bool) -> None:
        self._key = secret
        self.attempt = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        self.accepted = 0
        self._last_seq: dict[tuple[int, int], int] = {}
        self._sent = 0  # the sequence number of the last message sent (an agent drops replays)
        self._last_batch_t = float("-inf")
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
        self._listener: curve.Listener | None = None
        sock = self._ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.MAXMSGSIZE, 64 * p.MAX_MESSAGE_BYTES)
        sock.setsockopt(zmq.SNDHWM, 1000)
        sock.setsockopt(zmq.RCVHWM, 100_000)
        if tcp:
            keys = curve.keys(secret, curve.RANKS)
            self._listener = curve.Listener(self._ctx, keys)
            curve.secure_server(sock, keys)
            host = _routable_host()
            sock.bind(f"tcp://{host}:0")
            bound = sock.getsockopt(zmq.LAST_ENDPOINT)
            assert isinstance(bound, bytes)
            port = bound.decode().rsplit(":", 1)[1]
            self.endpoint = f"tcp://{host}:{port}"
        else:
            path = sock_dir / "hb.sock"
            sock.bind(f"ipc://{path}")
            os.chmod(path, 0o600)
            self.endpoint = f"ipc://{path}"
        self._sock = sock
        self._fd = int(sock.getsockopt(zmq.FD))

    def new_attempt(self, attempt: int) -> None:
        self.attempt = attempt
        self._last_seq.clear()

    async def receive(self) -> tuple[bytes, p.Message]:
        """Wait for the next acceptable message (:meth:`receive_batch` of one)."""
        return (await self.receive_batch(1))[0]

    async def receive_batch(self, limit: int = _BATCH) -> list[tuple[bytes, p.Message]]:
        """Wait for the next acceptable message, then take up to ``limit`` - 1 more that are
        already queued: one wake-up of the event loop for a burst of heartbeats. Batches are
        at least :data:`PACE_S` apart, and the event loop does not watch the socket in between:
        a steady stream of heartbeats (thousands of ranks, or of agents, each once a second)
        wakes the daemon a hundred times a second, not once per message; a message after a
        quiet moment is taken at once. What fails a check is dropped and counted; every
        ``_BATCH`` dropped frames, and when frames are left, the event loop gets a turn, so
        that a flood of garbage cannot starve the daemon's other tasks (the hang check, the
        control socket, process exits)."""
        wait_s = self._last_batch_t + PACE_S - time.monotonic()
        if wait_s > 0:
            await asyncio.sleep(wait_s)
        dropped = 0
        while True:
            await self._readable()
            batch: list[tuple[bytes, p.Message]] = []
            while len(batch) < limit:
                try:
                    frames = self._sock.recv_multipart(zmq.NOBLOCK, copy=True)
                except zmq.Again:
                    break
                checked = self._check(frames)
                if checked is not None:
                    batch.append(checked)
                    continue
                dropped += 1
                if dropped % _BATCH == 0:
                    await asyncio.sleep(0)
            if batch:
                self._last_batch_t = time.monotonic()
                if len(batch) == limit:
                    await asyncio.sleep(0)  # more may be queued: let the other tasks run first
                return batch

    async def _readable(self) -> None:
        """Return once a frame is queued. ZeroMQ's descriptor only signals that its state may
        have changed: the events are read first (which also resets it), and the loop watches
        the descriptor only while nothing is queued."""
        while not int(self._sock.getsockopt(zmq.EVENTS)) & zmq.POLLIN:
            loop = asyncio.get_running_loop()
            changed: asyncio.Future[None] = loop.create_future()
            loop.add_reader(self._fd, _settle, changed)
            try:
                await changed
            finally:
                loop.remove_reader(self._fd)

    def _check(self, frames: list[bytes]) -> tuple[bytes, p.Message] | None:
        if len(frames) != 2:
            self.dropped["malformed"] += 1
            return None
        identity, frame = frames
        try:
            msg = p.decode(self._key, frame)
        except p.BadMessageError as exc:
            self.dropped[exc.reason] += 1
            return None
        if msg.kind >= p.Kind.SYNC_REQUEST:
            self.dropped["wrong direction"] += 1
            return None
        if msg.attempt != self.attempt:
            # a rank's client reporting after its attempt was torn down is late, not hostile:
            # ignored, not counted among the dropped
            if not (msg.kind == p.Kind.RANK_EXIT and msg.attempt < self.attempt):
                self.dropped["other attempt"] += 1
            return None
        sender = (msg.rank, msg.pid)
        if msg.seq <= self._last_seq.get(sender, 0):
            self.dropped["replayed"] += 1
            return None
        self._last_seq[sender] = msg.seq
        self.accepted += 1
        return identity, msg

    def send(self, identity: bytes, body: m.Body, *, rank: int) -> None:
        """Send to one rank; never blocks (a full or vanished peer drops the message). Every
        message is numbered, one more than the last."""
        self._sent += 1
        frame = m.encode(
            self._key, body, rank=rank, attempt=self.attempt, pid=os.getpid(), seq=self._sent
        )
        try:
            self._sock.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.ZMQError:
            self.dropped["send failed"] += 1

    def close(self) -> None:
        self._sock.close(linger=0)
        if self._listener is not None:
            self._listener.stop()
        self._ctx.term()


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _routable_host() -> str:
    """This node's address as the other nodes of the allocation reach it (its host name's);
    raises OSError when the host name resolves to none (a listener on every interface would
    be reachable from networks the job does not use)."""
    name = socket.gethostname()
    try:
        return socket.gethostbyname(name)
    except OSError as e:
        raise OSError(
            f"this node's host name {name!r} does not resolve to an address for the ranks on "
            f"the other nodes to reach: {e}"
        ) from None
