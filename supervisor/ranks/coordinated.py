"""The supervisor's half of a coordinated save (a stop, or a time-based checkpoint).

Every rank must save at the same step, or one would block in a collective the others skip. The
supervisor sends SYNC_REQUEST; from its next heartbeat on each rank reports every finished step with
SYNC and waits for the answer. Until all ranks have reported, the answer is CONTINUE; then every rank
is told SAVE_AT ``max(reported) + 1``. A rank waits after each report, so none can be past that step.
A SYNC that arrives when no round is open is answered SYNC_CANCEL (a duplicate request the rank saw
late). The rank's half is in ``worker_sdk.runtime.runtime``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from supervisor.ranks.channel import Channel
from supervisor.ranks.rank_table import RankTable
from worker_sdk.contract import messages as m

__all__ = ["SaveRound", "Saves", "answer_without_round"]


@dataclass(slots=True)
class SaveRound:
    """One coordinated save in progress."""

    stop: bool  # the ranks exit once the checkpoint is committed
    world_size: int
    resend_after_s: float  # a rank not yet reporting is asked again after this long
    reported: dict[int, int] = field(default_factory=dict)  # rank -> last step it reported
    asked_t: dict[int, float] = field(default_factory=dict)
    target: int | None = None  # the step every rank saves after, once known

    def ask(self, endpoint: Channel, ranks: RankTable, rank: int, now: float) -> None:
        """Send SYNC_REQUEST to ``rank`` unless it already reported or was asked recently."""
        st = ranks.ranks.get(rank)
        if st is None or rank in self.reported:
            return
        if now - self.asked_t.get(rank, -1e9) < self.resend_after_s:
            return
        self.asked_t[rank] = now
        endpoint.send(st.identity, m.SyncRequest(self.stop), rank=rank)

    def ask_all(self, endpoint: Channel, ranks: RankTable, now: float) -> None:
        for st in ranks:
            self.ask(endpoint, ranks, st.rank, now)

    def answer(self, endpoint: Channel, identity: bytes, rank: int, sync: m.Sync) -> None:
        """Record ``rank``'s SYNC and answer it: CONTINUE, or SAVE_AT the common step."""
        self.reported[rank] = max(sync.step, self.reported.get(rank, -1))
        if self.target is None and len(self.reported) >= self.world_size:
            self.target = max(self.reported.values()) + 1
        if self.target is None:
            endpoint.send(identity, m.Continue(), rank=rank)
        else:
            endpoint.send(identity, m.SaveAt(self.target, self.stop), rank=rank)

    def committed_by(self, step: int | None) -> bool:
        """Whether a commit of ``step`` is this round's checkpoint."""
        return self.target is not None and step is not None and step >= self.target


def answer_without_round(endpoint: Channel, identity: bytes, rank: int) -> None:
    """Answer a SYNC of ``rank`` that came when no round is open: leave sync mode."""
    endpoint.send(identity, m.SyncCancel(), rank=rank)


class Saves:
    """One attempt's coordinated saves: the round in progress, if any, begun every ``every_s``
    (None: never) or for a stop."""

    def __init__(
        self,
        endpoint: Channel,
        ranks: RankTable,
        *,
        world_size: int,
        resend_after_s: float,
        every_s: float | None,
    ) -> None:
        self.endpoint = endpoint
        self.ranks = ranks
        self.world_size = world_size
        self.resend_after_s = resend_after_s
        self.every_s = every_s
        self.round: SaveRound | None = None

    def ask(self, rank: int, now: float) -> None:
        """In a round, ask ``rank`` to report its step (unless asked recently)."""
        if self.round is not None:
            self.round.ask(self.endpoint, self.ranks, rank, now)

    def answer(self, identity: bytes, rank: int, sync: m.Sync) -> None:
        """A rank reported its step: its part of the round (or go on, without one)."""
        if self.round is None:
            answer_without_round(self.endpoint, identity, rank)
        else:
            self.round.answer(self.endpoint, identity, rank, sync)

    def due(self, now: float, last_commit_t: float) -> bool:
        """A timed save is due: ``every_s`` since the last commit, and no round in progress."""
        every = self.every_s
        return every is not None and self.round is None and now - last_commit_t >= every

    def begin(self, *, stop: bool, now: float) -> None:
        """Start a round (``stop``: the ranks exit after its checkpoint) and ask every rank."""
        self.round = SaveRound(
            stop=stop,
            world_size=self.world_size,
            resend_after_s=self.resend_after_s,
        )
        self.round.ask_all(self.endpoint, self.ranks, now)

    def finished_by(self, step: int) -> bool:
        """A timed round is over with the commit of ``step`` (it is then forgotten)."""
        if self.round is not None and not self.round.stop and self.round.committed_by(step):
            self.round = None
            return True
        return False

    def committed_by(self, step: int | None) -> bool:
        """The round in progress (a stop's) committed its checkpoint at ``step``."""
        return self.round is not None and self.round.committed_by(step)
