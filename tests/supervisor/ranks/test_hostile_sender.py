"""A hostile sender on the rank channel of a running job: garbage, forgeries and replays are
dropped and counted by reason, nothing received is unpickled, and the job ends as if nothing
had happened (bit-identical to an uninterrupted run). Over IPC and over TCP."""

from __future__ import annotations

import ast
import collections
import json
import os
import pickle
import socket
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.helpers.harness import (
    REPO,
    dropped_since,
    events,
    named,
    running,
    status,
    wait_for,
    wait_progress,
    write_job,
)
from tests.helpers.states import assert_same_state, load_final
from worker_sdk.contract import curve
from worker_sdk.contract import protocol as p

pytestmark = pytest.mark.process

FAKE_PID = 4_000_000  # above any pid_max: no rank has it
TOTAL = 60  # as the reference run
HEADER_AND_MAC = p.HEADER.size + p.MAC_BYTES
# modules on the receiving path of the channel: none may be able to unpickle
RECEIVING_MODULES = (
    *sorted((REPO / "supervisor").rglob("*.py")),
    *sorted((REPO / "worker_sdk" / "contract").glob("*.py")),
    REPO / "worker_sdk" / "runtime" / "channel.py",
)
UNPICKLERS = frozenset({"pickle", "_pickle", "cPickle", "dill", "cloudpickle", "marshal", "shelve"})
ZMQ_UNPICKLING_CALLS = frozenset({"recv_pyobj", "recv_serialized"})


class _TouchWhenUnpickled:
    """Unpickling this creates ``path``: the evidence that something unpickled our bytes."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[Any, tuple[Path]]:
        return (Path.touch, (self.path,))


def _signed(
    secret: bytes,
    *,
    kind: int = int(p.Kind.HEARTBEAT),
    attempt: int,
    rank: int = 0,
    seq: int = 1,
    step: int = 1,
    magic: bytes = p.MAGIC,
    payload: bytes = b"",
) -> bytes:
    """A frame with a correct MAC over any header (even an invalid one) and raw payload bytes."""
    body = p.HEADER.pack(magic, kind, 0, rank, attempt, FAKE_PID, seq, step, 0.0) + payload
    return body + p.mac(secret, body)


def _hostile_frames(
    secret: bytes, attempt: int, marker: Path
) -> tuple[list[bytes], collections.Counter[str]]:
    """Single-frame messages to send, and the drop reasons they must be counted under."""
    valid = p.encode(secret, p.Kind.HEARTBEAT, rank=0, attempt=attempt, pid=FAKE_PID, seq=7)
    flipped = valid[:-1] + bytes([valid[-1] ^ 0xFF])
    blob = pickle.dumps(_TouchWhenUnpickled(marker))
    forged = p.encode(
        secret, p.Kind.HEARTBEAT, rank=0, attempt=attempt, pid=FAKE_PID, seq=1, step=10**9
    )
    cases = [
        (os.urandom(200), "unauthenticated"),  # random bytes
        (os.urandom(10), "truncated"),  # random bytes, shorter than a header
        (valid[: p.HEADER.size], "truncated"),  # a frame cut short
        (valid + b"\0" * (p.MAX_MESSAGE_BYTES + 1), "oversized"),
        (flipped, "unauthenticated"),  # bad MAC
        (
            p.encode(
                os.urandom(p.SECRET_BYTES), p.Kind.HELLO, rank=0, attempt=attempt, pid=1, seq=1
            ),
            "unauthenticated",
        ),  # well-formed, signed with another key
        (blob, "truncated" if len(blob) < HEADER_AND_MAC else "unauthenticated"),
        (_signed(secret, attempt=attempt, payload=blob), "bad payload"),  # signed pickle
        (_signed(secret, attempt=attempt, magic=b"RV9"), "bad magic"),
        (_signed(secret, attempt=attempt, kind=99), "unknown kind"),
        (_signed(secret, attempt=attempt, kind=int(p.Kind.SAVE_AT)), "wrong direction"),
        (_signed(secret, attempt=attempt + 7), "other attempt"),
        (forged, None),  # correctly signed: accepted once...
        (forged, "replayed"),  # ...and dropped when sent again
    ]
    expected = collections.Counter(reason for _, reason in cases if reason is not None)
    expected["malformed"] += 1  # the 3-frame multipart, sent separately
    return [frame for frame, _ in cases], expected


def _send(
    endpoint: str, frames: Sequence[bytes], *, multipart: Sequence[bytes], secret: bytes
) -> None:
    """One DEALER sends every frame, then one 3-frame multipart message; flushed on close.
    Over TCP it holds the job's CURVE keys (a stranger gets no frame in at all: below)."""
    ctx = zmq.Context()

    def dealer_socket() -> zmq.Socket[bytes]:
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 5000)
        if endpoint.startswith("tcp://"):
            curve.secure_client(sock, curve.keys(secret, curve.RANKS))
        sock.connect(endpoint)
        return sock

    try:
        dealer = dealer_socket()
        for frame in frames:
            dealer.send(frame)
        dealer.send_multipart(list(multipart))
        dealer.close()
        # a frame above the receiver's MAXMSGSIZE: zmq drops the connection, nothing is counted
        huge = dealer_socket()
        huge.send(os.urandom(2 * 2**20))
        huge.close()
    finally:
        ctx.term()


def _send_raw_tcp(endpoint: str) -> None:
    """Bytes that are not ZMTP (an HTTP request, then noise), straight to the TCP port."""
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    with socket.create_connection((host, int(port)), timeout=5) as conn:
        conn.sendall(b"GET / HTTP/1.0\r\n\r\n" + os.urandom(4096))


# TCP only: over IPC the same frames meet the same checks, and the live fuzz test
# (tests/fuzz/test_fuzz_live.py) counts each reason there, on both transports
@pytest.mark.parametrize("transport", ["tcp"])
def test_hostile_frames_are_dropped_counted_and_harmless(
    tmp_path: Path, reference_final: Path, transport: str
) -> None:
    """Random bytes, truncated, oversized, bad-MAC, wrong-key, pickled, other-attempt, replayed
    and multipart frames are each counted under their reason in `rvsup status`; a forged but
    correctly signed heartbeat moves no rank's reported step for good; nothing is unpickled;
    the daemon lives on and the job ends bit-identical to an uninterrupted run."""
    final = tmp_path / "final.pt"
    marker = tmp_path / "unpickled"
    slow = tmp_path / "slow"  # the steps take 0.25 s while it exists: time for the checks
    slow.touch()
    job = write_job(
        tmp_path,
        total=TOTAL,
        env={"FINAL": str(final), "STEP_SLEEP": "0.25", "SLOW_WHILE": str(slow)},
        heartbeat=f'interval = "0.2s"\nstartup_timeout = "60s"\ntransport = "{transport}"',
    )
    run_dir = tmp_path / "run"
    with running(job) as proc:
        first = wait_progress(job, min_step=3)
        pids = {r["rank"]: r["pid"] for r in first["ranks"]}
        endpoint = json.loads((run_dir / "daemon.json").read_text())["endpoint"]
        assert endpoint.startswith(f"{transport}://")
        secret = bytes.fromhex((run_dir / "secret").read_text())
        frames, expected = _hostile_frames(secret, first["attempt"], marker)
        before = dict(first["messages"]["dropped"])
        multipart = [frames[0], frames[0], frames[0]]
        _send(endpoint, frames, multipart=multipart, secret=secret)

        def all_counted() -> dict[str, Any] | None:
            st = status(job)
            dropped = dropped_since(before, st) if st else collections.Counter()
            return st if st and dropped.total() >= expected.total() else None

        st = wait_for(all_counted, timeout=30, what="every hostile frame counted", interval=0.2)
        assert dropped_since(before, st) == expected
        if transport == "tcp":
            # bytes that are no CURVE handshake (an HTTP request, noise, a plain ZMTP peer)
            # never reach the channel: the connection ends, nothing is counted
            _send_raw_tcp(endpoint)
            _send(endpoint, frames[:3], multipart=multipart, secret=b"not the job's secret")
            time.sleep(0.5)
            st = status(job)
            assert st is not None, "the daemon stopped answering"
            assert dropped_since(before, st) == expected
        assert proc.poll() is None, "the daemon died"

        def real_ranks_again() -> dict[str, Any] | None:
            st = status(job)
            if st is None or len(st["ranks"]) != 2:
                return None
            ranks = {r["rank"]: r for r in st["ranks"]}
            real = all(ranks[rank]["pid"] == pid for rank, pid in pids.items())
            return st if real and all(r["last_step"] < TOTAL for r in ranks.values()) else None

        wait_for(real_ranks_again, timeout=10, what="the forged heartbeat forgotten", interval=0.2)
        slow.unlink()  # the rest of the job at full speed
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out
    assert not marker.exists(), "something unpickled a received frame"
    evs = events(run_dir)
    assert not named(evs, "failure_detected") and named(evs, "job_succeeded")
    assert [e["last_step"] for e in named(evs, "job_succeeded")] == [TOTAL - 1]
    assert_same_state(load_final(reference_final), load_final(final))


def _unpickling_uses(path: Path) -> list[str]:
    """Imports of an unpickling module, and zmq calls that unpickle, in one source file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names if a.name.split(".")[0] in UNPICKLERS]
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in UNPICKLERS:
            found.append(str(node.module))
        elif isinstance(node, ast.Attribute) and node.attr in ZMQ_UNPICKLING_CALLS:
            found.append(node.attr)
    return found


@pytest.mark.parametrize("path", RECEIVING_MODULES, ids=lambda path: str(path.relative_to(REPO)))
def test_receiving_modules_have_no_unpickling_path(path: Path) -> None:
    """No supervisor module, nor the SDK's contract and channel, imports pickle (or a relative)
    or calls zmq's unpickling receives."""
    assert _unpickling_uses(path) == []


def test_unpickling_detector_finds_what_it_looks_for(tmp_path: Path) -> None:
    """The static check above sees `import pickle`, `from marshal import loads`, recv_pyobj."""
    source = tmp_path / "bad.py"
    source.write_text("import pickle\nfrom marshal import loads\nx = sock.recv_pyobj()\n")
    assert _unpickling_uses(source) == ["pickle", "marshal", "recv_pyobj"]


def test_signed_frame_helper_matches_the_protocol() -> None:
    """_signed() with a valid header is what protocol.encode() produces (so its variants are
    malformed only where they mean to be)."""
    secret = os.urandom(p.SECRET_BYTES)
    frame = _signed(secret, attempt=3, seq=5, step=9)
    expected = p.encode(secret, p.Kind.HEARTBEAT, rank=0, attempt=3, pid=FAKE_PID, seq=5, step=9)
    assert frame == expected
    assert p.decode(secret, frame).step == 9
