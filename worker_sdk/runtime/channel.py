"""The rank's side of the channel to the supervisor: a ZeroMQ DEALER that never blocks training.

Sends are non-blocking (``zmq.NOBLOCK``) into a small queue: when the supervisor is slow or gone the
message is dropped and counted, the training loop goes on. Receiving is a non-blocking poll done only
when a heartbeat is due, except in a coordinated save where the rank waits for the supervisor's answer.
"""

from __future__ import annotations

import os

import zmq

from worker_sdk.contract import curve
from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

_SEND_HWM = 64


class Channel:
    """An authenticated DEALER connection from one rank to the supervisor."""

    def __init__(self, endpoint: str, secret: bytes, *, rank: int, attempt: int) -> None:
        self._key = secret
        self.rank = rank
        self.attempt = attempt
        self.pid = os.getpid()
        self._seq = 0
        self.dropped = 0
        self._ctx = zmq.Context(io_threads=1)
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SNDHWM, _SEND_HWM)
        sock.setsockopt(zmq.RCVHWM, _SEND_HWM)
        sock.setsockopt(zmq.MAXMSGSIZE, p.MAX_MESSAGE_BYTES)
        if endpoint.startswith("tcp://"):  # across nodes: only the job's processes get in
            curve.secure_client(sock, curve.keys(secret, curve.RANKS))
        sock.connect(endpoint)
        self._sock = sock

    def send(self, body: m.Body) -> bool:
        """Queue one message; False (and counted) when it had to be dropped."""
        self._seq += 1
        frame = m.encode(
            self._key, body, rank=self.rank, attempt=self.attempt, pid=self.pid, seq=self._seq
        )
        try:
            self._sock.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            self.dropped += 1
            return False
        return True

    def receive(self, timeout_s: float = 0.0) -> m.Body | None:
        """One authenticated message from the supervisor, waiting at most ``timeout_s``."""
        if timeout_s > 0 and not self._sock.poll(int(timeout_s * 1000)):
            return None
        while True:
            try:
                frame = self._sock.recv(zmq.NOBLOCK)
            except zmq.Again:
                return None
            try:
                msg = p.decode(self._key, frame)
            except p.BadMessageError:
                continue
            if msg.attempt == self.attempt and msg.rank in (self.rank, -1):
                return m.read(msg)

    @property
    def closed(self) -> bool:
        return bool(self._sock.closed)

    def close(self, linger_s: float = 0.5) -> None:
        """Flush what is queued (bounded by ``linger_s``) and close."""
        if self._sock.closed:
            return
        self._sock.close(linger=int(linger_s * 1000))
        self._ctx.term()
