"""One attempt's hang check, run at every tick: a silence (:mod:`.silence`) judged stuck or busy
(:mod:`.slow`), with the early native stacks it asks the process tree for and the slow phases it
logs. It says when a silence is a hang, and collects and judges the stacks once one is. On
several nodes, the node agents (:mod:`.agents`) look at the ranks of the other nodes for it, and
an agent that falls silent loses its node.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Mapping
from pathlib import Path

from supervisor.agent import wire
from supervisor.config.model import HeartbeatSection
from supervisor.loops import run_beside
from supervisor.process import native
from supervisor.process.diagnostics import (
    DUMP_WAIT_S,
    note_stopped,
    read_flights,
    read_stacks,
    read_stopped,
    stacks_size,
)
from supervisor.process.tree import ProcessTree
from supervisor.ranks import slow
from supervisor.ranks.agents import AgentLook, NodeAgents, remote_ranks
from supervisor.ranks.channel import Channel
from supervisor.ranks.rank_table import RankTable
from supervisor.ranks.silence import Hung, SilenceWatch
from supervisor.ranks.slow import SlowWatch
from supervisor.record.events import EventLog
from supervisor.rules import culprits
from worker_sdk.contract import protocol as p

__all__ = ["HangCheck"]


class HangCheck:
    """The hang check of one attempt started at ``t0`` (see the module docstring)."""

    def __init__(
        self,
        hb: HeartbeatSection,
        ranks: RankTable,
        tree: ProcessTree,
        events: EventLog,
        *,
        world_size: int,
        diag_dir: Path,
        t0: float,
        channel: Channel,
    ) -> None:
        self.hb = hb
        self.ranks = ranks
        self.channel = channel
        self.agents = NodeAgents(channel, own_node=tree.host, interval_s=hb.interval_s)
        self.lost_agents: dict[str, str] = {}  # node -> how its agent was found silent
        self.tree = tree
        self.events = events
        self.diag_dir = diag_dir
        self.world_size = world_size
        self.silence = SilenceWatch(
            hb,
            ranks,
            world_size=world_size,
            t0=t0,
            # early native stacks; the hang rule's evidence window
            lead_s=max(native.LEAD_S if hb.native_stacks else 0.0, slow.LEAD_S),
        )
        self.slow = SlowWatch(
            diag_dir,
            cap_s=hb.hang_timeout_max_s,
            idle_cap_s=hb.hang_timeout_idle_s,
            remote=AgentLook(self.agents, ranks, tree.rank_pids),
        )

    def nodes_lost(self, now: float) -> bool:
        """Whether some node's agent fell silent (its node lost: :attr:`lost_agents` says how)."""
        self.lost_agents = self.agents.silent(now)
        return bool(self.lost_agents)

    def check(self, now: float) -> Hung | None:
        """The silence found, when it is to be declared a hang now; else None (no silence, not
        yet, or busy ranks: a slow phase, logged when it ends)."""
        found = self.silence.check(now, finishing=self.tree.any_left_cleanly())
        if found is None:
            self.tree.hang_averted()
            self.close_phase(now, finished=True)
            return None
        phase = self.slow.phase
        if self.hb.native_stacks and self.slow.native_due(now, native.LEAD_S):
            self.tree.foresee_hang(self.diag_dir)  # the native stacks, while the hang is confirmed
        stuck = self.slow.review(
            now,
            hung=bool(found.ranks),
            silent_s=max(s.silent_s for s in found.silences),
            review_s=self.silence.timeout_s or self.hb.startup_timeout_s,
            pids=self.tree.rank_pids(),
        )
        if stuck is None:
            if self.slow.phase is not None and phase is None:
                self.tree.hang_averted()  # busy: native stacks taken early are stale
            return None
        return found

    def close_phase(self, now: float, *, finished: bool) -> None:
        """Log the slow phase in progress, if any (``finished``: steps resumed)."""
        event = self.slow.close(now, finished=finished)
        if event is not None:
            self.events.log(event)

    async def diagnose(self) -> tuple[str | None, culprits.Verdict | None]:
        """A hang was declared: the ranks' stacks collected (their directory; None if none were),
        those of the other nodes' ranks by their agents, and who hung the group, judged from
        them."""
        by_node = remote_ranks(self.ranks, self.agents, self.tree.rank_pids())
        sizes = {
            rank: stacks_size(self.diag_dir, rank) for ranks in by_node.values() for rank in ranks
        }
        native_stacks = self.hb.native_stacks
        request = self.agents.ask(by_node, window_s=0.0, dump=True, native=native_stacks)
        diagnostics = await self.tree.collect_stacks(self.diag_dir, native_stacks=native_stacks)
        if sizes:
            wait_s = 2 * DUMP_WAIT_S + (native.NATIVE_WAIT_S if native_stacks else 0.0) + 1.0
            hear = {"agents": self._hear_agents()}
            looks = await run_beside(self.agents.wait(request, wait_s), hear)
            if self._record(looks, sizes):
                diagnostics = str(self.diag_dir)
        verdict = culprits.judge(
            read_stacks(self.diag_dir, self.world_size),
            read_stopped(self.diag_dir, self.world_size),
            read_flights(self.diag_dir, self.world_size),
        )
        return diagnostics, verdict

    async def _hear_agents(self) -> None:
        """The channel's messages while the agents collect: theirs are taken, the ranks' are
        not (their steps were fixed when the hang was caught)."""
        while True:
            for identity, msg in await self.channel.receive_batch():
                if msg.rank < 0:
                    self.agents.heard(identity, msg, time.monotonic())

    def _record(self, looks: Mapping[int, wire.Look], sizes: Mapping[int, int]) -> bool:
        """The stacks the agents sent (Python, and native), written where the ranks' own files
        would be unless the ranks or the agents wrote them there themselves (a run directory
        every node shares); whether any stacks are in the directory."""
        written = False
        for rank, look in looks.items():
            with contextlib.suppress(OSError):
                self.diag_dir.mkdir(parents=True, exist_ok=True)
                if look.stacks and stacks_size(self.diag_dir, rank) == sizes.get(rank, 0):
                    with open(self.diag_dir / p.stacks_file(rank), "a", encoding="utf-8") as f:
                        f.write(look.stacks)
                native_path = self.diag_dir / native.native_file(rank)
                if look.native and not native_path.exists():
                    native_path.write_text(look.native, encoding="utf-8")
                if look.stopped:  # the agent's note, where it could not write it here
                    note_stopped(self.diag_dir, rank)
                written = written or stacks_size(self.diag_dir, rank) > 0
        return written
