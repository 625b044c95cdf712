"""A real node agent (``python -m supervisor.agent``) against the daemon's real end of the
channel: it beats, its silence loses its node, it looks at the ranks of its node for the hang
rule and collects their stacks for a declared hang. The ranks are stand-in processes (the hang
rule's own: tests/helpers/stand_in_ranks.py)."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import zmq

from supervisor.agent import wire
from supervisor.process.native import find_py_spy
from supervisor.ranks.agents import AgentLook, NodeAgents
from supervisor.ranks.channel import HeartbeatEndpoint
from supervisor.ranks.rank_table import RankState, RankTable
from supervisor.ranks.slow import MIN_WINDOW_S, SlowWatch
from tests.helpers.memory_cgroup import limited
from tests.helpers.stand_in_ranks import ranks
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

pytestmark = pytest.mark.process

INTERVAL_S = 0.2
NODE, OWN = "node2", "node1"


@contextmanager
def agent_process(
    tmp: Path,
    endpoint: str,
    *,
    node_id: int = 1,
    ranks_socket: Path | None = None,
    group: Path | None = None,
    interval_s: float = INTERVAL_S,
) -> Iterator[subprocess.Popen[bytes]]:
    """The agent of ``NODE`` (SLURM_NODEID ``node_id``) of attempt 1, ended at the end; with
    ``ranks_socket``, the node's ranks talk to the daemon through it there; with ``group``,
    it runs in that cgroup (placed there before it starts); it beats every ``interval_s``."""
    relay = {} if ranks_socket is None else {p.ENV_AGENT_SOCKET: str(ranks_socket)}
    env = {
        **os.environ,
        **relay,
        p.ENV_ENDPOINT: endpoint,
        p.ENV_SECRET_FILE: str(tmp / "secret"),
        p.ENV_ATTEMPT: "1",
        p.ENV_DIAGNOSTICS_DIR: str(tmp),
        p.ENV_HEARTBEAT_INTERVAL: repr(interval_s),
        "SLURM_NODEID": str(node_id),
        "SLURMD_NODENAME": NODE,
    }
    proc = subprocess.Popen(_in_group(group, [sys.executable, "-m", "supervisor.agent"]), env=env)
    try:
        yield proc
    finally:
        proc.kill()
        proc.wait()


@contextmanager
def rank_side(tmp: Path) -> Iterator[tuple[bytes, Path, zmq.Socket[bytes]]]:
    """What a rank of the agent's node has: the job's key, a private folder for the agent's
    ranks socket, and an unconnected DEALER; all gone at the end."""
    key = p.read_secret(str(tmp / "secret"))
    sock_dir = Path(tempfile.mkdtemp(prefix="rvsup-test-"))
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    try:
        yield key, sock_dir, sock
    finally:
        sock.close()
        ctx.term()
        shutil.rmtree(sock_dir, ignore_errors=True)


def _in_group(group: Path | None, argv: list[str]) -> list[str]:
    """``argv``, run in the cgroup ``group`` (None: where it is started)."""
    if group is None:
        return argv
    return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(group), *argv]


class Daemon:
    """The daemon's side: its channel, the attempt's agents and rank table."""

    def __init__(self, tmp: Path) -> None:
        secret = p.new_secret()
        p.write_secret(str(tmp / "secret"), secret)
        self.endpoint = HeartbeatEndpoint(secret, sock_dir=tmp, tcp=False)
        self.endpoint.new_attempt(1)
        self.agents = NodeAgents(self.endpoint, own_node=OWN, interval_s=INTERVAL_S)
        self.table = RankTable()
        self.passed_on: list[p.Message] = []
        self.look_requests: list[int] = []

    async def hear_until(self, done: Callable[[], bool], timeout_s: float = 20.0) -> None:
        """Take the agents' messages until ``done()`` (the ranks' they pass on are kept in
        :attr:`passed_on`)."""
        deadline = time.monotonic() + timeout_s
        while not done():
            left = deadline - time.monotonic()
            assert left > 0, "the agent did not answer in time"
            try:
                batch = await asyncio.wait_for(self.endpoint.receive_batch(), left)
            except TimeoutError:
                continue
            for identity, msg in batch:
                if msg.rank >= 0:
                    self.passed_on.append(msg)
                    continue
                assert msg.rank == p.agent_rank(1)
                if msg.kind is p.Kind.NODE_LOOK:
                    self.look_requests.append(msg.step)  # the request a look answers
                self.agents.heard(identity, msg, time.monotonic())


def run(tmp: Path, scenario: Callable[[Daemon], object]) -> None:
    async def main() -> None:
        daemon = Daemon(tmp)
        try:
            await scenario(daemon)  # type: ignore[misc]
        finally:
            daemon.endpoint.close()

    asyncio.run(main())


def test_the_agent_beats_and_its_node_is_lost_once_it_falls_silent(tmp_path: Path) -> None:
    """The agent beats every interval with its node's name; killed, its node is lost after
    the silence limit, and the finding says how; before that, nothing is lost."""

    async def scenario(d: Daemon) -> None:
        with agent_process(tmp_path, d.endpoint.endpoint) as agent:
            await d.hear_until(lambda: NODE in d.agents.agents)
            first = d.agents.agents[NODE].last_t
            await d.hear_until(lambda: d.agents.agents[NODE].last_t > first)
            assert d.agents.silent(time.monotonic()) == {}
            agent.kill()
            agent.wait()
            gone = d.agents.agents[NODE].last_t
        assert d.agents.silent(gone + d.agents.limit_s - 0.1) == {}
        lost = d.agents.silent(gone + d.agents.limit_s + 0.1)
        assert list(lost) == [NODE]
        assert "node agent sent nothing for 3.1 s" in lost[NODE]

    run(tmp_path, scenario)


def test_the_agent_counts_its_nodes_oom_kills_and_beats_at_once_after_an_exit(
    tmp_path: Path,
) -> None:
    """In the node's memory group (``rvsup-node-PID``, limited here), a process the kernel's
    OOM killer kills is counted in the agent's next beat, with the memory available; a rank's
    exit report passed on is followed by a beat at once, long before the next one is due."""
    with limited(256 << 20, "node") as group:

        async def scenario(d: Daemon) -> None:
            with (
                rank_side(tmp_path) as (key, sock_dir, parent),
                agent_process(
                    tmp_path,
                    d.endpoint.endpoint,
                    ranks_socket=sock_dir / "r.sock",
                    group=group,
                    interval_s=60.0,  # its first beat at once, the next a minute later
                ),
            ):
                await d.hear_until(lambda: NODE in d.agents.agents)
                agent = d.agents.agents[NODE]
                assert (agent.oom_kills, agent.oom_host_wide) == (0, "")
                assert agent.memory_available > 0
                hog = subprocess.run(
                    _in_group(group, [sys.executable, "-c", "b'x' * (1 << 30)"]), check=False
                )
                assert hog.returncode == -signal.SIGKILL
                parent.connect(f"ipc://{sock_dir / 'r.sock'}")
                report = m.RankExit(4242, None, signal.SIGKILL, NODE, 7)
                parent.send(m.encode(key, report, rank=3, attempt=1, pid=4242, seq=1))
                await d.hear_until(lambda: agent.oom_kills == 1, timeout_s=10.0)
                assert [msg.kind for msg in d.passed_on] == [p.Kind.RANK_EXIT]

        run(tmp_path, scenario)


def test_the_daemons_own_lateness_loses_no_node(tmp_path: Path) -> None:
    """When the agent of the daemon's own node is as late as another's, the daemon was held
    up: no node is lost."""

    async def scenario(d: Daemon) -> None:
        d.agents.own_node = NODE  # the agent heard is the daemon's own node's
        with agent_process(tmp_path, d.endpoint.endpoint):
            await d.hear_until(lambda: NODE in d.agents.agents)
        later = d.agents.agents[NODE].last_t + 60
        assert d.agents.silent(later) == {}

    run(tmp_path, scenario)


def _judge(
    d: Daemon, tmp: Path, local: dict[int, int], *, remote: bool
) -> asyncio.Future[SlowWatch]:
    """A silence judged at its timeout by the daemon's hang rule, with the agent's look at the
    other node's ranks or without it."""

    async def judge() -> SlowWatch:
        look = AgentLook(d.agents, d.table, lambda: local) if remote else None
        watch = SlowWatch(tmp, cap_s=60.0, remote=look)
        t0 = time.monotonic()
        assert watch.review(t0, hung=False, silent_s=4.0, review_s=5.0, pids=local) is None
        await asyncio.sleep(MIN_WINDOW_S + 0.1)
        while True:
            stuck = watch.review(
                time.monotonic(), hung=True, silent_s=5.0, review_s=5.0, pids=local
            )
            if stuck is not None or watch.phase is not None:
                watch.note = "" if stuck is None else stuck.detail
                return watch
            await asyncio.sleep(0.05)

    return asyncio.ensure_future(judge())


def test_a_rank_working_on_another_node_makes_the_silence_busy(tmp_path: Path) -> None:
    """Rank 0 (the daemon's node) waits in a collective while rank 1, on the agent's node,
    computes: the group is busy, a slow phase naming rank 1 where it works. Without the
    agent's look, the same group is judged stuck."""
    with ranks(tmp_path, ["collective", "spin"]) as pids:
        by_rank = {rank: pid for pid, rank in pids.items()}
        local = {by_rank[0]: 0}

        async def scenario(d: Daemon) -> None:
            d.table.ranks[1] = RankState(1, by_rank[1], NODE, b"", 0.0)
            d.table.ranks[0] = RankState(0, by_rank[0], OWN, b"", 0.0)
            with agent_process(tmp_path, d.endpoint.endpoint):
                await d.hear_until(lambda: NODE in d.agents.agents)
                blind = await _judge(d, tmp_path, local, remote=False)
                judging = _judge(d, tmp_path, local, remote=True)
                await d.hear_until(judging.done)
                seen = judging.result()
            assert blind.phase is None
            assert "rank 0 waits in collectives and nothing else runs" in blind.note
            assert seen.phase is not None, seen.note
            assert seen.phase.ranks == (1,)
            assert "rank 1 is working" in seen.phase.detail

        run(tmp_path, scenario)


def test_the_agent_collects_a_stopped_ranks_stacks_for_a_declared_hang(tmp_path: Path) -> None:
    """Asked to collect for a hang, the agent says which rank is stopped and sends the stacks
    it made that rank write (continued for the moment of its dump, then stopped again); asked
    for native stacks too, it sends py-spy's (or why there are none) where py-spy is here."""
    with ranks(tmp_path, ["stop", "sleep"]) as pids:

        async def scenario(d: Daemon) -> None:
            with agent_process(tmp_path, d.endpoint.endpoint):
                await d.hear_until(lambda: NODE in d.agents.agents)
                request = d.agents.ask(
                    {NODE: {r: pid for pid, r in pids.items()}},
                    window_s=0.0,
                    dump=True,
                    native=True,
                )
                await d.hear_until(lambda: d.agents.answered(request))
            looks = d.agents.looks(request)
            assert looks[0].stopped and not looks[1].stopped
            assert "Current thread" in looks[0].stacks or "Thread 0x" in looks[0].stacks
            assert "time.sleep" in looks[1].stacks or "<module>" in looks[1].stacks
            assert all(_state(pid) == "T" for pid, r in pids.items() if r == 0)
            if find_py_spy() is not None:
                assert "sleep" in looks[1].native or "no native stacks" in looks[1].native
                assert looks[0].native  # the stopped one: its Python stacks, or why none
            else:
                assert looks[1].native == ""

        run(tmp_path, scenario)


def test_the_agent_answers_only_its_jobs_daemon_and_ends_on_sigterm(tmp_path: Path) -> None:
    """A request authenticated with another key is not answered, nor one with the job's key
    that repeats the number of a request already taken (a replay); the ones after each, from
    the daemon, are; SIGTERM ends the agent with status 0, its ranks' socket and its folder
    removed."""
    sock_dir = Path(tempfile.mkdtemp(prefix="rvsup-test-"))
    with ranks(tmp_path, ["sleep"]) as pids:

        async def scenario(d: Daemon) -> None:
            socket_path = sock_dir / "r.sock"
            with agent_process(tmp_path, d.endpoint.endpoint, ranks_socket=socket_path) as agent:
                await d.hear_until(lambda: NODE in d.agents.agents)
                identity = d.agents.agents[NODE].identity
                key = p.read_secret(str(tmp_path / "secret"))
                by_rank = {r: pid for pid, r in pids.items()}
                for sent_by, number in ((p.new_secret(), 99), (key, 77)):  # a stranger, a replay
                    forged = m.encode(
                        sent_by, m.NodeAsk(number, ",".join(f"0:{pid}" for pid in pids), 0.0, dump=True),
                        rank=p.agent_rank(1), attempt=1, pid=1, seq=1,
                    )  # fmt: skip
                    d.endpoint._sock.send_multipart([identity, forged])
                    request = d.agents.ask({NODE: by_rank}, window_s=0.1)  # numbered past it
                    await d.hear_until(lambda: d.agents.answered(request))  # noqa: B023
                assert d.look_requests == [1, 2]  # neither 99 nor 77
                assert socket_path.exists()
                agent.send_signal(signal.SIGTERM)
                assert agent.wait(timeout=10) == 0
            assert not sock_dir.exists()

        try:
            run(tmp_path, scenario)
        finally:
            shutil.rmtree(sock_dir, ignore_errors=True)


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        stat = f.read()
    return stat[stat.rfind(")") + 2]


def test_the_node_wrapper_starts_the_agent_beside_its_command_and_ends_it(tmp_path: Path) -> None:
    """``node_group --agent`` starts the node's agent beside the command (it beats while the
    command runs) and ends it with the command: no agent is left once the wrapper ended."""

    async def scenario(d: Daemon) -> None:
        env = {
            **os.environ,
            p.ENV_ENDPOINT: d.endpoint.endpoint,
            p.ENV_SECRET_FILE: str(tmp_path / "secret"),
            p.ENV_ATTEMPT: "1",
            p.ENV_DIAGNOSTICS_DIR: str(tmp_path),
            p.ENV_HEARTBEAT_INTERVAL: repr(INTERVAL_S),
            "SLURM_NODEID": "1",
            "SLURMD_NODENAME": NODE,
        }
        release = tmp_path / "release"
        wait = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.02)"
        argv = ["-m", "worker_sdk.spawn.node_group", "5", "--agent", sys.executable, "-c", wait]
        wrapper = subprocess.Popen([sys.executable, *argv], env=env)
        try:
            await d.hear_until(lambda: NODE in d.agents.agents)
            agent_pid = d.agents.agents[NODE].pid
            assert agent_pid != wrapper.pid
            release.touch()
            assert wrapper.wait(timeout=30) == 0
        finally:
            wrapper.kill()
            wrapper.wait()
        assert not Path(f"/proc/{agent_pid}").exists()

    run(tmp_path, scenario)


def test_the_ranks_talk_to_the_daemon_through_their_agent(tmp_path: Path) -> None:
    """A rank connected to its node's agent: its hello reaches the daemon as the rank sent it
    (its own MAC, through the agent's connection), its heartbeat inside the agent's next beat
    with the step in its step slot, and the daemon's answer, sent to the agent's connection,
    reaches the rank."""

    async def scenario(d: Daemon) -> None:
        with (
            rank_side(tmp_path) as (key, sock_dir, rank),
            agent_process(tmp_path, d.endpoint.endpoint, ranks_socket=sock_dir / "r.sock"),
        ):
            await d.hear_until(lambda: NODE in d.agents.agents)
            assert (sock_dir / "r.sock").stat().st_mode & 0o777 == 0o600
            rank.connect(f"ipc://{sock_dir / 'r.sock'}")
            rank.send(m.encode(key, m.Hello(0, NODE), rank=3, attempt=1, pid=4242, seq=1))
            slot = tmp_path / p.step_slot_file(3)  # the rank's step slot on its node
            slot.write_bytes((11).to_bytes(8, "little", signed=True))
            beat = m.Heartbeat(9, 0.5, 2.0)
            rank.send(m.encode(key, beat, rank=3, attempt=1, pid=4242, seq=2))
            got: list[tuple[bytes, p.Message]] = []
            beats: list[wire.RankBeat] = []
            steps: dict[int, int] = {}
            deadline = time.monotonic() + 20
            while not (beats and steps) and time.monotonic() < deadline:
                for identity, msg in await d.endpoint.receive_batch():
                    if msg.rank < 0:
                        heard = d.agents.heard(identity, msg, time.monotonic())
                        beats += heard.ranks
                        steps.update(heard.steps)
                    else:
                        got.append((identity, msg))
            assert [(msg.kind, msg.rank, msg.pid) for _, msg in got] == [(p.Kind.HELLO, 3, 4242)]
            assert got[0][0] == d.agents.agents[NODE].identity
            assert [(b.rank, b.pid, b.body) for b in beats] == [(3, 4242, beat)]
            assert 0.0 <= beats[0].age_s <= 1.0
            assert steps == {3: 11}  # the exact step, read by the agent from the slot
            d.endpoint.send(got[0][0], m.Continue(), rank=3)
            assert rank.poll(20_000), "the daemon's answer did not reach the rank"
            answer = p.decode(key, rank.recv())
            assert (answer.kind, answer.rank) == (p.Kind.CONTINUE, 3)

    run(tmp_path, scenario)
