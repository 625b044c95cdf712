"""Simulated ranks for the daemon scale run: N heartbeat senders in one process, no torch.

Started by a real ``rvsup start`` (as the job's only rank), so it finds the daemon's endpoint, secret
and attempt in the RVSUP_* environment like any rank. Each simulated rank has its own DEALER
connection, says HELLO, then sends one HEARTBEAT per second (its step grows by one each time), the
sends spread evenly over the second. With FAKE_PER_AGENT=k, the ranks are simulated behind node
agents of k ranks each, as on a multi-node job: one connection per agent, each rank's HELLO sent
through it as the agent relays it, then one NODE_BEAT per agent per second carrying its k ranks'
heartbeats (supervisor/agent/), the agents' beats spread evenly over the second; with
FAKE_TRAINING=1 each of those heartbeats carries a loss and an all-reduce wait, as a DDP script
that passes its loss sends (the loss falls smoothly, the waits differ a little by rank: no
anomaly, no straggler to name). When
``$BENCH_RECORD_DIR/go-silent`` appears, rank N // 2 stops; ``silent.json`` records the time of
its last heartbeat. ``ready.json`` is written once every rank said HELLO.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import time
from pathlib import Path

import zmq

from supervisor.agent import wire
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

TICK_S = 0.01


def main() -> None:
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # the daemon's stack-dump request
    n = int(os.environ.get("FAKE_RANKS", "64"))
    rate_hz = float(os.environ.get("FAKE_RATE_HZ", "1"))
    record_dir = Path(os.environ["BENCH_RECORD_DIR"])
    record_dir.mkdir(parents=True, exist_ok=True)
    key = p.read_secret(os.environ[p.ENV_SECRET_FILE])
    attempt = int(os.environ[p.ENV_ATTEMPT])
    endpoint = os.environ[p.ENV_ENDPOINT]
    pid, host = os.getpid(), socket.gethostname()
    per_agent = int(os.environ.get("FAKE_PER_AGENT", "0"))
    training = os.environ.get("FAKE_TRAINING") == "1"
    senders = n if per_agent <= 0 else -(-n // per_agent)
    ctx = zmq.Context(io_threads=1)
    ctx.set(zmq.MAX_SOCKETS, senders + 64)
    socks = []
    for _ in range(senders):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 64)
        s.connect(endpoint)
        socks.append(s)
    seq = [0] * n
    steps = [0] * n
    agent_seq = [0] * senders

    def send(rank: int, body: m.Body) -> None:
        seq[rank] += 1
        frame = m.encode(key, body, rank=rank, attempt=attempt, pid=pid, seq=seq[rank])
        sock = socks[rank if per_agent <= 0 else rank // per_agent]
        with contextlib.suppress(zmq.Again):  # a full queue drops, like the SDK
            sock.send(frame, zmq.NOBLOCK)

    def beat(agent: int, ranks: list[int]) -> None:
        beats = [
            wire.RankBeat(r, pid, steps[r], 0.02, *_training(r, steps[r]), 0.0)
            if training
            else wire.RankBeat(r, pid, steps[r], 0.02, None, None, 0.0)
            for r in ranks
        ]
        body = m.NodeBeat(f"sim-{agent:05d}", wire.beats_text(beats))
        agent_seq[agent] += 1
        frame = m.encode(
            key, body, rank=p.agent_rank(agent), attempt=attempt, pid=pid, seq=agent_seq[agent]
        )
        with contextlib.suppress(zmq.Again):
            socks[agent].send(frame, zmq.NOBLOCK)

    for rank in range(n):
        send(rank, m.Hello(0, host, local_rank=rank, world_size=n))
    (record_dir / "ready.json").write_text(json.dumps({"t": time.time(), "ranks": n}))
    silent_rank, silent = n // 2, False
    last_sent = [0.0] * n
    period = 1.0 / rate_hz
    t0 = time.monotonic()
    sent_total = 0
    while True:
        now = time.monotonic()
        # sender i (a rank, or an agent) is due at t0 + i * period / senders + k * period
        due_upto = int((now - t0) / period * senders)
        while sent_total < due_upto:
            sender = sent_total % senders
            sent_total += 1
            if per_agent <= 0:
                ranks = [] if silent and sender == silent_rank else [sender]
            else:
                upto = min((sender + 1) * per_agent, n)
                ranks = [
                    r for r in range(sender * per_agent, upto) if not (silent and r == silent_rank)
                ]
            for rank in ranks:
                steps[rank] += 1
                last_sent[rank] = time.time()
            if per_agent > 0:
                beat(sender, ranks)
            elif ranks:
                send(sender, m.Heartbeat(steps[sender], 0.02))
        if not silent and (record_dir / "go-silent").exists():
            silent = True
            info = {"rank": silent_rank, "last_heartbeat_t": last_sent[silent_rank]}
            (record_dir / "silent.json").write_text(json.dumps(info))
        time.sleep(TICK_S)


def _training(rank: int, step: int) -> tuple[float, float]:
    """A rank's loss and all-reduce wait at ``step``: the loss falls smoothly from 2.0, the
    same for every rank but its last digits; the waits are 5 to 6.2 ms."""
    return 2.0 / (1.0 + step / 100.0) + (rank % 7) * 1e-6, 0.005 + (rank % 13) * 1e-4


if __name__ == "__main__":
    main()
