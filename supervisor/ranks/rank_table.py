"""The daemon's table of the current attempt's ranks: what each said last, folded from the
channel's messages (:mod:`.channel`) and its node agents' beats (:mod:`.agents`).

Every time in it is the daemon's monotonic clock at the moment a message was heard (for a
heartbeat an agent held, that moment less how long it held it): ranks' clocks are never
compared. A rank's last progress only moves forward, which lets the hang check keep a bound on
the oldest one (:mod:`.silence`). Step-time samples are bounded in all (a few MB however many
ranks).
"""

from __future__ import annotations

import collections
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from supervisor.rules.hangs import Silence, StepTimes
from worker_sdk.contract import messages as m

__all__ = ["RankState", "RankTable"]

_STEP_TIMES_KEPT = 256
_STEP_TIMES_MIN = 8
_STEP_TIMES_TOTAL = 1 << 17  # 131,072 samples: a few MB, however many ranks
_STEP_TIMES_EVERY = 4096  # ranks whose every heartbeat gives a sample


@dataclass(slots=True)
class RankState:
    """What the supervisor knows about one rank of the current attempt."""

    rank: int
    pid: int
    host: str
    identity: bytes
    hello_t: float
    resume_step: int = 0
    last_step: int = -1  # last finished step reported
    last_progress_t: float = 0.0  # when last_step last grew (or hello)
    last_seen_t: float = 0.0
    first_step_t: float | None = None
    phase: str | None = None
    total_steps: int | None = None  # what the script said it runs to (resume(total_steps=))
    saving_since: float | None = None
    saving_step: int = -1  # the step of the save that began at saving_since
    beats: int = 0  # heartbeats with a step time (for sampling them with many ranks)
    step_times: collections.deque[float] = field(
        default_factory=lambda: collections.deque(maxlen=_STEP_TIMES_KEPT)
    )

    def to_status(self, now: float) -> dict[str, Any]:
        return {
            "rank": self.rank,
            "pid": self.pid,
            "host": self.host,
            "last_step": self.last_step,
            "heartbeat_age_s": round(now - self.last_seen_t, 3),
            "progress_age_s": round(now - self.last_progress_t, 3),
            "phase": self.phase,
            "total_steps": self.total_steps,
        }


class RankTable:
    """Folds accepted messages into per-rank state. Owned by the supervisor."""

    def __init__(self) -> None:
        self.ranks: dict[int, RankState] = {}
        self.step_times = StepTimes()  # every rank's ``step_times``, sorted together
        self._started = 0  # ranks with a first finished step

    def clear(self) -> None:
        self.ranks.clear()
        self.step_times.clear()
        self._started = 0

    def __iter__(self) -> Iterator[RankState]:
        return iter(self.ranks.values())

    def last_steps(self) -> dict[int, int]:
        """Each rank's last finished step (-1: none yet)."""
        return {st.rank: st.last_step for st in self.ranks.values()}

    def nodes(self) -> dict[int, str]:
        """The host of each rank that said where it runs."""
        return {st.rank: st.host for st in self.ranks.values() if st.host != "?"}

    def fold(self, identity: bytes, rank: int, pid: int, body: m.Body, now: float) -> RankState:
        """Update the state of ``rank`` (process ``pid``) from one message it sent, heard
        ``now`` through ``identity``; returns it."""
        st = self.ranks.get(rank)
        if st is None or st.pid != pid:
            if st is not None:  # a new process for this rank: forget the old one's samples
                for seconds in st.step_times:
                    self.step_times.remove(seconds)
                self._started -= st.first_step_t is not None
            host = body.host if isinstance(body, m.Hello) and body.host is not None else "?"
            st = RankState(rank, pid, host, identity, now, last_progress_t=now)
            self.ranks[rank] = st
        st.identity = identity
        st.last_seen_t = now
        match body:
            case m.Hello():
                st.host = st.host if body.host is None else body.host
                st.total_steps = body.total_steps
                st.resume_step = body.step
                st.last_step = max(st.last_step, body.step - 1)
            case (
                m.Heartbeat()
                | m.Sync()
                | m.CheckpointCommitted()
                | m.CheckpointExternal()
                | m.Exiting()
            ):
                if isinstance(body, m.Heartbeat) and body.longest_step_s > 0:
                    self._add_step_time(st, body.longest_step_s)
                self._finished(st, body.step, now)
                if not isinstance(body, m.Sync):
                    st.saving_since = None
                if isinstance(body, m.Exiting):
                    st.phase = "exiting"  # leaving: its silence from now on is not a hang
            case m.CheckpointBegin():
                st.saving_since = now
                st.saving_step = body.step
            case m.Phase():
                st.phase = str(body.name) if body.begin else None
                # entering or leaving a phase is a sign of life
                st.last_progress_t = max(st.last_progress_t, now)
        return st

    def beat(
        self, identity: bytes, rank: int, pid: int, step: int, longest_s: float, now: float
    ) -> None:
        """:meth:`fold` for a heartbeat (its step and longest step), the message of thousands
        of ranks a second."""
        st = self.ranks.get(rank)
        if st is None or st.pid != pid:
            self.fold(identity, rank, pid, m.Heartbeat(step, longest_s), now)
            return
        st.identity = identity
        st.last_seen_t = now
        if longest_s > 0:
            self._add_step_time(st, longest_s)
        self._finished(st, step, now)
        st.saving_since = None

    def _finished(self, st: RankState, step: int, now: float) -> None:
        """``st``'s rank says it finished ``step`` (``now``): progress, if it is a new one."""
        if step > st.last_step:
            st.last_step = step
            st.last_progress_t = max(st.last_progress_t, now)
            if st.first_step_t is None:
                st.first_step_t = now
                self._started += 1

    def started(self, world_size: int) -> bool:
        """All ``world_size`` ranks have finished a first step."""
        return self._started >= world_size

    def exact_step(self, rank: int, step: object, now: float) -> None:
        """``rank``'s last finished step is ``step``, read ``now`` from its step slot or its exit
        report (anything but an int is ignored): progress, when later than its heartbeats said
        (a heartbeat of an earlier step, rate-limited, may come after it and is then none)."""
        if not isinstance(step, int) or isinstance(step, bool):
            return
        st = self.ranks.get(rank)
        if st is not None:
            self._finished(st, step, now)

    def commit_seen(self, step: int) -> None:
        """The checkpoint of ``step`` is committed, so every rank finished writing its part of it
        (they all agree before the commit): none of them is saving that step or an earlier one
        any more, even if its own next message never arrives (a rank stopped right after a save
        may leave it queued in its ZeroMQ I/O thread)."""
        for st in self.ranks.values():
            if st.saving_since is not None and st.saving_step <= step:
                st.saving_since = None

    def save_began(self, step: int | None) -> float | None:
        """When the first rank began saving ``step``, if some rank is still saving it. Only a save
        of that very step counts: with async saves, or a stop's save waiting for the one in
        flight, the ranks may already be saving a later step."""
        began = [
            st.saving_since
            for st in self.ranks.values()
            if st.saving_since is not None and st.saving_step == step
        ]
        return min(began) if began else None

    def silences(
        self, now: float, *, since: float, world_size: int, finishing: bool
    ) -> list[Silence]:
        """Every rank's silence for the hang check, ranks not heard from yet counted silent since
        ``since`` (the attempt's start). ``finishing``: a rank already left cleanly, so the others
        are busy ending, not hung."""
        out = [
            Silence(
                rank=st.rank,
                silent_s=now - st.last_progress_t,
                started=st.first_step_t is not None,
                busy=finishing or st.phase is not None or st.saving_since is not None,
            )
            for st in self.ranks.values()
        ]
        missing = set(range(world_size)) - set(self.ranks)
        out += [Silence(r, now - since, started=False, busy=False) for r in sorted(missing)]
        return out

    def _add_step_time(self, st: RankState, seconds: float) -> None:
        """Keep ``seconds``, a rank's longest step since its last heartbeat: its newest
        :data:`_STEP_TIMES_KEPT` samples, fewer with many ranks (all ranks together keep at
        most about :data:`_STEP_TIMES_TOTAL`, each at least :data:`_STEP_TIMES_MIN`). With more
        than :data:`_STEP_TIMES_EVERY` ranks, a rank's heartbeats are sampled in turn (every
        second one with twice as many ranks, ...): the percentile the hang timeout is drawn
        from sees as many samples a second however many ranks there are."""
        n = len(self.ranks)
        st.beats += 1
        if n > _STEP_TIMES_EVERY and st.beats % -(-n // _STEP_TIMES_EVERY):
            return
        keep = max(_STEP_TIMES_MIN, min(_STEP_TIMES_KEPT, _STEP_TIMES_TOTAL // n))
        while len(st.step_times) >= keep:
            self.step_times.remove(st.step_times.popleft())
        st.step_times.append(seconds)
        self.step_times.add(seconds)
