"""Snapshots across nodes: every rank's part copied into every other node's snapshot directory.

In a job of several nodes each node's snapshot directory receives every rank's files, so that
each node commits a complete snapshot of its own (the manifest, the rename) and a lost node's
parts survive in the others' memory: with two nodes, each is the other's buddy. A rank's
writer, once its files are written here, pushes them to the writers of the ranks with the same
local rank on the other nodes (:func:`push`), ending with its ``.written-<r>`` marker; each
node's committing writer waits for every rank's marker, local or received, exactly as on one
node. A node that joins later without any snapshot (a spare in place of a lost node) is
healed at the restore: a node holding the chosen snapshot pushes it whole and the receiver
commits it (:class:`ReplicaCommit`).

The wire (ZeroMQ, DEALER to ROUTER, one acknowledgement per message), bounded and
authenticated twice over:

- the connection is CurveZMQ with keys of the job's secret (:mod:`worker_sdk.contract.curve`):
  a stranger cannot complete a handshake, and the weights cross the network encrypted;
- a message is ``[VERSION, kind, header (JSON), payload, mac]``, the MAC an HMAC-SHA256 with
  the job's secret over the four frames before it. A file travels in chunks of at most
  :data:`CHUNK` bytes, and the receiver takes no frame larger than that (``MAXMSGSIZE``: a
  peer that sends one is disconnected before it is buffered). The signed header names the
  attempt (a push of an earlier attempt is refused), the push's nonce and the message's
  number in it (a message replayed is refused), and the snapshot's step (its temporary
  folder's). The receiver checks the MAC first, then the header, the names (a file of a
  snapshot's temporary folder, nothing else), each chunk's CRC-32 and that chunks come in
  order, and writes the file under a partial name renamed into place once whole: a file is
  either whole and checked or absent. Nothing is unpickled here; the committing writer reads
  a received marker as it reads a local one (JSON with its own MAC, :mod:`..background.markers`).
"""

from __future__ import annotations

import collections
import hmac
import json
import os
import re
import secrets
import shutil
import socket
import threading
import time
import zlib
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Final

import zmq
from zmq.utils.monitor import recv_monitor_message

from worker_sdk.contract import curve, layout, threads
from worker_sdk.contract.layout import COMMITTED_RE, TEMP_RE
from worker_sdk.contract.private_paths import make_private_dir

__all__ = [
    "CHUNK",
    "Receiver",
    "ReplicaAck",
    "ReplicaCommit",
    "ReplicaError",
    "ReplicaFile",
    "node_address",
    "push",
]

VERSION: Final = b"rvsup-replica-2"
CHUNK: Final = 8 << 20  # bytes of a file per message: the largest frame a receiver takes
_FRAME_MAX: Final = CHUNK + (64 << 10)  # a chunk and its header
_FILE_NAME: Final = re.compile(
    r"^(shared\.pt|rank-\d+\.pt|MANIFEST\.json|\.written-\d+|dcp/(\.metadata|__\d+_\d+\.distcp))$"
)
_POLL_MS: Final = 200
_SESSIONS: Final = 4096  # pushes remembered (their nonce and last message): replays refused
_OPEN_FILES: Final = 64  # files being received at once (the oldest is dropped past that)


class ReplicaError(RuntimeError):
    """A push that was refused, or not answered in time."""


@dataclass(frozen=True, slots=True)
class ReplicaFile:
    """A chunk of one file of a snapshot, at ``offset`` of its ``size`` bytes, into the
    temporary folder ``tmp`` of the receiver's snapshot directory (the payload is the chunk,
    ``crc`` its CRC-32)."""

    attempt: str
    nonce: str
    seq: int
    tmp: str
    name: str
    offset: int
    size: int
    crc: int


@dataclass(frozen=True, slots=True)
class ReplicaCommit:
    """Every file of the snapshot in ``tmp`` has been sent (its manifest last): commit it as
    the snapshot of ``step`` unless a valid one of that step is there already."""

    attempt: str
    nonce: str
    seq: int
    tmp: str
    step: int


@dataclass(frozen=True, slots=True)
class ReplicaAck:
    """The receiver's answer to one message: done, or why not."""

    ok: bool
    reason: str = ""


def _mac(key: bytes, frames: Sequence[bytes | memoryview]) -> bytes:
    digest = hmac.new(key, digestmod="sha256")
    for frame in frames:
        digest.update(len(frame).to_bytes(8, "little"))
        digest.update(frame)
    return digest.digest()


def _frames(key: bytes, message: ReplicaFile | ReplicaCommit, payload: bytes) -> list[bytes]:
    kind = type(message).__name__.encode()
    header = json.dumps(asdict(message)).encode()
    frames = [VERSION, kind, header, payload]
    return [*frames, _mac(key, frames)]


def node_address(master_addr: str, master_port: int) -> str:
    """This node's address as the other nodes reach it: the one its route to the rendezvous
    host leaves from (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((master_addr, master_port))
        address: str = probe.getsockname()[0]
    return address


class Receiver:
    """Files pushed by other nodes' writers of attempt ``attempt``, written into ``directory``
    (a thread of this writer process, bound to a TCP port of ``address``)."""

    def __init__(self, directory: Path, key: bytes, address: str, attempt: str) -> None:
        self.directory = directory
        self.attempt = attempt
        self._key = key
        self._sessions: collections.OrderedDict[str, int] = collections.OrderedDict()
        self._open: dict[tuple[str, str, str], tuple[IO[bytes], int]] = {}
        self._ctx = zmq.Context(io_threads=1)
        keys = curve.keys(key, curve.REPLICA)
        self._listener = curve.Listener(self._ctx, keys)
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, _FRAME_MAX)
        curve.secure_server(self._sock, keys)
        port = self._sock.bind_to_random_port(f"tcp://{address}")
        self.endpoint = f"tcp://{address}:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rvsup-replica", daemon=True)
        self._thread.start()
        threads.name_os_thread(self._thread, "replica")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._sock.close()
        self._listener.stop()
        self._ctx.term()
        for f, _ in self._open.values():
            f.close()

    def _serve(self) -> None:
        while not self._stop.is_set():
            if not self._sock.poll(_POLL_MS):
                continue
            frames = self._sock.recv_multipart(copy=False)
            peer, rest = frames[0].bytes, [f.buffer for f in frames[1:]]
            ack = self.handle(rest)
            self._sock.send_multipart([peer, json.dumps(asdict(ack)).encode()])

    def handle(self, frames: Sequence[bytes | memoryview]) -> ReplicaAck:
        """Check one message and carry it out; the answer."""
        if len(frames) != 5 or bytes(frames[0]) != VERSION:
            return ReplicaAck(False, "not a replica message")
        if not hmac.compare_digest(bytes(frames[4]), _mac(self._key, frames[:4])):
            return ReplicaAck(False, "bad MAC")
        kind, payload = bytes(frames[1]), frames[3]
        try:
            header = json.loads(bytes(frames[2]))
            if not isinstance(header, dict):
                raise TypeError("the header is no object")
            if kind == b"ReplicaFile":
                message: ReplicaFile | ReplicaCommit = ReplicaFile(**header)
            elif kind == b"ReplicaCommit":
                message = ReplicaCommit(**header)
            else:
                return ReplicaAck(False, f"unknown message {kind!r}")
            self._fresh(message)
            if isinstance(message, ReplicaFile):
                self._write(message, payload)
            else:
                self._commit(message)
        except (ValueError, TypeError, OSError) as e:
            return ReplicaAck(False, f"{type(e).__name__}: {e}")
        return ReplicaAck(True)

    def _fresh(self, message: ReplicaFile | ReplicaCommit) -> None:
        """Of this attempt, and the next message of its push (never one seen before)."""
        if message.attempt != self.attempt:
            raise ValueError(f"a push of attempt {message.attempt!r}, this is {self.attempt!r}")
        nonce, seq = message.nonce, message.seq
        if not isinstance(nonce, str) or not re.fullmatch(r"[0-9a-f]{32}", nonce):
            raise ValueError("a push needs a nonce of 32 hex digits")
        if isinstance(seq, bool) or not isinstance(seq, int) or seq <= self._sessions.get(nonce, 0):
            raise ValueError(f"message {seq!r} of push {nonce} is replayed or out of order")
        self._sessions[nonce] = seq
        self._sessions.move_to_end(nonce)
        while len(self._sessions) > _SESSIONS:
            self._sessions.popitem(last=False)

    def _tmp(self, name: str) -> Path:
        if not isinstance(name, str) or not TEMP_RE.match(name):
            raise ValueError(f"{name!r} is not a snapshot's temporary directory")
        return self.directory / name

    def _write(self, message: ReplicaFile, payload: bytes | memoryview) -> None:
        tmp = self._tmp(message.tmp)
        if not isinstance(message.name, str) or not _FILE_NAME.match(message.name):
            raise ValueError(f"{message.name!r} is not a file of a snapshot")
        if zlib.crc32(payload) != message.crc:
            raise ValueError(f"{message.name}: CRC-32 mismatch")
        size, offset = message.size, message.offset
        if not all(isinstance(n, int) and not isinstance(n, bool) for n in (size, offset)):
            raise TypeError("offset and size must be numbers")
        if offset < 0 or offset + len(payload) > size:
            raise ValueError(f"{message.name}: a chunk at {offset} beyond its {size} bytes")
        path = tmp / message.name
        key = (message.nonce, message.tmp, message.name)
        f, written = self._open.pop(key, (None, 0))
        if f is None:
            if offset != 0:
                raise ValueError(f"{message.name}: a chunk at {offset} before the first")
            if len(self._open) >= _OPEN_FILES:  # a push that never ended: its file is dropped
                oldest, _ = self._open.pop(next(iter(self._open)))
                oldest.close()
            make_private_dir(tmp)
            if path.parent != tmp:
                make_private_dir(path.parent)
            fd = os.open(path.with_name(path.name + ".partial"), _CREATE, 0o600)
            f = open(fd, "wb")  # noqa: SIM115 - kept open across the chunks
        elif offset != written:
            f.close()
            raise ValueError(f"{message.name}: a chunk at {offset}, {written} bytes came")
        f.write(payload)
        written += len(payload)
        if written < size:
            self._open[key] = (f, written)
            return
        f.close()
        os.replace(path.with_name(path.name + ".partial"), path)

    def _commit(self, message: ReplicaCommit) -> None:
        tmp = self._tmp(message.tmp)
        final = self.directory / layout.committed_name(message.step)
        step = TEMP_RE.match(message.tmp)
        if not COMMITTED_RE.match(final.name) or step is None or int(step.group(1)) != message.step:
            raise ValueError(f"bad step {message.step!r} for {message.tmp}")
        try:
            layout.validate(final)
        except layout.CorruptCheckpointError:
            if os.path.lexists(final):
                layout.discard(final)
        else:
            shutil.rmtree(tmp, ignore_errors=True)  # a valid copy is there already
            return
        os.rename(tmp, final)
        try:
            layout.validate(final)
        except layout.CorruptCheckpointError as e:
            layout.discard(final)
            raise ValueError(
                f"the snapshot of step {message.step} does not check out: {e.reason}"
            ) from None


_CREATE: Final = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW


def push(
    endpoint: str,
    key: bytes,
    tmp: str,
    files: Sequence[tuple[str, Path | bytes]],
    *,
    attempt: str,
    timeout_s: float,
    commit_step: int | None = None,
) -> None:
    """Send ``files`` (name, path or bytes) into ``tmp`` at the receiver ``endpoint`` of attempt
    ``attempt``, chunk by chunk, each acknowledged; then, with ``commit_step``, the commit.
    Raises :class:`ReplicaError` when the receiver refuses one or does not answer within
    ``timeout_s`` per message."""
    ctx = zmq.Context(io_threads=1)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    curve.secure_client(sock, curve.keys(key, curve.REPLICA))
    nonce, seq = secrets.token_hex(16), 0
    monitor = sock.get_monitor_socket(_HANDSHAKE_EVENTS)
    try:
        sock.connect(endpoint)
        _handshake(monitor, endpoint, timeout_s)
        for name, content in files:
            for offset, size, chunk in _chunks(content):
                seq += 1
                message = ReplicaFile(
                    attempt, nonce, seq, tmp, name, offset, size, zlib.crc32(chunk)
                )
                _send(sock, _frames(key, message, chunk), endpoint, name, timeout_s)
        if commit_step is not None:
            frames = _frames(key, ReplicaCommit(attempt, nonce, seq + 1, tmp, commit_step), b"")
            _send(sock, frames, endpoint, "the commit", timeout_s)
    finally:
        sock.disable_monitor()
        monitor.close()
        sock.close()
        ctx.term()


_HANDSHAKE_EVENTS: Final = (
    zmq.EVENT_HANDSHAKE_SUCCEEDED
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_DISCONNECTED
)


def _handshake(monitor: zmq.Socket[bytes], endpoint: str, timeout_s: float) -> None:
    """Wait for the CURVE handshake with ``endpoint``; raise at once when it fails (a
    receiver that does not hold this job's keys drops the connection), or after ``timeout_s``
    (nobody answers)."""
    deadline = time.monotonic() + timeout_s
    while (left := deadline - time.monotonic()) > 0 and monitor.poll(int(left * 1000) + 1):
        event = recv_monitor_message(monitor)["event"]
        if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
            return
        raise ReplicaError(f"{endpoint} refused the handshake: it does not hold this job's keys")
    raise ReplicaError(f"{endpoint} did not acknowledge the handshake within {timeout_s:g} s")


def _chunks(content: Path | bytes) -> Iterator[tuple[int, int, bytes]]:
    """(offset, whole size, bytes) of each chunk of ``content`` (one, empty, for an empty
    file), read from a file a chunk at a time."""
    if isinstance(content, bytes):
        for offset in range(0, max(len(content), 1), CHUNK):
            yield offset, len(content), content[offset : offset + CHUNK]
        return
    with open(content, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        offset = 0
        while True:
            chunk = f.read(CHUNK)
            yield offset, size, chunk
            offset += len(chunk)
            if offset >= size or not chunk:
                return


def _send(
    sock: zmq.Socket[bytes], frames: list[bytes], endpoint: str, what: str, timeout_s: float
) -> None:
    sock.send_multipart(frames, copy=False)
    if not sock.poll(int(timeout_s * 1000)):
        raise ReplicaError(f"{endpoint} did not acknowledge {what} within {timeout_s:g} s")
    answer = json.loads(sock.recv())
    if not answer.get("ok"):
        raise ReplicaError(f"{endpoint} refused {what}: {answer.get('reason')}")
