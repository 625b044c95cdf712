"""The supervisor's rank channel: the per-rank table and the authenticated ROUTER endpoint."""

from __future__ import annotations

import asyncio
import os
import stat
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import zmq

from supervisor.ranks.channel import HeartbeatEndpoint
from supervisor.ranks.rank_table import RankState, RankTable
from supervisor.ranks.reports import exit_from_report
from supervisor.rules.observation import RankExit
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

# ---------------------------------------------------------------- RankTable.observe


def _msg(kind: p.Kind, *, rank: int = 0, pid: int = 100, step: int = -1, **kw: Any) -> p.Message:
    return p.Message(kind, rank, attempt=1, pid=pid, seq=1, step=step, **kw)


def _observe(table: RankTable, identity: bytes, msg: p.Message, now: float) -> RankState:
    """What the attempt does with a rank's message: fold it into the table."""
    return table.fold(identity, msg.rank, msg.pid, m.read(msg), now)


def test_hello_creates_rank() -> None:
    """HELLO records host, pid, identity, resume step and makes 'now' the start of silence."""
    table = RankTable()
    st = _observe(table, b"id0", _msg(p.Kind.HELLO, step=11, payload={"host": "n1"}), 5.0)
    assert table.ranks == {0: st}
    assert (st.rank, st.pid, st.host, st.identity) == (0, 100, "n1", b"id0")
    assert st.resume_step == 11
    assert st.last_step == 10  # the checkpoint's step counts as finished
    assert (st.hello_t, st.last_seen_t, st.last_progress_t) == (5.0, 5.0, 5.0)
    assert st.first_step_t is None
    assert list(table) == [st]


def test_hello_fresh_start() -> None:
    """HELLO at step 0 (no checkpoint) leaves last_step at -1."""
    st = _observe(RankTable(), b"i", _msg(p.Kind.HELLO, step=0, payload={"host": "h"}), 1.0)
    assert st.last_step == -1


def test_heartbeat_progress_and_no_progress() -> None:
    """A heartbeat with a higher step is progress; one with the same step only a sign of life."""
    table = RankTable()
    _observe(table, b"i", _msg(p.Kind.HELLO, step=0), 1.0)
    st = _observe(table, b"i", _msg(p.Kind.HEARTBEAT, step=0, value=0.5), 2.0)
    assert (st.last_step, st.last_progress_t, st.first_step_t, st.last_seen_t) == (0, 2.0, 2.0, 2.0)
    st = _observe(table, b"i", _msg(p.Kind.HEARTBEAT, step=0, value=0.0), 3.0)
    assert (st.last_step, st.last_progress_t, st.last_seen_t) == (0, 2.0, 3.0)
    st = _observe(table, b"i", _msg(p.Kind.HEARTBEAT, step=4, value=0.7), 4.0)
    assert (st.last_step, st.last_progress_t, st.first_step_t) == (4, 4.0, 2.0)
    st = _observe(table, b"i", _msg(p.Kind.HEARTBEAT, step=3), 5.0)  # never goes back
    assert (st.last_step, st.last_progress_t, st.last_seen_t) == (4, 4.0, 5.0)


def test_unknown_rank_without_hello() -> None:
    """A heartbeat from a rank never seen still creates its state (host unknown)."""
    st = _observe(RankTable(), b"i", _msg(p.Kind.HEARTBEAT, rank=2, step=7), 9.0)
    assert (st.rank, st.host, st.last_step, st.last_progress_t) == (2, "?", 7, 9.0)


def test_step_times_collected() -> None:
    """Only positive HEARTBEAT durations are kept, the newest 256 per rank, across ranks."""
    table = RankTable()
    _observe(table, b"a", _msg(p.Kind.HEARTBEAT, rank=0, step=1, value=0.5), 1.0)
    _observe(table, b"a", _msg(p.Kind.HEARTBEAT, rank=0, step=2, value=0.0), 2.0)
    _observe(table, b"a", _msg(p.Kind.SYNC, rank=0, step=3, value=9.0), 3.0)
    _observe(table, b"b", _msg(p.Kind.HEARTBEAT, rank=1, pid=200, step=1, value=0.25), 1.0)
    assert (len(table.step_times), table.step_times.percentile(0.0)) == (2, 0.25)
    for i in range(300):
        _observe(table, b"a", _msg(p.Kind.HEARTBEAT, rank=0, step=10 + i, value=float(i + 1)), 4.0)
    kept = list(table.ranks[0].step_times)
    assert len(kept) == 256
    assert kept[-1] == 300.0 and kept[0] == 45.0
    assert len(table.step_times) == 257
    assert table.step_times.percentile(1.0) == 300.0
    assert table.step_times.percentile(0.0) == 0.25  # 0.5 and 1..44 were pushed out
    # rank 0 restarted as another process: its old samples no longer count
    _observe(table, b"c", _msg(p.Kind.HELLO, rank=0, pid=300), 5.0)
    assert (len(table.step_times), table.step_times.percentile(1.0)) == (1, 0.25)
    table.clear()
    assert table.step_times.percentile(0.5) is None


@pytest.mark.parametrize(
    ("ending", "clears"),
    [
        pytest.param(p.Kind.HEARTBEAT, True, id="heartbeat clears"),
        pytest.param(p.Kind.CKPT_COMMITTED, True, id="commit clears"),
        pytest.param(p.Kind.EXITING, True, id="exiting clears"),
        pytest.param(p.Kind.SYNC, False, id="sync keeps"),
    ],
)
def test_ckpt_begin_sets_saving_since(ending: p.Kind, clears: bool) -> None:
    """CKPT_BEGIN marks the rank as saving from 'now'; the next report (not SYNC) ends that."""
    table = RankTable()
    _observe(table, b"i", _msg(p.Kind.HEARTBEAT, step=5), 1.0)
    st = _observe(table, b"i", _msg(p.Kind.CKPT_BEGIN, step=5), 2.0)
    assert st.saving_since == 2.0
    assert st.last_progress_t == 1.0
    st = _observe(table, b"i", _msg(ending, step=5), 3.0)
    assert st.saving_since == (None if clears else 2.0)


def test_phase_begin_and_end() -> None:
    """PHASE begin names the phase, PHASE end clears it; both count as a sign of progress."""
    table = RankTable()
    _observe(table, b"i", _msg(p.Kind.HEARTBEAT, step=5), 1.0)
    st = _observe(table, b"i", _msg(p.Kind.PHASE, payload={"name": "eval", "begin": True}), 2.0)
    assert (st.phase, st.last_progress_t, st.last_step) == ("eval", 2.0, 5)
    st = _observe(table, b"i", _msg(p.Kind.PHASE, payload={"name": "eval", "begin": False}), 3.0)
    assert (st.phase, st.last_progress_t) == (None, 3.0)


def test_new_pid_replaces_rank_state() -> None:
    """A restarted rank (same rank, new pid) starts from a fresh state; identity follows."""
    table = RankTable()
    _observe(table, b"old", _msg(p.Kind.HEARTBEAT, step=40, value=1.0), 1.0)
    st = _observe(table, b"new", _msg(p.Kind.HELLO, pid=101, step=31, payload={"host": "n2"}), 2.0)
    assert (st.pid, st.identity, st.host, st.last_step, list(st.step_times)) == (
        101,
        b"new",
        "n2",
        30,
        [],
    )
    st = _observe(table, b"again", _msg(p.Kind.HEARTBEAT, pid=101, step=31), 3.0)
    assert st.identity == b"again"
    assert len(table.ranks) == 1
    table.clear()
    assert table.ranks == {}


@pytest.mark.parametrize(("total", "kept"), [(500, 500), (0, None), (True, None), ("9", None)])
def test_to_status(total: object, kept: int | None) -> None:
    """to_status reports ages relative to 'now', and the total the hello said when it is a
    whole number of steps above 0."""
    table = RankTable()
    hello = _msg(p.Kind.HELLO, step=0, payload={"host": "n1", "total_steps": total})
    _observe(table, b"i", hello, 1.0)
    st = _observe(table, b"i", _msg(p.Kind.HEARTBEAT, step=3), 2.0)
    assert st.to_status(4.5) == {
        "rank": 0,
        "pid": 100,
        "host": "n1",
        "last_step": 3,
        "heartbeat_age_s": 2.5,
        "progress_age_s": 2.5,
        "phase": None,
        "total_steps": kept,
    }


# ---------------------------------------------------------------- HeartbeatEndpoint

KEY = b"k" * 32
ATTEMPT = 3


def _good(seq: int, *, step: int = 1, attempt: int = ATTEMPT, key: bytes = KEY) -> bytes:
    return p.encode(key, p.Kind.HEARTBEAT, rank=0, attempt=attempt, pid=4242, seq=seq, step=step)


def _with_endpoint(tmp_path: Path, scenario: Callable[..., Any]) -> Any:
    """Run ``scenario(endpoint, dealer)`` in an event loop; everything is closed afterwards."""
    sock_dir = tmp_path / "s"
    sock_dir.mkdir(mode=0o700)

    async def main() -> Any:
        endpoint = HeartbeatEndpoint(KEY, sock_dir=sock_dir, tcp=False)
        ctx = zmq.Context()
        dealer = ctx.socket(zmq.DEALER)
        dealer.setsockopt(zmq.LINGER, 0)
        dealer.setsockopt(zmq.ROUTING_ID, b"rank-0")
        dealer.connect(endpoint.endpoint)
        try:
            endpoint.new_attempt(ATTEMPT)
            return await scenario(endpoint, dealer)
        finally:
            dealer.close(linger=0)
            ctx.term()
            endpoint.close()

    return asyncio.run(main())


async def _receive(endpoint: HeartbeatEndpoint) -> tuple[bytes, p.Message]:
    return await asyncio.wait_for(endpoint.receive(), timeout=10)


def test_endpoint_accepts_and_answers(tmp_path: Path) -> None:
    """A good message comes out with the sender's identity; send() reaches the DEALER."""

    async def scenario(endpoint: HeartbeatEndpoint, dealer: zmq.Socket[bytes]) -> None:
        assert endpoint.endpoint == f"ipc://{tmp_path / 's' / 'hb.sock'}"
        assert stat.S_IMODE((tmp_path / "s" / "hb.sock").stat().st_mode) == 0o600
        dealer.send(_good(1, step=12))
        identity, msg = await _receive(endpoint)
        assert identity == b"rank-0"
        assert (msg.kind, msg.rank, msg.pid, msg.seq, msg.step) == (
            p.Kind.HEARTBEAT,
            0,
            4242,
            1,
            12,
        )
        assert endpoint.accepted == 1
        assert sum(endpoint.dropped.values()) == 0
        endpoint.send(identity, m.SaveAt(20, stop=True), rank=0)
        assert dealer.poll(10_000)
        answer = p.decode(KEY, dealer.recv())
        assert (answer.kind, answer.step, answer.flags, answer.attempt, answer.pid) == (
            p.Kind.SAVE_AT,
            20,
            p.FLAG_STOP,
            ATTEMPT,
            os.getpid(),
        )

    _with_endpoint(tmp_path, scenario)


def _send_frame(frame: bytes) -> Callable[[zmq.Socket[bytes]], None]:
    return lambda dealer: dealer.send(frame)


DROPS = [
    pytest.param(_send_frame(_good(1, key=b"x" * 32)), "unauthenticated", id="wrong key"),
    pytest.param(_send_frame(_good(1, attempt=ATTEMPT - 1)), "other attempt", id="other attempt"),
    pytest.param(_send_frame(_good(0)), "replayed", id="sequence 0"),
    pytest.param(
        _send_frame(p.encode(KEY, p.Kind.CONTINUE, rank=0, attempt=ATTEMPT, pid=4242, seq=1)),
        "wrong direction",
        id="wrong direction kind",
    ),
    pytest.param(
        lambda dealer: dealer.send_multipart([b"extra", _good(1)]), "malformed", id="3 frames"
    ),
    pytest.param(_send_frame(os.urandom(300)), "unauthenticated", id="random bytes"),
    pytest.param(_send_frame(os.urandom(10)), "truncated", id="few random bytes"),
    pytest.param(_send_frame(b"z" * (p.MAX_MESSAGE_BYTES + 1)), "oversized", id="oversized frame"),
]


@pytest.mark.parametrize(("send_bad", "reason"), DROPS)
def test_endpoint_drops_by_reason(
    tmp_path: Path, send_bad: Callable[[zmq.Socket[bytes]], None], reason: str
) -> None:
    """A bad message is dropped and counted under its reason; the next good one comes out."""

    async def scenario(endpoint: HeartbeatEndpoint, dealer: zmq.Socket[bytes]) -> None:
        send_bad(dealer)
        dealer.send(_good(5, step=77))
        _, msg = await _receive(endpoint)
        assert (msg.seq, msg.step) == (5, 77)
        assert dict(endpoint.dropped) == {reason: 1}
        assert endpoint.accepted == 1

    _with_endpoint(tmp_path, scenario)


def test_endpoint_replay_window(tmp_path: Path) -> None:
    """A sequence number not above the sender's last is a replay; a new attempt resets that."""

    async def scenario(endpoint: HeartbeatEndpoint, dealer: zmq.Socket[bytes]) -> None:
        dealer.send(_good(5, step=1))
        assert (await _receive(endpoint))[1].seq == 5
        dealer.send(_good(5, step=2))  # the same frame again
        dealer.send(_good(4, step=3))  # an older one
        other = p.encode(KEY, p.Kind.HEARTBEAT, rank=0, attempt=ATTEMPT, pid=999, seq=1, step=4)
        dealer.send(other)  # another process of rank 0 has its own sequence
        assert (await _receive(endpoint))[1].pid == 999
        dealer.send(_good(6, step=5))
        assert (await _receive(endpoint))[1].seq == 6
        assert dict(endpoint.dropped) == {"replayed": 2}
        endpoint.new_attempt(ATTEMPT + 1)
        dealer.send(_good(1, attempt=ATTEMPT + 1))
        msg = (await _receive(endpoint))[1]
        assert (msg.attempt, msg.seq) == (ATTEMPT + 1, 1)
        assert endpoint.accepted == 4

    _with_endpoint(tmp_path, scenario)


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        ({"pid": 7, "code": None, "signal": 9, "host": "node2"}, RankExit(2, 7, None, 9, "node2")),
        ({"pid": 7, "code": 3, "signal": None, "host": "node2"}, RankExit(2, 7, 3, None, "node2")),
        ({"pid": 7, "code": 0, "signal": None, "host": "n"}, RankExit(2, 7, 0, None, "n")),
        ({"pid": "7", "code": 3, "signal": None, "host": "n"}, None),
        ({"pid": True, "code": 3, "signal": None, "host": "n"}, None),
        ({"pid": 7, "code": 3, "signal": 9, "host": "n"}, None),
        ({"pid": 7, "code": None, "signal": None, "host": "n"}, None),
        ({"pid": 7, "code": 1.5, "signal": None, "host": "n"}, None),
        ({"pid": 7, "code": 3, "signal": None, "host": ["n"]}, None),
        ({"pid": 7, "code": 3, "signal": None}, None),
        ({}, None),
    ],
)
def test_exit_from_report(payload: dict[str, Any], expected: RankExit | None) -> None:
    """A RANK_EXIT payload becomes a RankExit only when well-formed: int pid, exactly one of an
    int exit code and an int signal, a host name; anything else is ignored, never raises."""
    msg = p.Message(p.Kind.RANK_EXIT, 2, 1, 999, 1, payload=payload)
    assert exit_from_report(msg) == expected


@pytest.mark.serial  # all queued within 0.3 s
def test_receive_batch_takes_what_is_queued_in_one_wake_up(tmp_path: Path) -> None:
    """receive_batch() waits for one message, then returns every acceptable one already queued
    (bad ones dropped and counted), up to its limit, without waiting for more."""

    async def scenario(endpoint: HeartbeatEndpoint, dealer: zmq.Socket[bytes]) -> None:
        for seq in range(1, 6):
            dealer.send(_good(seq, step=seq))
        dealer.send(_good(1))  # a replay among them
        dealer.send(_good(6, step=6))
        await asyncio.sleep(0.3)  # all of them queued at the ROUTER
        batch = await asyncio.wait_for(endpoint.receive_batch(limit=4), timeout=10)
        assert [msg.step for _, msg in batch] == [1, 2, 3, 4]
        rest = await asyncio.wait_for(endpoint.receive_batch(), timeout=10)
        assert [msg.step for _, msg in rest] == [5, 6]
        assert endpoint.dropped["replayed"] == 1

    _with_endpoint(tmp_path, scenario)


def test_a_commit_ends_every_rank_s_save() -> None:
    """Seeing the checkpoint of step S committed ends the "saving" allowance of every rank that
    began saving S or earlier (a stopped rank's own next message may never arrive), not of a
    rank already saving a later step."""
    table = RankTable()
    for rank in (0, 1):
        _observe(table, b"x", _msg(p.Kind.CKPT_BEGIN, rank=rank, pid=100 + rank, step=299), 1.0)
    _observe(table, b"y", _msg(p.Kind.CKPT_BEGIN, rank=2, pid=102, step=374), 1.0)
    table.commit_seen(299)
    assert [st.saving_since for st in table] == [None, None, 1.0]


def test_a_save_is_timed_from_its_own_step_only() -> None:
    """The start of the save of step S is the earliest CKPT_BEGIN of S; a rank already saving a
    later step (an async save, a stop's save waiting for the one in flight) does not time S, so
    a commit seen by the watchdog is never credited with a later save's shorter duration."""
    table = RankTable()
    _observe(table, b"x", _msg(p.Kind.CKPT_BEGIN, rank=0, pid=100, step=20), 3.0)
    _observe(table, b"y", _msg(p.Kind.CKPT_BEGIN, rank=1, pid=101, step=10), 2.0)
    _observe(table, b"z", _msg(p.Kind.CKPT_BEGIN, rank=2, pid=102, step=10), 1.5)
    assert table.save_began(10) == 1.5
    assert table.save_began(20) == 3.0
    assert table.save_began(30) is None
    assert table.save_began(None) is None
