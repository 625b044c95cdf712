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

The wire (ZeroMQ, DEALER to ROUTER, one acknowledgement per message): ``[VERSION, kind,
header (JSON), payload, mac]``, the MAC an HMAC-SHA256 with the job's secret over the four
frames before it. The receiver checks the MAC first, then the names (a file of a snapshot's
temporary directory, nothing else), then the payload's CRC-32, and writes the file under a
partial name renamed into place: a file is either whole and checked or absent. Nothing is
unpickled here; the committing writer reads a received marker only after its MAC held.
"""

from __future__ import annotations

import hmac
import json
import os
import re
import shutil
import socket
import threading
import zlib
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Final

import zmq

from worker_sdk.contract import layout
from worker_sdk.contract.checkpoint_names import COMMITTED_RE, TEMP_RE

__all__ = [
    "Receiver",
    "ReplicaAck",
    "ReplicaCommit",
    "ReplicaError",
    "ReplicaFile",
    "node_address",
    "push",
]

VERSION: Final = b"rvsup-replica-1"
_FILE_NAME: Final = re.compile(
    r"^(shared\.pt|rank-\d+\.pt|MANIFEST\.json|\.written-\d+|dcp/(\.metadata|__\d+_\d+\.distcp))$"
)
_POLL_MS: Final = 200


class ReplicaError(RuntimeError):
    """A push that was refused, or not answered in time."""


@dataclass(frozen=True, slots=True)
class ReplicaFile:
    """One file of a snapshot, into the temporary directory ``tmp`` of the receiver's snapshot
    directory (the payload is the file's bytes)."""

    tmp: str
    name: str
    crc: int


@dataclass(frozen=True, slots=True)
class ReplicaCommit:
    """Every file of the snapshot in ``tmp`` has been sent (its manifest last): commit it as
    the snapshot of ``step`` unless a valid one of that step is there already."""

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
    """Files pushed by other nodes' writers, written into ``directory`` (a thread of this
    writer process, bound to a TCP port of ``address``)."""

    def __init__(self, directory: Path, key: bytes, address: str) -> None:
        self.directory = directory
        self._key = key
        self._ctx = zmq.Context(io_threads=1)
        self._sock = self._ctx.socket(zmq.ROUTER)
        self._sock.setsockopt(zmq.LINGER, 0)
        port = self._sock.bind_to_random_port(f"tcp://{address}")
        self.endpoint = f"tcp://{address}:{port}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, name="rvsup-replica", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._sock.close()
        self._ctx.term()

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
            if kind == b"ReplicaFile":
                self._write(ReplicaFile(**header), payload)
            elif kind == b"ReplicaCommit":
                self._commit(ReplicaCommit(**header))
            else:
                return ReplicaAck(False, f"unknown message {kind!r}")
        except (ValueError, TypeError, OSError) as e:
            return ReplicaAck(False, f"{type(e).__name__}: {e}")
        return ReplicaAck(True)

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
        path = tmp / message.name
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        partial = path.with_name(path.name + ".partial")
        with open(os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "wb") as f:
            f.write(payload)
        os.replace(partial, path)

    def _commit(self, message: ReplicaCommit) -> None:
        tmp = self._tmp(message.tmp)
        final = self.directory / layout.committed_name(message.step)
        if not COMMITTED_RE.match(final.name):
            raise ValueError(f"bad step {message.step!r}")
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


def push(
    endpoint: str,
    key: bytes,
    tmp: str,
    files: Sequence[tuple[str, Path | bytes]],
    *,
    timeout_s: float,
    commit_step: int | None = None,
) -> None:
    """Send ``files`` (name, path or bytes) into ``tmp`` at the receiver ``endpoint``, one by
    one, each acknowledged; then, with ``commit_step``, the commit. Raises
    :class:`ReplicaError` when the receiver refuses one or does not answer within
    ``timeout_s`` per message."""
    ctx = zmq.Context(io_threads=1)
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        sock.connect(endpoint)
        for name, content in files:
            data = content if isinstance(content, bytes) else Path(content).read_bytes()
            message = ReplicaFile(tmp, name, zlib.crc32(data))
            _send(sock, _frames(key, message, data), endpoint, name, timeout_s)
        if commit_step is not None:
            frames = _frames(key, ReplicaCommit(tmp, commit_step), b"")
            _send(sock, frames, endpoint, "the commit", timeout_s)
    finally:
        sock.close()
        ctx.term()


def _send(
    sock: zmq.Socket[bytes], frames: list[bytes], endpoint: str, what: str, timeout_s: float
) -> None:
    sock.send_multipart(frames, copy=False)
    if not sock.poll(int(timeout_s * 1000)):
        raise ReplicaError(f"{endpoint} did not acknowledge {what} within {timeout_s:g} s")
    answer = json.loads(sock.recv())
    if not answer.get("ok"):
        raise ReplicaError(f"{endpoint} refused {what}: {answer.get('reason')}")
