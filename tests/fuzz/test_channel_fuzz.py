"""The rank channel's receiving end under fuzzing, in-process: hostile messages mutated from
valid ones, over IPC and TCP, are each dropped and counted under the reason their mutation
implies, while the valid messages among them come through in order; a flood of them cannot
starve the event loop."""

from __future__ import annotations

import asyncio
import collections
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import pytest
import zmq
from hypothesis import example, given
from hypothesis import strategies as st

from supervisor.ranks.channel import HeartbeatEndpoint
from worker_sdk.contract import curve
from worker_sdk.contract import protocol as p

from .frames import FAKE_PID, Hostile, hostile, signed, valid
from .strategies import FUZZ

SECRET = bytes(range(32))
ATTEMPT = 3
_T = TypeVar("_T")


def _with_endpoint(
    tmp_path: Path,
    transport: str,
    body: Callable[[HeartbeatEndpoint, zmq.Socket[bytes]], Awaitable[_T]],
) -> _T:
    """Run ``body(endpoint, dealer)`` with a bound endpoint and a DEALER connected to it."""

    async def main() -> _T:
        endpoint = HeartbeatEndpoint(SECRET, sock_dir=tmp_path, tcp=transport == "tcp")
        endpoint.new_attempt(ATTEMPT)
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        if transport == "tcp":  # a peer holding the job's keys (strangers: test_listeners.py)
            curve.secure_client(dealer, curve.keys(SECRET, curve.RANKS))
        dealer.connect(endpoint.endpoint)
        try:
            return await body(endpoint, dealer)
        finally:
            dealer.close(linger=0)
            ctx.term()
            endpoint.close()

    return asyncio.run(main())


def _heartbeat(seq: int) -> bytes:
    return valid(SECRET, ATTEMPT, p.Kind.HEARTBEAT, seq, "")


_REGRESSIONS = [
    # found by this test: a correctly signed payload nested deeper than the JSON parser's
    # recursion limit raised RecursionError out of decode() (it would have ended the daemon's
    # receive loop); one nested less deeply decoded, and str() of it raised in RankTable
    Hostile((signed(SECRET, attempt=ATTEMPT, payload=b"[" * 3000 + b"]" * 3000),), "bad payload"),
    Hostile(
        (signed(SECRET, attempt=ATTEMPT, payload=b'{"host":' + b"[" * 950 + b"]" * 950 + b"}"),),
        "bad payload",
    ),
]


@FUZZ
@given(
    transport=st.sampled_from(["ipc", "tcp"]),
    messages=st.lists(hostile(SECRET, ATTEMPT), max_size=30),
    valid_every=st.integers(1, 8),
)
@example(transport="ipc", messages=_REGRESSIONS, valid_every=1)
def test_hostile_messages_are_dropped_and_counted_by_reason(
    tmp_path_factory: pytest.TempPathFactory,
    transport: str,
    messages: list[Hostile],
    valid_every: int,
) -> None:
    """Each hostile message is dropped and counted under its reason, nothing else is counted,
    and the valid heartbeats sent among them (one every ``valid_every``, then the same frames
    again as replays) are accepted once each, in order."""
    tmp = tmp_path_factory.mktemp("ch", numbered=True)
    sent: list[tuple[bytes, ...]] = []
    good: list[bytes] = []
    for i, message in enumerate(messages):
        if i % valid_every == 0:
            good.append(_heartbeat(len(good) + 1))
            sent.append((good[-1],))
        sent.append(message.parts)
    replays = [(frame,) for frame in good]
    last = _heartbeat(len(good) + 1)
    expected = collections.Counter(m.reason for m in messages)
    expected["replayed"] += len(replays)

    async def body(endpoint: HeartbeatEndpoint, dealer: zmq.Socket[bytes]) -> list[int]:
        for parts in [*sent, *replays, (last,)]:
            dealer.send_multipart(list(parts))
        steps: list[int] = []
        while not steps or steps[-1] != len(good) + 1:
            batch = await asyncio.wait_for(endpoint.receive_batch(), timeout=10)
            steps += [msg.step for _, msg in batch]
        assert endpoint.dropped == expected
        assert endpoint.accepted == len(good) + 1
        return steps

    steps = _with_endpoint(tmp, transport, body)
    assert steps == list(range(1, len(good) + 2))


def _garbage(n: int) -> list[bytes]:
    return [os.urandom(p.HEADER.size + p.MAC_BYTES + i % 50) for i in range(n)]


async def _queued_then(dealer: zmq.Socket[bytes], frames: list[bytes], endpoint: str) -> None:
    """Send ``frames`` and wait until the receiving end has them all queued."""
    for frame in frames:
        dealer.send(frame)
    await asyncio.sleep(0.5 if endpoint.startswith("ipc") else 1.0)


class _TurnCounter:
    """Another task of the event loop, counting the turns it gets while the block runs."""

    def __init__(self) -> None:
        self.turns = 0
        self._task: asyncio.Task[None] | None = None

    async def _spin(self) -> None:
        while True:
            self.turns += 1
            await asyncio.sleep(0)

    async def __aenter__(self) -> _TurnCounter:
        self._task = asyncio.ensure_future(self._spin())
        await asyncio.sleep(0)  # started
        self.turns = 0
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_flood_of_garbage_does_not_starve_the_event_loop(tmp_path: Path, transport: str) -> None:
    """While receive() works through thousands of queued bad frames (awaiting a queued frame
    does not yield), the event loop's other tasks still get turns."""
    n = 6000

    async def body(endpoint: HeartbeatEndpoint, dealer: zmq.Socket[bytes]) -> int:
        await _queued_then(dealer, [*_garbage(n), _heartbeat(1)], endpoint.endpoint)
        async with _TurnCounter() as other_task:
            _, msg = await asyncio.wait_for(endpoint.receive(), timeout=10)
        assert msg.step == 1 and endpoint.dropped.total() == n
        return other_task.turns

    turns = _with_endpoint(tmp_path, transport, body)
    assert turns >= n // 256 - 1, f"the event loop got {turns} turns during {n} drops"


def test_a_burst_of_valid_messages_lets_other_tasks_run_between_batches(tmp_path: Path) -> None:
    """receive_batch() returns at most its limit and yields to the event loop when frames are
    left, so a steady stream of heartbeats (thousands of ranks) cannot starve other tasks."""
    n = 2000

    async def body(endpoint: HeartbeatEndpoint, dealer: zmq.Socket[bytes]) -> tuple[int, int]:
        await _queued_then(dealer, [_heartbeat(i) for i in range(1, n + 1)], endpoint.endpoint)
        batches = received = 0
        async with _TurnCounter() as other_task:
            while received < n:
                batch = await asyncio.wait_for(endpoint.receive_batch(limit=100), timeout=10)
                received += len(batch)
                batches += 1
        return other_task.turns, batches

    turns, batches = _with_endpoint(tmp_path, "ipc", body)
    assert batches == n // 100
    assert turns >= batches - 1, f"{turns} turns of the event loop for {batches} batches"


def test_frames_above_the_socket_limit_drop_the_connection_and_nothing_else(
    tmp_path: Path,
) -> None:
    """A frame above the ROUTER's MAXMSGSIZE makes libzmq close that connection (nothing to
    count); the endpoint serves the next sender as before."""

    async def body(endpoint: HeartbeatEndpoint, dealer: zmq.Socket[bytes]) -> None:
        dealer.send(b"\0" * (64 * p.MAX_MESSAGE_BYTES + 1))
        ctx = zmq.Context()
        try:
            other = ctx.socket(zmq.DEALER)
            other.setsockopt(zmq.LINGER, 0)
            other.connect(endpoint.endpoint)
            other.send(valid(SECRET, ATTEMPT, p.Kind.HELLO, 1, "n1"))
            _, msg = await asyncio.wait_for(endpoint.receive(), timeout=10)
            other.close(linger=0)
        finally:
            ctx.term()
        assert (msg.kind, msg.pid, msg.payload) == (p.Kind.HELLO, FAKE_PID, {"host": "n1"})
        assert endpoint.dropped.total() == 0

    _with_endpoint(tmp_path, "ipc", body)
