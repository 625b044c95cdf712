"""Fakes for driving the stateful core (Attempt, Supervisor) in virtual time.

``FakeClock`` is a discrete-event clock: a sleeper wakes when its deadline is the earliest of all
sleepers, and time jumps there; nothing ever waits in real time. ``FakeChannel`` and ``FakeTree``
stand in for the ZeroMQ channel and the attempt's processes; a scenario (one per attempt) plays
the ranks: it sends messages and ends processes.
"""

from __future__ import annotations

import asyncio
import collections
import signal
from collections.abc import Awaitable, Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from supervisor.config.load import load_config
from supervisor.config.model import JobConfig
from supervisor.process.launch_plan import LaunchPlan
from supervisor.record.schema import ColdStart
from supervisor.rules.observation import RankExit
from tests.helpers.jobs import write_job_file
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

WORLD = 2


class FakeClock:
    """Virtual time: ``sleep`` returns once its deadline is the earliest pending one."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self._deadlines: list[float] = []

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return 1_800_000_000.0 + self.now

    async def sleep(self, seconds: float) -> None:
        deadline = self.now + max(0.0, seconds)
        self._deadlines.append(deadline)
        try:
            while True:
                for _ in range(3):  # let every runnable task move before time jumps
                    await asyncio.sleep(0)
                if deadline <= min(self._deadlines):
                    self.now = max(self.now, deadline)
                    return
        finally:
            self._deadlines.remove(deadline)

    async def until(self, t: float) -> None:
        """Sleep until virtual time ``t``."""
        await self.sleep(t - self.now)


class FakeChannel:
    """The rank channel: scenarios ``put`` messages, the core's replies are kept in ``sent``."""

    def __init__(self) -> None:
        self.endpoint = "ipc:///fake/hb.sock"
        self.accepted = 0
        self.dropped: collections.Counter[str] = collections.Counter()
        self.attempt = 0
        self.sent: list[tuple[int, p.Kind, int, int]] = []
        self._queue: asyncio.Queue[tuple[bytes, p.Message]] = asyncio.Queue()
        self._seq = 0
        self.fail_with: BaseException | None = None

    def new_attempt(self, attempt: int) -> None:
        self.attempt = attempt

    async def receive_batch(self) -> list[tuple[bytes, p.Message]]:
        """As the real channel: messages of an earlier attempt are not delivered (a late exit
        report quietly, anything else counted as dropped)."""
        batch: list[tuple[bytes, p.Message]] = []
        while not batch:
            items = [await self._queue.get()]
            if self.fail_with is not None:
                raise self.fail_with
            while not self._queue.empty():
                items.append(self._queue.get_nowait())
            for item in items:
                if item[1].attempt == self.attempt:
                    batch.append(item)
                elif item[1].kind is not p.Kind.RANK_EXIT:
                    self.dropped["other attempt"] += 1
        self.accepted += len(batch)
        return batch

    def send(self, identity: bytes, body: m.Body, *, rank: int) -> None:
        kind, step, _, flags, _ = m.fields(body)
        self.sent.append((rank, kind, step, flags))

    def put(
        self,
        rank: int,
        kind: p.Kind,
        *,
        step: int = -1,
        value: float = 0.0,
        payload: Mapping[str, object] | None = None,
    ) -> None:
        """A message from ``rank`` of the current attempt (pid 100 + rank)."""
        self._seq += 1
        msg = p.Message(
            kind, rank, self.attempt, 100 + rank, self._seq, step, value, 0, dict(payload or {})
        )
        self._queue.put_nowait((f"r{rank}".encode(), msg))

    def hello_all(self, resume_step: int = 0) -> None:
        for rank in range(WORLD):
            self.put(rank, p.Kind.HELLO, step=resume_step, payload={"host": "fakehost"})

    def steps(self, step: int, ranks: Iterable[int] = range(WORLD)) -> None:
        for rank in ranks:
            self.put(rank, p.Kind.HEARTBEAT, step=step, value=0.01)


@dataclass
class FakeTree:
    """One attempt's processes: nothing runs; the scenario says when things end."""

    plan: LaunchPlan
    host: str = "fakehost"
    launcher_rc: int | None = None
    lost: dict[str, str] = field(default_factory=dict)
    teardown_gate: asyncio.Event | None = None
    started: bool = False
    torn_down: bool = False
    stacks_collected: bool = False
    native_stacks: bool | None = None  # what the last collect_stacks was asked for
    steps_while_dumping: int | None = None
    """A step every rank's slot says once the stacks are collected (a stopped rank continued to
    dump goes on training)."""
    watched: dict[int, int] = field(default_factory=dict)
    clock: FakeClock | None = None
    foreseen: list[float] = field(default_factory=list)
    """When the attempt foresaw a hang (asked for early native stacks), in virtual time."""
    averted: list[float] = field(default_factory=list)
    """When it said that a hang it foresaw did not come (only after one was foreseen)."""
    held: int = 0
    """How often the attempt stopped its launcher (a rank killed by a signal)."""
    stderr: dict[int, str] = field(default_factory=dict)
    """Rank -> what it wrote to its stderr."""
    _exits: list[RankExit] = field(default_factory=list)
    _on_launcher_exit: Callable[[int], None] | None = None
    _on_rank_exit: Callable[[RankExit], None] | None = None

    def start(
        self, on_launcher_exit: Callable[[int], None], on_rank_exit: Callable[[RankExit], None]
    ) -> None:
        self.started = True
        self._on_launcher_exit = on_launcher_exit
        self._on_rank_exit = on_rank_exit

    def watch_rank(self, pid: int, rank: int, host: str) -> None:
        self.watched[pid] = rank

    def record(self, ended: RankExit) -> bool:
        if any(e.pid == ended.pid for e in self._exits):
            return False
        self._exits.append(ended)
        return True

    @property
    def exits(self) -> tuple[RankExit, ...]:
        return tuple(self._exits)

    def any_left_cleanly(self) -> bool:
        return any(e.exit_code == 0 for e in self._exits)

    def scan(self) -> None:
        return None

    def rank_pids(self) -> dict[int, int]:
        return {}  # nothing runs: no evidence, so a silence is judged as before (stuck)

    def foresee_hang(self, directory: Path) -> None:
        if not self.foreseen or (self.averted and self.averted[-1] > self.foreseen[-1]):
            self.foreseen.append(self.clock.monotonic() if self.clock else 0.0)

    def hold_launcher(self) -> None:
        self.held += 1

    def hang_averted(self) -> None:
        pending = self.foreseen and (not self.averted or self.foreseen[-1] > self.averted[-1])
        if pending:
            self.averted.append(self.clock.monotonic() if self.clock else 0.0)

    async def collect_stacks(self, directory: Path, *, native_stacks: bool) -> str | None:
        self.stacks_collected = True
        self.native_stacks = native_stacks
        if self.steps_while_dumping is not None:
            directory.mkdir(parents=True, exist_ok=True)
            for rank in range(WORLD):
                slot = directory / p.step_slot_file(rank)
                slot.write_bytes(self.steps_while_dumping.to_bytes(8, "little", signed=True))
        return str(directory)

    async def lost_nodes(self) -> dict[str, str]:
        return self.lost

    def oom_kills(self) -> tuple[int, str]:
        return 0, ""

    def stderr_tail(self, rank: int | None = None) -> str:
        return self.stderr.get(rank, "") if rank is not None else ""

    mechanism = "fake"

    async def teardown(self, *, lost_nodes: Collection[str] = ()) -> None:
        if self.teardown_gate is not None:
            await self.teardown_gate.wait()
        self.torn_down = True

    # what a scenario does
    def rank_ends(self, rank: int, *, code: int | None = None, sig: int | None = None) -> None:
        ended = RankExit(rank, 100 + rank, code, sig, self.host)
        if self.record(ended) and self._on_rank_exit is not None:
            self._on_rank_exit(ended)

    def launcher_ends(self, rc: int) -> None:
        self.launcher_rc = rc
        assert self._on_launcher_exit is not None
        self._on_launcher_exit(rc)

    def all_succeed(self) -> None:
        for rank in range(WORLD):
            self.rank_ends(rank, code=0)
        self.launcher_ends(0)

    def rank_killed(self, rank: int) -> None:
        self.rank_ends(rank, sig=signal.SIGKILL)
        self.launcher_ends(1)


Scenario = Callable[[FakeTree, FakeChannel, FakeClock], Awaitable[None]]


class FakeLaunches:
    """Attempt n plays ``scenarios[n - 1]`` (the last one again when they run out)."""

    def __init__(
        self, tmp: Path, channel: FakeChannel, clock: FakeClock, scenarios: list[Scenario]
    ) -> None:
        self.tmp = tmp
        self.channel = channel
        self.clock = clock
        self.scenarios = scenarios
        self.trees: list[FakeTree] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.lost: set[str] = set()
        self.nnodes = 1  # the nodes every attempt's plan says (its ranks: WORLD in all)

    @property
    def multi_node(self) -> bool:
        return False

    def plan(self, attempt: int, rank_env: Mapping[str, str]) -> LaunchPlan:
        nproc = WORLD // self.nnodes
        return LaunchPlan(
            ("torchrun",), dict(rank_env), self.tmp, self.tmp / "logs", self.nnodes, nproc
        )

    def tree(self, plan: LaunchPlan) -> FakeTree:
        tree = FakeTree(plan, clock=self.clock)
        scenario = self.scenarios[min(len(self.trees), len(self.scenarios) - 1)]
        self.trees.append(tree)
        self.tasks.append(asyncio.ensure_future(scenario(tree, self.channel, self.clock)))
        return tree

    def warm_up(self, plan: LaunchPlan) -> None:
        return None

    def cold_starts(self) -> list[ColdStart]:
        return []

    def lose(self, nodes: Iterable[str]) -> tuple[int, int] | None:
        self.lost.update(nodes)
        return None

    def usable_nodes(self) -> tuple[str, ...] | None:
        return None


class FakeNotifier:
    def __init__(self) -> None:
        self.statuses: list[str] = []

    def status(self, text: str) -> None:
        self.statuses.append(text)

    def stopping(self, status: str = "") -> None:
        self.statuses.append(status)


def job_config(tmp: Path, extra: str = "") -> JobConfig:
    """A job.toml in ``tmp`` with short backoffs (the clock is virtual anyway)."""
    (tmp / "runs").mkdir(exist_ok=True)
    (tmp / "ckpt").mkdir(exist_ok=True)
    path = write_job_file(
        tmp,
        command=["python", "train.py"],
        name="core",
        run_dir="runs",
        tables={"restart": 'max_restarts = 3\nbackoff = "1s"'},
        extra=extra,
    )
    return load_config(path)
