"""The supervisor's end of the rank channel: a ZeroMQ ROUTER and the per-rank table it feeds.

Every accepted message is stamped with the supervisor's monotonic clock: ranks' clocks are never
compared. Anything that fails authentication, decoding, the attempt check or the replay check is
dropped and counted by reason (shown by ``rvsup status``); nothing received is unpickled and no
message can raise out of :meth:`HeartbeatEndpoint.receive`.
"""

from __future__ import annotations

import asyncio
import collections
import os
import socket
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import zmq
import zmq.asyncio

from supervisor.rules.hangs import Silence, StepTimes
from supervisor.rules.observation import RankExit, RankReport
from worker_sdk.contract import curve
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

__all__ = [
    "Channel",
    "HeartbeatEndpoint",
    "RankState",
    "RankTable",
    "exit_from_report",
    "report_from_message",
    "socket_dir",
]

_IPC_PATH_MAX = 100  # sun_path is 108 bytes on Linux, keep a margin
_STEP_TIMES_KEPT = 256
_BATCH = 256  # messages taken per wake-up of the receive loop


def socket_dir(run_dir: Path) -> Path:
    """A 0700 directory for the job's IPC sockets: ``<run_dir>/ctl``, or a private temporary one
    when that path is too long for a Unix socket name."""
    preferred = run_dir / "ctl"
    if len(str(preferred / "control.sock")) <= _IPC_PATH_MAX:
        preferred.mkdir(mode=0o700, exist_ok=True)
        os.chmod(preferred, 0o700)
        return preferred
    return Path(tempfile.mkdtemp(prefix="rvsup-"))


@dataclass(slots=True)
class RankState:
    """What the supervisor knows about one rank of the current attempt."""

    rank: int
    pid: int
    host: str
    identity: bytes
    hello_t: float
    resume_step: int = 0
    last_step: int = -1  # last finished step reported
    last_progress_t: float = 0.0  # when last_step last grew (or hello)
    last_seen_t: float = 0.0
    first_step_t: float | None = None
    phase: str | None = None
    total_steps: int | None = None  # what the script said it runs to (resume(total_steps=))
    saving_since: float | None = None
    saving_step: int = -1  # the step of the save that began at saving_since
    step_times: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=_STEP_TIMES_KEPT)
    )

    def to_status(self, now: float) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "host": self.host,
            "last_step": self.last_step,
            "heartbeat_age_s": round(now - self.last_seen_t, 3),
            "progress_age_s": round(now - self.last_progress_t, 3),
            "phase": self.phase,
            "total_steps": self.total_steps,
        }


class RankTable:
    """Folds accepted messages into per-rank state. Owned by the supervisor."""

    def __init__(self) -> None:
        self.ranks: dict[int, RankState] = {}
        self.step_times = StepTimes()  # every rank's ``step_times``, sorted together

    def clear(self) -> None:
        self.ranks.clear()
        self.step_times.clear()

    def __iter__(self) -> Iterator[RankState]:
        return iter(self.ranks.values())

    def last_steps(self) -> dict[int, int]:
        """Each rank's last finished step (-1: none yet)."""
        return {st.rank: st.last_step for st in self.ranks.values()}

    def nodes(self) -> dict[int, str]:
        """The host of each rank that said where it runs."""
        return {st.rank: st.host for st in self.ranks.values() if st.host != "?"}

    def observe(self, identity: bytes, msg: p.Message, now: float) -> RankState:
        """Update the sender's state from one message; returns it."""
        body = m.read(msg)
        st = self.ranks.get(msg.rank)
        if st is None or st.pid != msg.pid:
            if st is not None:  # a new process for this rank: forget the old one's samples
                for seconds in st.step_times:
                    self.step_times.remove(seconds)
            host = body.host if isinstance(body, m.Hello) and body.host is not None else "?"
            st = RankState(msg.rank, msg.pid, host, identity, now, last_progress_t=now)
            self.ranks[msg.rank] = st
        st.identity = identity
        st.last_seen_t = now
        match body:
            case m.Hello():
                st.host = st.host if body.host is None else body.host
                st.total_steps = body.total_steps
                st.resume_step = body.step
                st.last_step = max(st.last_step, body.step - 1)
            case (
                m.Heartbeat()
                | m.Sync()
                | m.CheckpointCommitted()
                | m.CheckpointExternal()
                | m.Exiting()
            ):
                if isinstance(body, m.Heartbeat) and body.longest_step_s > 0:
                    self._add_step_time(st, body.longest_step_s)
                if body.step > st.last_step:
                    st.last_step = body.step
                    st.last_progress_t = now
                    if st.first_step_t is None:
                        st.first_step_t = now
                if not isinstance(body, m.Sync):
                    st.saving_since = None
                if isinstance(body, m.Exiting):
                    st.phase = "exiting"  # leaving: its silence from now on is not a hang
            case m.CheckpointBegin():
                st.saving_since = now
                st.saving_step = body.step
            case m.Phase():
                st.phase = str(body.name) if body.begin else None
                st.last_progress_t = now  # entering or leaving a phase is a sign of life
        return st

    def started(self, world_size: int) -> bool:
        """All ``world_size`` ranks have finished a first step."""
        return sum(st.first_step_t is not None for st in self) >= world_size

    def exact_step(self, rank: int, step: object) -> None:
        """``rank``'s last finished step is ``step``, read from its step slot or its exit report
        (anything but an int is ignored), when later than the heartbeats said."""
        if not isinstance(step, int) or isinstance(step, bool):
            return
        for st in self:
            if st.rank == rank and step > st.last_step:
                st.last_step = step

    def commit_seen(self, step: int) -> None:
        """The checkpoint of ``step`` is committed, so every rank finished writing its part of it
        (they all agree before the commit): none of them is saving that step or an earlier one
        any more, even if its own next message never arrives (a rank stopped right after a save
        may leave it queued in its ZeroMQ I/O thread)."""
        for st in self.ranks.values():
            if st.saving_since is not None and st.saving_step <= step:
                st.saving_since = None

    def save_began(self, step: int | None) -> float | None:
        """When the first rank began saving ``step``, if some rank is still saving it. Only a save
        of that very step counts: with async saves, or a stop's save waiting for the one in
        flight, the ranks may already be saving a later step."""
        began = [
            st.saving_since
            for st in self.ranks.values()
            if st.saving_since is not None and st.saving_step == step
        ]
        return min(began) if began else None

    def silences(
        self, now: float, *, since: float, world_size: int, finishing: bool
    ) -> list[Silence]:
        """Every rank's silence for the hang check, ranks not heard from yet counted silent since
        ``since`` (the attempt's start). ``finishing``: a rank already left cleanly, so the others
        are busy ending, not hung."""
        out = [
            Silence(
                rank=st.rank,
                silent_s=now - st.last_progress_t,
                started=st.first_step_t is not None,
                busy=finishing or st.phase is not None or st.saving_since is not None,
            )
            for st in self.ranks.values()
        ]
        missing = set(range(world_size)) - set(self.ranks)
        out += [Silence(r, now - since, started=False, busy=False) for r in sorted(missing)]
        return out

    def _add_step_time(self, st: RankState, seconds: float) -> None:
        if len(st.step_times) == st.step_times.maxlen:
            self.step_times.remove(st.step_times[0])  # the deque drops it on append
        st.step_times.append(seconds)
        self.step_times.add(seconds)


def exit_from_report(msg: p.Message) -> RankExit | None:
    """The rank exit a ``RANK_EXIT`` message reports, or None if its payload is malformed.

    Payload: ``pid`` (int), ``code`` (int, or None when a signal ended it), ``signal`` (int or
    None), ``host`` (str).
    """
    body = m.read(msg)
    if not isinstance(body, m.RankExit) or body.pid is None or body.host is None:
        return None
    if (body.code is None) == (body.signal is None):  # exactly one of them says how it ended
        return None
    return RankExit(msg.rank, body.pid, exit_code=body.code, signal=body.signal, node=body.host)


def report_from_message(msg: p.Message) -> RankReport:
    """What a rank said of its own failure in a ``FAILURE`` message."""
    body = m.read(msg)
    if not isinstance(body, m.Failure):
        raise TypeError(f"not a FAILURE message: {msg.kind.name}")
    return RankReport(
        rank=msg.rank, kind=body.kind, type=body.type, message=body.message, step=body.step
    )


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
        self._ctx = zmq.asyncio.Context()
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
        # the same socket without the asyncio wrapper: draining what is already queued through
        # it costs a few µs a message instead of an awaited future each
        self._drain: zmq.Socket[bytes] = zmq.Socket.shadow(sock.underlying)

    def new_attempt(self, attempt: int) -> None:
        self.attempt = attempt
        self._last_seq.clear()

    async def receive(self) -> tuple[bytes, p.Message]:
        """Wait for the next acceptable message, dropping and counting the rest.

        Awaiting a frame that is already queued does not yield to the event loop: every
        ``_BATCH`` dropped frames it is yielded to explicitly, so that a flood of garbage cannot
        starve the daemon's other tasks (the hang check, the control socket, process exits).
        """
        dropped = 0
        while True:
            frames = await self._sock.recv_multipart(copy=True)
            checked = self._check(frames)
            if checked is not None:
                return checked
            dropped += 1
            if dropped % _BATCH == 0:
                await asyncio.sleep(0)

    async def receive_batch(self, limit: int = _BATCH) -> list[tuple[bytes, p.Message]]:
        """Wait for the next acceptable message, then look (without waiting) at up to ``limit``
        - 1 more frames that are already queued: one wake-up of the event loop for a burst of
        heartbeats. When frames are left, the event loop gets a turn before the batch returns."""
        batch = [await self.receive()]
        for _ in range(limit - 1):
            try:
                frames = self._drain.recv_multipart(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                return batch
            checked = self._check(frames)
            if checked is not None:
                batch.append(checked)
        await asyncio.sleep(0)  # more may be queued: let the other tasks run first
        return batch

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
        """Send to one rank; never blocks (a full or vanished peer drops the message)."""
        frame = m.encode(self._key, body, rank=rank, attempt=self.attempt, pid=os.getpid(), seq=0)
        try:
            self._sock.send_multipart([identity, frame], zmq.NOBLOCK)
        except zmq.ZMQError:
            self.dropped["send failed"] += 1

    def close(self) -> None:
        self._sock.close(linger=0)
        if self._listener is not None:
            self._listener.stop()
        self._ctx.term()


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
