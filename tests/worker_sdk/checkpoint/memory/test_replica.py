"""Snapshots pushed to another node's writer (worker_sdk.checkpoint.memory.replica), over real
ZeroMQ sockets on this machine: what arrives is whole and checked, what is not the job's or not
a snapshot's file is refused, a whole snapshot is committed only once it checks out; a message
replayed, of another attempt or out of order is refused; a frame over the bound never fills the
receiver's memory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zlib
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import torch
import zmq

from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.checkpoint.memory import replica
from worker_sdk.contract import curve, layout

KEY = b"k" * 32
ATTEMPT = "a1"


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[replica.Receiver]:
    into = tmp_path / "node2"
    into.mkdir()
    got = replica.Receiver(into, KEY, "127.0.0.1", ATTEMPT)
    yield got
    got.close()


def _snapshot(tmp_path: Path, step: int) -> Path:
    model = torch.nn.Linear(4, 3)
    Checkpointer(tmp_path / "node1", rank=0, world_size=1, attempt_tag="a1", keep_last=2).save(
        step, [model], {"note": "x"}
    )
    return tmp_path / "node1" / layout.committed_name(step)


def _whole(path: Path) -> list[tuple[str, Path | bytes]]:
    names = sorted(json.loads((path / layout.MANIFEST).read_bytes())["files"])
    return [*((n, path / n) for n in names), (layout.MANIFEST, path / layout.MANIFEST)]


def test_a_pushed_part_arrives_whole_under_its_name(receiver: replica.Receiver) -> None:
    """Each file lands in the snapshot's temporary folder with the bytes sent, no partial left."""
    tmp = layout.temp_name(7, "a1")
    replica.push(
        receiver.endpoint,
        KEY,
        tmp,
        [("rank-1.pt", b"part"), ("dcp/__1_0.distcp", b"shard"), (".written-1", b"m")],
        attempt=ATTEMPT,
        timeout_s=10,
    )
    folder = receiver.directory / tmp
    assert (folder / "rank-1.pt").read_bytes() == b"part"
    assert (folder / "dcp" / "__1_0.distcp").read_bytes() == b"shard"
    assert (folder / ".written-1").read_bytes() == b"m"
    assert not list(folder.rglob("*.partial"))


def test_a_whole_snapshot_pushed_is_committed_and_checks_out(
    tmp_path: Path, receiver: replica.Receiver
) -> None:
    """A node without the snapshot (a spare) gets it committed, equal to the sender's copy."""
    sent = _snapshot(tmp_path, 12)
    replica.push(
        receiver.endpoint,
        KEY,
        layout.temp_name(12, "copy"),
        _whole(sent),
        attempt=ATTEMPT,
        timeout_s=10,
        commit_step=12,
    )
    got = layout.validate(receiver.directory / layout.committed_name(12))
    assert got.step == 12
    for name, _ in _whole(sent):
        assert (got.path / name).read_bytes() == (sent / name).read_bytes()


def test_a_snapshot_missing_a_file_is_not_committed(
    tmp_path: Path, receiver: replica.Receiver
) -> None:
    """A commit whose files do not match the manifest is refused and leaves nothing loadable."""
    sent = _snapshot(tmp_path, 3)
    files = [f for f in _whole(sent) if f[0] != "rank-00000.pt"]
    with pytest.raises(replica.ReplicaError, match="does not check out"):
        replica.push(
            receiver.endpoint,
            KEY,
            layout.temp_name(3, "copy"),
            files,
            attempt=ATTEMPT,
            timeout_s=10,
            commit_step=3,
        )
    assert layout.scan(receiver.directory) == ([], [])


def test_a_push_with_another_secret_never_gets_in(receiver: replica.Receiver) -> None:
    """Without the job's secret there is no CURVE handshake: the push fails at once, nothing is
    written."""
    with pytest.raises(replica.ReplicaError, match="refused the handshake"):
        replica.push(
            receiver.endpoint,
            b"x" * 32,
            layout.temp_name(1, "a"),
            [("rank-0.pt", b"p")],
            attempt=ATTEMPT,
            timeout_s=2,
        )
    assert list(receiver.directory.iterdir()) == []


def test_a_message_signed_with_another_key_is_refused(receiver: replica.Receiver) -> None:
    """A message whose MAC is another key's (a peer past the handshake) is never carried out."""
    message = _chunk(1, layout.temp_name(1, "a"), "rank-0.pt", 0, 1, zlib.crc32(b"p"))
    ack = receiver.handle(replica._frames(b"x" * 32, message, b"p"))
    assert (ack.ok, ack.reason) == (False, "bad MAC")
    assert list(receiver.directory.iterdir()) == []


def _chunk(
    seq: int, tmp: str, name: str, offset: int, size: int, crc: int, *, nonce: str = "0" * 32
) -> replica.ReplicaFile:
    return replica.ReplicaFile(ATTEMPT, nonce, seq, tmp, name, offset, size, crc)


def test_a_replayed_or_foreign_message_is_refused(receiver: replica.Receiver) -> None:
    """The same signed message twice (a capture replayed), one of another attempt, and chunks
    out of order are refused; a file comes whole from chunks in order."""
    tmp = layout.temp_name(4, ATTEMPT)
    first = replica._frames(KEY, _chunk(1, tmp, "rank-0.pt", 0, 4, zlib.crc32(b"ab")), b"ab")
    assert receiver.handle(first).ok
    assert "replayed" in receiver.handle(first).reason
    later = _chunk(2, tmp, "rank-0.pt", 3, 4, zlib.crc32(b"d"))
    assert "a chunk at 3, 2 bytes came" in receiver.handle(replica._frames(KEY, later, b"d")).reason
    other = replica.ReplicaFile("a0", "1" * 32, 1, tmp, "rank-1.pt", 0, 1, zlib.crc32(b"x"))
    assert "attempt 'a0'" in receiver.handle(replica._frames(KEY, other, b"x")).reason
    assert not (receiver.directory / tmp / "rank-0.pt").exists()  # never whole


def test_a_file_larger_than_a_chunk_arrives_whole(
    receiver: replica.Receiver, tmp_path: Path
) -> None:
    """A file of two and a half chunks, read and sent a chunk at a time, lands whole."""
    big = tmp_path / "big.pt"
    big.write_bytes(os.urandom(replica.CHUNK * 2 + replica.CHUNK // 2))
    tmp = layout.temp_name(5, ATTEMPT)
    replica.push(receiver.endpoint, KEY, tmp, [("shared.pt", big)], attempt=ATTEMPT, timeout_s=30)
    assert (receiver.directory / tmp / "shared.pt").read_bytes() == big.read_bytes()


_RECEIVE = """
import sys
from pathlib import Path
from worker_sdk.checkpoint.memory.replica import Receiver
r = Receiver(Path(sys.argv[1]), sys.argv[2].encode(), "127.0.0.1", "a1")
print(r.endpoint, flush=True)
sys.stdin.read()
r.close()
"""


@pytest.mark.process
def test_a_frame_over_the_bound_is_dropped_without_the_memory(tmp_path: Path) -> None:
    """A peer holding the keys sends one 400 MB frame: the receiver drops the connection as
    the frame's size is read (no acknowledgement), its memory does not grow by the frame, and
    it takes a valid push after."""
    into = tmp_path / "node2"
    into.mkdir(mode=0o700)
    proc = subprocess.Popen(
        [sys.executable, "-c", _RECEIVE, str(into), KEY.decode()],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().strip()
        before = psutil.Process(proc.pid).memory_info().rss
        ctx = zmq.Context()
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        curve.secure_client(sock, curve.keys(KEY, curve.REPLICA))
        sock.connect(endpoint)
        message = _chunk(1, layout.temp_name(1, ATTEMPT), "shared.pt", 0, 1, 0)
        frames = replica._frames(KEY, message, bytes(400 << 20))
        sock.send_multipart(frames, copy=False)
        assert not sock.poll(3000), "the oversized message was answered"
        sock.close()
        ctx.term()
        del frames
        grown = psutil.Process(proc.pid).memory_info().rss - before
        assert grown < 64 << 20, f"the receiver grew by {grown >> 20} MB"
        tmp = layout.temp_name(2, ATTEMPT)
        replica.push(endpoint, KEY, tmp, [("rank-0.pt", b"p")], attempt=ATTEMPT, timeout_s=10)
        assert (into / tmp / "rank-0.pt").read_bytes() == b"p"
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        if proc.stdin is not None:
            proc.stdin.close()


@pytest.mark.parametrize(
    ("tmp", "name"),
    [
        ("../elsewhere", "rank-0.pt"),
        (layout.committed_name(1), "rank-0.pt"),
        (layout.temp_name(1, "a"), "../../escape.pt"),
        (layout.temp_name(1, "a"), "notes.txt"),
        (layout.temp_name(1, "a"), "dcp/../../x"),
    ],
)
def test_a_file_outside_a_snapshots_folder_is_refused(
    receiver: replica.Receiver, tmp: str, name: str
) -> None:
    """Only a snapshot's own files, only into a temporary folder of the receiver's directory."""
    with pytest.raises(replica.ReplicaError, match="refused"):
        replica.push(receiver.endpoint, KEY, tmp, [(name, b"p")], attempt=ATTEMPT, timeout_s=10)
    assert list(receiver.directory.iterdir()) == []


def test_a_payload_whose_crc_does_not_match_is_refused(receiver: replica.Receiver) -> None:
    """Bytes changed after their CRC-32 was taken (MAC recomputed) are never written."""
    message = _chunk(1, layout.temp_name(1, "a"), "rank-0.pt", 0, 4, zlib.crc32(b"good"))
    frames = replica._frames(KEY, message, b"bad!")
    ack = receiver.handle(frames)
    assert not ack.ok
    assert "CRC-32" in ack.reason
    assert list(receiver.directory.iterdir()) == []


def test_a_receiver_that_does_not_answer_fails_the_push_in_time() -> None:
    """A dead node's writer does not hang the push: it fails after the timeout."""
    with pytest.raises(replica.ReplicaError, match="did not acknowledge"):
        replica.push(
            "tcp://127.0.0.1:9",
            KEY,
            layout.temp_name(1, "a"),
            [("rank-0.pt", b"p")],
            attempt=ATTEMPT,
            timeout_s=0.5,
        )
