"""The metrics' HTTP endpoint is bounded: so many connections at once (one more is closed at
once), so long for a request head in total, so large a head; close() is prompt and leaves no
thread behind, whatever the clients are doing."""

from __future__ import annotations

import selectors
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from supervisor.config.load import parse_config
from supervisor.record.schema import RestartScheduled

pytest.importorskip("prometheus_client", reason="needs the extra rvsup[metrics]")

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, generate_latest

from supervisor.service import metrics_http
from supervisor.service.metrics import JobMetrics
from supervisor.service.metrics_http import MAX_CONNECTIONS, MetricsServer

HALF_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: node17\r\n"  # the head's blank line never comes


def config(tmp_path: Path, **metrics: str) -> Any:
    data = {"job": {"name": "toy", "command": ["python", "t.py"], "workdir": str(tmp_path)}}
    return parse_config({**data, "metrics": metrics}, tmp_path / "job.toml")


def server_threads(server: MetricsServer) -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith(server.thread_name)]


def wait_for(what: Callable[[], bool], within: float) -> bool:
    """Whether ``what()`` became true within ``within`` seconds (checked every 10 ms)."""
    end = time.monotonic() + within
    while not what():
        if time.monotonic() > end:
            return False
        time.sleep(0.01)
    return True


def closed_by_server(sock: socket.socket) -> bool:
    """Whether the server has closed ``sock`` (readable: end of stream or a reset)."""
    try:
        return sock.recv(4096) == b""
    except ConnectionResetError:
        return True


def all_closed_within(socks: list[socket.socket], within: float) -> bool:
    """Whether the server closed every socket of ``socks`` within ``within`` seconds."""
    end = time.monotonic() + within
    with selectors.DefaultSelector() as sel:
        for sock in socks:
            sel.register(sock, selectors.EVENT_READ)
        while sel.get_map():
            left = end - time.monotonic()
            if left <= 0:
                return False
            for key, _ in sel.select(left):
                held = key.fileobj
                assert isinstance(held, socket.socket)
                assert closed_by_server(held), "the server answered a request it never finished"
                sel.unregister(held)
    return True


@pytest.fixture
def registry() -> CollectorRegistry:
    registry = CollectorRegistry()
    Counter("scrapes_seen", "A counter the tests set", registry=registry).inc(7)
    return registry


@pytest.fixture
def server(registry: CollectorRegistry) -> Iterator[MetricsServer]:
    server = MetricsServer("127.0.0.1", 0, registry)
    yield server
    server.close()
    assert not server_threads(server)


@pytest.fixture
def clients() -> Iterator[list[socket.socket]]:
    """Client sockets, closed after the test whatever happened."""
    socks: list[socket.socket] = []
    yield socks
    for sock in socks:
        sock.close()


def connect(server: MetricsServer, clients: list[socket.socket], data: bytes) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    clients.append(sock)
    sock.sendall(data)
    return sock


def scrape(port: int, path: str = "/metrics", method: str = "GET") -> tuple[int, str, bytes]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method)
    try:
        with urllib.request.urlopen(request, timeout=5) as answer:
            return answer.status, answer.headers["Content-Type"], answer.read()
    except urllib.error.HTTPError as error:
        return error.code, error.headers["Content-Type"], error.read()


def test_a_scrape_returns_the_registry_text(tmp_path: Path) -> None:
    """JobMetrics serves generate_latest(registry) at /metrics with Prometheus's content type:
    a counter moved by an event is in it; close() leaves no thread of the server."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    m = JobMetrics(config(tmp_path, listen=f"127.0.0.1:{port}"))
    m.serve()
    server = m._server
    assert server is not None
    try:
        m.observe(
            RestartScheduled(
                backoff_s=1, restarts_left=2, charged=True, deterministic=False, note=""
            ),
            1,
        )
        status, ctype, body = scrape(port)
        assert (status, ctype) == (200, CONTENT_TYPE_LATEST)
        assert body == generate_latest(m.registry)
        assert b"rvsup_restarts_total 1.0" in body
    finally:
        m.close()
    assert not server_threads(server)


def test_head_other_paths_and_methods(server: MetricsServer) -> None:
    """HEAD gets the headers without the body; another path is 404, another method 405."""
    status, ctype, body = scrape(server.port, method="HEAD")
    assert (status, ctype, body) == (200, CONTENT_TYPE_LATEST, b"")
    assert scrape(server.port, "/")[0] == 404
    assert scrape(server.port, method="POST")[0] == 405
    assert b"scrapes_seen_total 7.0" in scrape(server.port)[2]


def test_held_connections_take_no_more_than_the_bound(
    server: MetricsServer, clients: list[socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 half-sent requests held open: the server never runs more than MAX_CONNECTIONS
    handler threads, a scrape made meanwhile is refused at once (all slots are held), the
    held connections are closed once the head's deadline passes, and then scrapes work."""
    monkeypatch.setattr(metrics_http, "HEAD_DEADLINE_S", 2.0)
    threads_before = threading.active_count()
    most = 0

    def count() -> None:
        nonlocal most
        mine = len(server_threads(server))
        assert mine <= MAX_CONNECTIONS + 1  # the handlers and the accept loop
        assert threading.active_count() - threads_before <= MAX_CONNECTIONS
        most = max(most, mine)

    held_at = time.monotonic()
    for _ in range(MAX_CONNECTIONS):
        connect(server, clients, HALF_REQUEST)
    assert wait_for(lambda: server.active == MAX_CONNECTIONS, 1.0)
    for _ in range(300 - MAX_CONNECTIONS):
        connect(server, clients, HALF_REQUEST)
        count()
    started = time.monotonic()
    with pytest.raises((ConnectionError, urllib.error.URLError)):  # closed unanswered
        scrape(server.port)
    assert time.monotonic() - started < 1.0
    assert time.monotonic() - held_at < 2.0, "too slow to prove the refusal: slots were freed"
    count()
    assert most == MAX_CONNECTIONS + 1
    assert all_closed_within(clients, 2.0 + 2.0)
    assert wait_for(lambda: server.active == 0, 2.0)
    assert scrape(server.port)[0] == 200


def test_a_trickling_client_is_cut_off_at_the_total_deadline(
    server: MetricsServer, clients: list[socket.socket], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A client that sends one byte of its head every 0.5 s (each recv well within its
    timeout) is cut off once the head's total deadline (here 1 s) has passed."""
    monkeypatch.setattr(metrics_http, "HEAD_DEADLINE_S", 1.0)
    started = time.monotonic()
    sock = connect(server, clients, b"G")
    sock.settimeout(0.5)  # the trickle's pace: wait for the server's close that long each time
    cut = False
    for byte in HALF_REQUEST[1:] * 4:
        try:
            if closed_by_server(sock):
                cut = True
                break
        except TimeoutError:
            pass
        if time.monotonic() - started > 1.0 + 2.0:
            break
        try:
            sock.send(bytes([byte]))
        except (BrokenPipeError, ConnectionResetError):
            cut = True
            break
    elapsed = time.monotonic() - started
    assert cut, f"still connected after {elapsed:.1f} s"
    assert 1.0 - 0.1 <= elapsed < 1.0 + 2.0


def test_an_oversized_head_is_refused(server: MetricsServer, clients: list[socket.socket]) -> None:
    """A head over MAX_HEAD_BYTES gets 431 or a closed connection, never a wait for more."""
    sock = connect(server, clients, b"GET /metrics HTTP/1.1\r\nX-Pad: ")
    try:
        sock.sendall(b"a" * (metrics_http.MAX_HEAD_BYTES + 1024))
    except (BrokenPipeError, ConnectionResetError):
        return  # closed while we were still sending
    try:
        answer = sock.recv(4096)
    except ConnectionResetError:
        return
    assert answer == b"" or answer.startswith(b"HTTP/1.1 431 ")


def test_close_is_prompt_with_slow_clients_connected(
    server: MetricsServer, clients: list[socket.socket]
) -> None:
    """close() returns within 2 s while 50 clients hold half-sent requests; afterwards no
    thread of the server is alive and the port accepts nothing."""
    for _ in range(50):
        connect(server, clients, HALF_REQUEST)
    assert wait_for(lambda: server.active == MAX_CONNECTIONS, 1.0)
    started = time.monotonic()
    server.close()
    assert time.monotonic() - started < 2.0
    assert not server_threads(server)
    assert all_closed_within(clients, 2.0)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", server.port), timeout=2).close()
