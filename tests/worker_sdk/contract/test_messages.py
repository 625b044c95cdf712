"""The typed wire messages (worker_sdk.contract.messages): one class per kind, each written and
read back unchanged through the authenticated frame, payloads read as leniently as before."""

from __future__ import annotations

import typing
from typing import Any

import pytest

from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

KEY = bytes(range(32))

EXAMPLES: list[m.Body] = [
    m.Hello(4, "node1", 1, 2, 100, "/tmp/out", "/tmp/err"),
    m.Hello(0, "node1", 0, 1, None, None, None),
    m.Heartbeat(17, 0.25, 1.5),
    m.Heartbeat(17, 0.0, None),
    m.Sync(9),
    m.CheckpointBegin(10),
    m.CheckpointCommitted(10, 1.5, "/ckpt/step-10", 1234, "async", 0.1),
    m.CheckpointExternal(10, 0.5, "/ckpt/step-10", "own/step-10.pt", 4321),
    m.CheckpointFailed(11, "OSError: [Errno 28] No space left on device"),
    m.CheckpointSkipped("/ckpt/step-9", "torn"),
    m.Loaded(10, "/ckpt/step-9", 2, None),
    m.Loaded(0, None, None, None),
    m.Loaded(12, "/dev/shm/rvsup-0-ab/step-11", 2, None, "memory"),
    m.Snapshots(11, 0.25, 12, 4096, 1, None),
    m.Snapshots(-1, 0.0, 0, None, 3, "OSError: [Errno 28] No space left on device"),
    m.Failure(3, "oom", "OutOfMemoryError", "CUDA out of memory"),
    m.Phase(5, "eval", True),
    m.Exiting(20, p.ExitingReason.STOP.value),
    m.RankExit(4321, None, 9, "node2", 12),
    m.RankExit(4321, 1, None, "node2", None),
    m.LossNonFinite(7, float("inf"), 6),
    m.ReplicasDiverged(30, (1, 3), 21),
    m.StepPrints(20, (0.6931471805599453, None, 1e-300), 31, -4616189618054758400, exact=True),
    m.StepPrints(5, (), None, None, exact=False),
    m.SyncRequest(stop=True),
    m.SyncRequest(stop=False),
    m.Continue(),
    m.SaveAt(40, stop=True),
    m.SyncCancel(),
    m.NodeBeat("node2"),
    m.NodeBeat("node2", "2,4321,17,0.25,120,1.5,,;3,4322,17,0.5,80,,0.01"),
    m.NodeBeat("node2", "", "2:17,3:-1", 2, "no memory cgroup", 17_179_869_184),
    m.NodeAsk(3, "2:4321,3:4322", 0.75),
    m.NodeAsk(4, "2:4321", 0.0, dump=True, native=True),
    m.NodeLook(3, 2, 0.75, "S", 0.01, "futex_wait", "pt_main\tS\tep_poll", True, False, "..."),
    m.NodeLook(4, 3, 0.0),
]


def _through_the_wire(body: m.Body) -> m.Body:
    frame = m.encode(KEY, body, rank=1, attempt=2, pid=99, seq=5)
    msg = p.decode(KEY, frame)
    assert (msg.kind, msg.rank, msg.attempt, msg.pid, msg.seq) == (body.KIND, 1, 2, 99, 5)
    return m.read(msg)


@pytest.mark.parametrize("body", EXAMPLES, ids=lambda b: type(b).__name__)
def test_every_message_comes_back_as_it_was_sent(body: m.Body) -> None:
    """Encoding a message and reading the decoded frame gives the same message back."""
    assert _through_the_wire(body) == body


def test_there_is_one_message_class_per_kind() -> None:
    """Every kind of the protocol has exactly one class, and every class is in the examples."""
    classes = typing.get_args(m.Body)
    assert sorted(c.KIND for c in classes) == sorted(p.Kind)
    assert {type(b) for b in EXAMPLES} == set(classes)


def _read(kind: p.Kind, payload: dict[str, Any], step: int = 3, value: float = 0.0) -> m.Body:
    return m.read(p.Message(kind, 0, 1, 100, 1, step, value, 0, payload))


@pytest.mark.parametrize(
    ("kind", "payload", "expected"),
    [
        (p.Kind.HELLO, {}, m.Hello(3, None)),
        (p.Kind.HELLO, {"host": 7, "total_steps": 0}, m.Hello(3, "7", total_steps=None)),
        (p.Kind.HELLO, {"total_steps": True, "stdout": 1}, m.Hello(3, None)),
        (p.Kind.HEARTBEAT, {"loss": True}, m.Heartbeat(3)),
        (p.Kind.HEARTBEAT, {"loss": 2}, m.Heartbeat(3, 0.0, 2.0)),
        (p.Kind.RANK_EXIT, {"pid": "1", "code": 1.5}, m.RankExit(None, None, None, None)),
        (p.Kind.RANK_EXIT, {"pid": 1, "code": 1.5, "host": "n"}, m.RankExit(None, None, None, "n")),
        (p.Kind.CKPT_COMMITTED, {}, m.CheckpointCommitted(3, 0.0, "")),
        (p.Kind.CKPT_FAILED, {}, m.CheckpointFailed(3, "None")),
        (p.Kind.FAILURE, {}, m.Failure(3, "exception", "", "")),
        (p.Kind.PHASE, {"name": "eval", "begin": 0}, m.Phase(3, "eval", False)),
        (p.Kind.EXITING, {"reason": 1}, m.Exiting(3, None)),
        (p.Kind.REPLICAS_DIVERGED, {"ranks": "1,x,-2,3"}, m.ReplicasDiverged(3, (1, 3), None)),
        (p.Kind.LOSS_NONFINITE, {"since": "2"}, m.LossNonFinite(3, 0.0, None)),
        (p.Kind.STEP_PRINTS, {"losses": 5, "exact": 0}, m.StepPrints(3, (), exact=True)),
        (
            p.Kind.STEP_PRINTS,
            {"losses": "1.5,,x,nan,inf,-2", "params_step": 7, "params": "12"},
            m.StepPrints(3, (1.5, None, None, None, None, -2.0), None, None, exact=True),
        ),
        (
            p.Kind.STEP_PRINTS,
            {"params_step": 7, "params": 12, "exact": False},
            m.StepPrints(3, (), 7, 12, exact=False),
        ),
    ],
)
def test_a_field_of_the_wrong_type_reads_as_absent(
    kind: p.Kind, payload: dict[str, Any], expected: m.Body
) -> None:
    """Payload fields are read as the supervisor always read them: what has the wrong type (a
    boolean for a number included) is absent, and strings are taken as they come."""
    assert _read(kind, payload) == expected
