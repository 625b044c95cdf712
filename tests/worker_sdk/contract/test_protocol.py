"""The rank wire format: round trip, every reason a frame is dropped, and the secret file."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from worker_sdk.contract import protocol as p

KEY = bytes(range(32))


def _frame(
    body_after_header: bytes = b"", *, magic: bytes = p.MAGIC, kind: int = 2, key: bytes = KEY
) -> bytes:
    """A correctly authenticated frame built by hand (so header fields can be wrong)."""
    body = p.HEADER.pack(magic, kind, 0, 0, 1, 123, 1, 5, 0.5) + body_after_header
    return body + p.mac(key, body)


@pytest.mark.parametrize(
    ("kind", "fields"),
    [
        pytest.param(p.Kind.HEARTBEAT, {"step": 17, "value": 0.25, "flags": p.FLAG_STOP}, id="hb"),
        pytest.param(
            p.Kind.HELLO, {"step": 0, "payload": {"host": "n1", "world_size": 4}}, id="hello"
        ),
        pytest.param(
            p.Kind.FAILURE,
            {"step": 2**40, "payload": {"kind": "oom", "message": 'h\u00e9 \n"q"'}},
            id="failure: big step, unicode",
        ),
        pytest.param(p.Kind.SAVE_AT, {"step": -1, "flags": p.FLAG_STOP}, id="save_at"),
        pytest.param(p.Kind.SYNC_CANCEL, {}, id="defaults"),
    ],
)
def test_round_trip(kind: p.Kind, fields: dict[str, Any]) -> None:
    """decode(encode(x)) gives back every field of x."""
    frame = p.encode(KEY, kind, rank=3, attempt=2, pid=4321, seq=99, **fields)
    msg = p.decode(KEY, frame)
    expected = p.Message(kind, 3, 2, 4321, 99, **fields)
    assert msg == expected
    assert isinstance(msg.kind, p.Kind)
    assert (
        len(frame)
        == p.HEADER.size
        + len(
            json.dumps(fields.get("payload"), separators=(",", ":")).encode()
            if fields.get("payload")
            else b""
        )
        + p.MAC_BYTES
    )


def test_largest_frame_is_accepted() -> None:
    """A frame of exactly MAX_MESSAGE_BYTES still decodes."""
    overhead = p.HEADER.size + p.MAC_BYTES + len('{"x":""}')
    payload = {"x": "a" * (p.MAX_MESSAGE_BYTES - overhead)}
    frame = p.encode(KEY, p.Kind.FAILURE, rank=0, attempt=1, pid=1, seq=1, payload=payload)
    assert len(frame) == p.MAX_MESSAGE_BYTES
    assert p.decode(KEY, frame).payload == payload


def _oversized() -> bytes:
    payload = {"x": "a" * p.MAX_MESSAGE_BYTES}
    return p.encode(KEY, p.Kind.FAILURE, rank=0, attempt=1, pid=1, seq=1, payload=payload)


def _flipped() -> bytes:
    frame = bytearray(p.encode(KEY, p.Kind.HEARTBEAT, rank=0, attempt=1, pid=1, seq=1, step=4))
    frame[20] ^= 1
    return bytes(frame)


@pytest.mark.parametrize(
    ("frame", "reason"),
    [
        pytest.param(_oversized(), "oversized", id="oversized, though authentic"),
        pytest.param(b"x" * (p.MAX_MESSAGE_BYTES + 1), "oversized", id="oversized junk"),
        pytest.param(b"", "truncated", id="empty"),
        pytest.param(
            p.encode(KEY, p.Kind.HEARTBEAT, rank=0, attempt=1, pid=1, seq=1)[:-1],
            "truncated",
            id="one byte short",
        ),
        pytest.param(
            p.encode(b"other key", p.Kind.HEARTBEAT, rank=0, attempt=1, pid=1, seq=1),
            "unauthenticated",
            id="wrong key",
        ),
        pytest.param(_flipped(), "unauthenticated", id="one bit flipped"),
        pytest.param(os.urandom(200), "unauthenticated", id="random bytes"),
        pytest.param(_frame(magic=b"RV1"), "bad magic", id="bad magic"),
        pytest.param(_frame(kind=0), "unknown kind", id="kind 0"),
        pytest.param(_frame(kind=99), "unknown kind", id="kind 99"),
        pytest.param(_frame(b"{not json"), "bad payload", id="payload not JSON"),
        pytest.param(_frame(b"\xff\xfe{}"), "bad payload", id="payload not UTF-8"),
        pytest.param(_frame(b"[1, 2]"), "bad payload", id="payload a list"),
        pytest.param(_frame(b'"text"'), "bad payload", id="payload a string"),
    ],
)
def test_bad_message_reasons(frame: bytes, reason: str) -> None:
    """decode raises BadMessageError carrying the reason the frame is dropped."""
    with pytest.raises(p.BadMessageError) as info:
        p.decode(KEY, frame)
    assert info.value.reason == reason
    assert str(info.value) == reason
    assert isinstance(info.value, ValueError)


def test_hand_built_frame_is_valid() -> None:
    """The hand-built frames of the table above differ from a good one only where intended."""
    assert p.decode(KEY, _frame(b'{"a":1}')) == p.Message(
        p.Kind.HEARTBEAT, rank=0, attempt=1, pid=123, seq=1, step=5, value=0.5, payload={"a": 1}
    )


def test_new_secret_is_random() -> None:
    """new_secret gives SECRET_BYTES fresh random bytes each time."""
    a, b = p.new_secret(), p.new_secret()
    assert len(a) == len(b) == p.SECRET_BYTES
    assert a != b


def test_secret_file_round_trip_0600(tmp_path: Path) -> None:
    """write_secret makes a 0600 file that read_secret reads back; a rewrite replaces it."""
    path = tmp_path / "secret"
    first, second = p.new_secret(), p.new_secret()
    p.write_secret(str(path), first)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert p.read_secret(str(path)) == first
    p.write_secret(str(path), second)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert p.read_secret(str(path)) == second
    assert sorted(os.listdir(tmp_path)) == ["secret"]  # no temporary file left


@pytest.mark.parametrize("mode", [0o640, 0o604, 0o620, 0o602, 0o644, 0o666])
def test_secret_refused_when_others_have_access(tmp_path: Path, mode: int) -> None:
    """read_secret refuses a file that group or others can read or write."""
    path = tmp_path / "secret"
    p.write_secret(str(path), p.new_secret())
    path.chmod(mode)
    with pytest.raises(PermissionError, match="must not be accessible"):
        p.read_secret(str(path))


def test_secret_owner_only_modes_accepted(tmp_path: Path) -> None:
    """0400 and 0700 are private too."""
    path = tmp_path / "secret"
    secret = p.new_secret()
    p.write_secret(str(path), secret)
    for mode in (0o400, 0o700):
        path.chmod(mode)
        assert p.read_secret(str(path)) == secret


@pytest.mark.parametrize(
    ("slurmd_nodename", "hostname", "expected"),
    [
        ("node2", "node2", "node2"),  # Slurm's name and the host's agree
        ("gpu-017", "gpu-017.cluster.example.org", "gpu-017"),  # the host is an FQDN
        ("gpu017", "login-b3", "gpu017"),  # the host is named otherwise: Slurm's name wins
        (" node2\n", "x", "node2"),  # stray whitespace
        (None, "gpu-017.cluster.example.org", "gpu-017"),  # outside Slurm: the short name
        ("", "worker7", "worker7"),  # set but empty: as if unset
        ("   ", "worker7.lan", "worker7"),
        (None, "10.0.0.5", "10.0.0.5"),  # an address stays whole
        (None, "fe80::1", "fe80::1"),
        (None, "", ""),
    ],
    ids=[
        "same",
        "fqdn",
        "other-host-name",
        "whitespace",
        "no-slurm-fqdn",
        "empty-slurm-name",
        "blank-slurm-name",
        "ipv4",
        "ipv6",
        "no-name",
    ],
)
def test_node_name(slurmd_nodename: str | None, hostname: str, expected: str) -> None:
    """Failures and exclusions name a node as Slurm does (SLURMD_NODENAME), else by its short
    host name."""
    assert p.node_name(slurmd_nodename, hostname) == expected
