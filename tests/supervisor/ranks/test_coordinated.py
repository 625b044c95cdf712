"""The supervisor's half of a coordinated save: who is asked, what each SYNC is answered."""

from __future__ import annotations

import pytest

from supervisor.ranks.coordinated import SaveRound, answer_without_round
from supervisor.ranks.rank_table import RankTable
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p


class RecordingEndpoint:
    """Stands in for HeartbeatEndpoint: records what would be sent."""

    def __init__(self) -> None:
        self.sent: list[tuple[bytes, p.Kind, int, int, int]] = []

    def send(self, identity: bytes, body: m.Body, *, rank: int) -> None:
        kind, step, _, flags, _ = m.fields(body)
        self.sent.append((identity, kind, rank, step, flags))


def _msg(kind: p.Kind, rank: int, step: int, seq: int = 1) -> p.Message:
    return p.Message(kind, rank, 1, 100 + rank, seq, step)


def _table(world: int) -> RankTable:
    table = RankTable()
    for r in range(world):
        table.fold(f"id{r}".encode(), r, 100 + r, m.Hello(0, None), now=0.0)
    return table


def _round(stop: bool = True, world: int = 2) -> SaveRound:
    return SaveRound(stop=stop, world_size=world, resend_after_s=1.0)


def test_every_rank_is_asked_once_until_the_resend_interval() -> None:
    """ask_all sends SYNC_REQUEST (with the stop flag) to each rank; asking again within the
    resend interval sends nothing, after it sends again."""
    ep, table, rnd = RecordingEndpoint(), _table(2), _round()
    rnd.ask_all(ep, table, now=0.0)  # type: ignore[arg-type]
    assert [(s[1], s[2], s[4]) for s in ep.sent] == [
        (p.Kind.SYNC_REQUEST, 0, p.FLAG_STOP),
        (p.Kind.SYNC_REQUEST, 1, p.FLAG_STOP),
    ]
    rnd.ask(ep, table, 0, now=0.5)  # type: ignore[arg-type]
    assert len(ep.sent) == 2
    rnd.ask(ep, table, 0, now=1.5)  # type: ignore[arg-type]
    assert len(ep.sent) == 3


@pytest.mark.parametrize(
    ("reports", "answers", "target"),
    [
        # rank, step reported -> the answer's kind and step
        ([(0, 5), (1, 5)], [(p.Kind.CONTINUE, -1), (p.Kind.SAVE_AT, 6)], 6),
        ([(0, 5), (0, 6), (1, 6)], [(p.Kind.CONTINUE, -1)] * 2 + [(p.Kind.SAVE_AT, 7)], 7),
        (
            [(1, 9), (0, 8), (0, 9)],
            [(p.Kind.CONTINUE, -1), (p.Kind.SAVE_AT, 10)] * 1 + [(p.Kind.SAVE_AT, 10)],
            10,
        ),
    ],
)
def test_answers_continue_until_all_reported_then_the_common_step(
    reports: list[tuple[int, int]], answers: list[tuple[p.Kind, int]], target: int
) -> None:
    """CONTINUE until every rank reported; then SAVE_AT max(reported)+1 to everyone, no rank past it."""
    ep, rnd = RecordingEndpoint(), _round()
    for rank, step in reports:
        rnd.answer(ep, b"x", rank, m.Sync(step))  # type: ignore[arg-type]
    assert [(s[1], s[3]) for s in ep.sent] == answers
    assert rnd.target == target
    assert all(step < target for _, step in reports)


def test_a_rank_that_reported_is_not_asked_again() -> None:
    """After its SYNC, a rank gets no further SYNC_REQUEST (it would re-enter sync mode later)."""
    ep, table, rnd = RecordingEndpoint(), _table(2), _round()
    rnd.answer(ep, b"id0", 0, m.Sync(3))  # type: ignore[arg-type]
    ep.sent.clear()
    rnd.ask_all(ep, table, now=10.0)  # type: ignore[arg-type]
    assert [s[2] for s in ep.sent] == [1]


@pytest.mark.parametrize(("stop", "flags"), [(True, p.FLAG_STOP), (False, 0)])
def test_save_at_carries_the_stop_flag_only_for_stops(stop: bool, flags: int) -> None:
    """A time-based save keeps the ranks running; a stop makes them exit after the commit."""
    ep, rnd = RecordingEndpoint(), _round(stop=stop, world=1)
    rnd.answer(ep, b"x", 0, m.Sync(4))  # type: ignore[arg-type]
    assert ep.sent[-1][1:] == (p.Kind.SAVE_AT, 0, 5, flags)


@pytest.mark.parametrize(
    ("target", "step", "expected"),
    [(None, 5, False), (6, 5, False), (6, 6, True), (6, None, False)],
)
def test_committed_by(target: int | None, step: int | None, expected: bool) -> None:
    """Only a commit at or after the round's common step ends the round."""
    rnd = _round()
    rnd.target = target
    assert rnd.committed_by(step) is expected


def test_sync_without_a_round_is_cancelled() -> None:
    """A late SYNC (duplicate request seen after the round) is answered SYNC_CANCEL."""
    ep = RecordingEndpoint()
    answer_without_round(ep, b"id1", 1)  # type: ignore[arg-type]
    assert ep.sent == [(b"id1", p.Kind.SYNC_CANCEL, 1, -1, 0)]
