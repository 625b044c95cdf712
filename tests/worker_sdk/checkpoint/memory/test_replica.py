"""Snapshots pushed to another node's writer (worker_sdk.checkpoint.memory.replica), over real
ZeroMQ sockets on this machine: what arrives is whole and checked, what is not the job's or not
a snapshot's file is refused, a whole snapshot is committed only once it checks out."""

from __future__ import annotations

import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from worker_sdk.checkpoint.checkpointer import Checkpointer
from worker_sdk.checkpoint.memory import replica
from worker_sdk.contract import layout

KEY = b"k" * 32


@pytest.fixture
def receiver(tmp_path: Path) -> Iterator[replica.Receiver]:
    into = tmp_path / "node2"
    into.mkdir()
    got = replica.Receiver(into, KEY, "127.0.0.1")
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
            timeout_s=10,
            commit_step=3,
        )
    assert layout.scan(receiver.directory) == ([], [])


def test_a_push_signed_with_another_key_is_refused(receiver: replica.Receiver) -> None:
    """Without the job's secret nothing is written."""
    with pytest.raises(replica.ReplicaError, match="bad MAC"):
        replica.push(
            receiver.endpoint,
            b"x" * 32,
            layout.temp_name(1, "a"),
            [("rank-0.pt", b"p")],
            timeout_s=10,
        )
    assert list(receiver.directory.iterdir()) == []


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
        replica.push(receiver.endpoint, KEY, tmp, [(name, b"p")], timeout_s=10)
    assert list(receiver.directory.iterdir()) == []


def test_a_payload_whose_crc_does_not_match_is_refused(receiver: replica.Receiver) -> None:
    """Bytes changed after their CRC-32 was taken (MAC recomputed) are never written."""
    message = replica.ReplicaFile(layout.temp_name(1, "a"), "rank-0.pt", zlib.crc32(b"good"))
    frames = replica._frames(KEY, message, b"bad!")
    ack = receiver.handle(frames)
    assert not ack.ok
    assert "CRC-32" in ack.reason
    assert list(receiver.directory.iterdir()) == []


def test_a_receiver_that_does_not_answer_fails_the_push_in_time() -> None:
    """A dead node's writer does not hang the push: it fails after the timeout."""
    with pytest.raises(replica.ReplicaError, match="did not acknowledge"):
        replica.push(
            "tcp://127.0.0.1:9", KEY, layout.temp_name(1, "a"), [("rank-0.pt", b"p")], timeout_s=0.5
        )
