"""The ``[metrics]`` HTTP endpoint: a small server that bounds what a client can hold.

prometheus-client's own ``start_http_server`` spends a thread and a descriptor on every
connection for as long as the client likes: on a shared node, another user could hold hundreds
of half-sent requests open and starve the daemon of threads and descriptors. This one serves
``GET /metrics`` (and ``HEAD``) and bounds everything a client can take:

- the connections handled at once (:data:`MAX_CONNECTIONS`): one more is closed as soon as it
  is accepted, never queued, so the kernel's backlog (:data:`BACKLOG`) is drained at once;
- the time to send the request's head, in total, however slowly it trickles
  (:data:`HEAD_DEADLINE_S`), and every read and write (:data:`IO_TIMEOUT_S`);
- the size of the head (:data:`MAX_HEAD_BYTES`; larger is answered 431).

A client can therefore keep the metrics from other scrapers for a while (a full set of
connections renewed every few seconds), never take more threads or descriptors than that.
:meth:`MetricsServer.close` stops accepting, cuts the connections in progress and joins every
thread within about a second.
"""

from __future__ import annotations

import contextlib
import http
import re
import socket
import threading
import time
from typing import Final
from urllib.parse import urlsplit

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

__all__ = ["MetricsServer"]

MAX_CONNECTIONS: Final = 8  # a scrape takes milliseconds: a few Prometheus servers and a curl
BACKLOG: Final = 128  # queued in the kernel, before accept: no thread nor descriptor of ours
HEAD_DEADLINE_S = 5.0  # the whole request head, from accept (not Final: the tests shorten it)
IO_TIMEOUT_S: Final = 5.0  # any one read; the whole response (sendall's timeout is its total)
MAX_HEAD_BYTES: Final = 8192  # Prometheus's request head is ~300 bytes
POLL_S: Final = 0.2  # how soon the accept loop sees close(), and waits out a failing accept
JOIN_S: Final = 1.0  # how long close() waits for the threads, all of them together

_END_OF_HEAD: Final = re.compile(rb"\r?\n\r?\n")


class _HeadTooLargeError(Exception):
    """The request head did not end within :data:`MAX_HEAD_BYTES`."""


class MetricsServer:
    """``GET /metrics`` on ``host:port`` from ``registry``, in threads of its own; binding
    raises :class:`OSError` (a port in use, a host that does not resolve)."""

    def __init__(self, host: str, port: int, registry: CollectorRegistry) -> None:
        self._registry = registry
        family, _, _, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        listener = socket.socket(family, socket.SOCK_STREAM)
        try:
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            listener.bind(address)
            listener.listen(BACKLOG)
            listener.settimeout(POLL_S)  # accept wakes up to see close()
        except BaseException:
            listener.close()
            raise
        self._listener = listener
        self.port: int = listener.getsockname()[1]
        self.thread_name = f"rvsup-metrics-http:{self.port}"
        """The accept loop's name; each connection's thread has it with ``/conn`` after it."""
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        self._lock = threading.Lock()
        self._conns: dict[threading.Thread, socket.socket] = {}
        self._closing = threading.Event()
        self._accepter = threading.Thread(target=self._accept, name=self.thread_name, daemon=True)
        self._accepter.start()

    @property
    def active(self) -> int:
        """The connections being handled now."""
        with self._lock:
            return len(self._conns)

    def close(self) -> None:
        """Stop accepting, cut the connections in progress and join every thread, waiting
        :data:`JOIN_S` at most in all (they are daemon threads). Idempotent."""
        end = time.monotonic() + JOIN_S
        self._closing.set()
        self._accepter.join(JOIN_S)  # it sees the flag within POLL_S
        self._listener.close()
        with self._lock:
            conns = dict(self._conns)
            for conn in conns.values():
                with contextlib.suppress(OSError):  # the client may have gone already
                    conn.shutdown(socket.SHUT_RDWR)  # wakes a recv or sendall at once
        for thread in conns:
            thread.join(max(0.0, end - time.monotonic()))

    # ------------------------------------------------------------------ accepting

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                conn, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:  # closed, or out of descriptors: wait rather than spin
                self._closing.wait(POLL_S)
                continue
            if self._closing.is_set() or not self._slots.acquire(blocking=False):
                conn.close()  # over the bound: at once, never queued
                continue
            thread = threading.Thread(
                target=self._handle, args=(conn,), name=f"{self.thread_name}/conn", daemon=True
            )
            with self._lock:
                self._conns[thread] = conn
            try:
                thread.start()
            except RuntimeError:  # no thread to be had: as if over the bound
                with self._lock:
                    del self._conns[thread]
                conn.close()
                self._slots.release()

    def _handle(self, conn: socket.socket) -> None:
        try:
            self._serve(conn)
        except OSError:
            pass  # the client went away, timed out, or close() cut it
        finally:
            with self._lock:
                del self._conns[threading.current_thread()]
                conn.close()
            self._slots.release()

    # ------------------------------------------------------------------ one request

    def _serve(self, conn: socket.socket) -> None:
        try:
            head = _read_head(conn, time.monotonic() + HEAD_DEADLINE_S)
        except _HeadTooLargeError:
            _answer(conn, 431, b"the request head is too large\n")
            return
        if head is None:
            return
        parts = head.split(b"\n", 1)[0].split()
        if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
            _answer(conn, 400, b"not an HTTP request\n")
        elif parts[0] not in (b"GET", b"HEAD"):
            _answer(conn, 405, b"only GET and HEAD\n", extra=b"Allow: GET, HEAD\r\n")
        elif urlsplit(parts[1]).path != b"/metrics":
            _answer(conn, 404, b"the metrics are at /metrics\n")
        else:
            try:
                body = generate_latest(self._registry)
            except Exception:  # noqa: BLE001 -- a collector's failure is the scraper's 500
                _answer(conn, 500, b"the metrics could not be collected\n")
                return
            _answer(conn, 200, body, CONTENT_TYPE_LATEST, head_only=parts[0] == b"HEAD")


def _read_head(conn: socket.socket, deadline: float) -> bytes | None:
    """The request line and headers; None if the client closed or ``deadline`` passed first."""
    buf = bytearray()
    while (end := _END_OF_HEAD.search(buf)) is None:
        if len(buf) > MAX_HEAD_BYTES:
            raise _HeadTooLargeError
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        conn.settimeout(min(left, IO_TIMEOUT_S))
        try:
            chunk = conn.recv(4096)
        except TimeoutError:
            return None
        if not chunk:
            return None
        buf += chunk
    if end.start() > MAX_HEAD_BYTES:
        raise _HeadTooLargeError
    return bytes(buf[: end.start()])


def _answer(
    conn: socket.socket,
    status: int,
    body: bytes,
    content_type: str = "text/plain; charset=utf-8",
    *,
    head_only: bool = False,
    extra: bytes = b"",
) -> None:
    """Send one whole response and say the connection ends with it."""
    head = (
        f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
        f"Content-Type: {content_type}\r\nContent-Length: {len(body)}\r\nConnection: close\r\n"
    ).encode("latin-1")
    conn.settimeout(IO_TIMEOUT_S)
    conn.sendall(head + extra + b"\r\n" + (b"" if head_only else body))
