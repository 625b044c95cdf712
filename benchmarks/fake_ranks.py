"""Simulated ranks for the daemon scale run: N heartbeat senders in one process, no torch.

Started by a real ``rvsup start`` (as the job's only rank), so it finds the daemon's endpoint, secret
and attempt in the RVSUP_* environment like any rank. Each simulated rank has its own DEALER
connection, says HELLO, then sends one HEARTBEAT per second (its step grows by one each time), the
sends spread evenly over the second. When ``$BENCH_RECORD_DIR/go-silent`` appears, rank N // 2
stops; ``silent.json`` records the time of its last heartbeat. ``ready.json`` is written once every
rank said HELLO.
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
    ctx = zmq.Context(io_threads=1)
    ctx.set(zmq.MAX_SOCKETS, n + 64)
    socks = []
    for _ in range(n):
        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        s.setsockopt(zmq.SNDHWM, 64)
        s.connect(endpoint)
        socks.append(s)
    seq = [0] * n
    steps = [0] * n

    def send(rank: int, body: m.Body) -> None:
        seq[rank] += 1
        frame = m.encode(key, body, rank=rank, attempt=attempt, pid=pid, seq=seq[rank])
        with contextlib.suppress(zmq.Again):  # a full queue drops, like the SDK
            socks[rank].send(frame, zmq.NOBLOCK)

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
        # rank r is due at t0 + r * period / n + k * period
        due_upto = int((now - t0) / period * n)
        while sent_total < due_upto:
            rank = sent_total % n
            sent_total += 1
            if silent and rank == silent_rank:
                continue
            steps[rank] += 1
            send(rank, m.Heartbeat(steps[rank], 0.02))
            last_sent[rank] = time.time()
        if not silent and (record_dir / "go-silent").exists():
            silent = True
            info = {"rank": silent_rank, "last_heartbeat_t": last_sent[silent_rank]}
            (record_dir / "silent.json").write_text(json.dumps(info))
        time.sleep(TICK_S)


if __name__ == "__main__":
    main()
