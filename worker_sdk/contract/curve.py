"""CurveZMQ on every TCP socket rvsup listens on across nodes: only the job's own processes get in.

A listener reachable from the cluster network (the rank channel of a job on several nodes, each
writer's receiver of snapshot copies) would otherwise hold a connection, a descriptor and a
handshake for anyone who connects. With CURVE (ZeroMQ's CurveCP handshake, RFC 26), a peer that
does not hold the job's key pairs cannot complete the handshake, so it never becomes a peer:
ZeroMQ drops the connection once the handshake fails, or after :data:`HANDSHAKE_S` without one
(a connection that sends nothing). Traffic is encrypted too (a snapshot's weights, the losses a
heartbeat carries). Chosen over a ZAP handler that only counts connections: a count alone lets
the first strangers take the places of the ranks that come after them.

The keys are derived from the job's secret (the 0600 file every process of the job reads,
``RVSUP_SECRET_FILE``): a server key pair and a client key pair per purpose. The listener's ZAP
handler (pyzmq's :mod:`zmq.auth`, in a thread of its own) admits only the client key of its
purpose; the messages inside keep their MAC as before (:mod:`.protocol`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

from worker_sdk.contract import threads

if TYPE_CHECKING:  # pyzmq is imported where a socket is made (the daemon's core loads none)
    import zmq

__all__ = [
    "HANDSHAKE_S",
    "RANKS",
    "REPLICA",
    "Keys",
    "Listener",
    "keys",
    "secure_client",
    "secure_server",
]

HANDSHAKE_S: Final = 10.0  # a connection that has not finished its handshake by then is closed
RANKS: Final = "ranks"  # the rank channel: ranks (and their exit reports) to the daemon
REPLICA: Final = "replica"  # a writer's copies of its snapshot to the other nodes' writers
_DOMAIN: Final = "rvsup"


@dataclass(frozen=True, slots=True)
class Keys:
    """The key pairs of one purpose, Z85-encoded as ZeroMQ takes them."""

    server_public: bytes
    server_secret: bytes
    client_public: bytes
    client_secret: bytes


def keys(secret: bytes, purpose: str) -> Keys:
    """The key pairs of ``purpose`` (:data:`RANKS`, :data:`REPLICA`) derived from the job's
    secret."""
    import zmq
    from zmq.utils import z85

    if not secret:
        raise ValueError("CURVE keys need the job's secret")

    def secret_key(role: str) -> bytes:
        seed = hashlib.blake2b(
            secret, key=b"rvsup-curve", person=f"{role}-{purpose}"[:16].encode(), digest_size=32
        ).digest()
        return z85.encode(seed)

    server, client = secret_key("server"), secret_key("client")
    return Keys(zmq.curve_public(server), server, zmq.curve_public(client), client)


class _OnlyTheJob:
    """The ZAP handler's question: is this the job's client key?"""

    def __init__(self, client_public: bytes) -> None:
        self._client = client_public

    def callback(self, domain: str, key: bytes) -> bool:  # noqa: ARG002 - pyzmq's signature
        return key == self._client


class Listener:
    """The ZAP handler of one context: admits the job's client key of one purpose."""

    def __init__(self, context: zmq.Context[Any], k: Keys) -> None:
        import zmq
        from zmq.auth.thread import ThreadAuthenticator

        # a plain context over the same one (an asyncio context's sockets would not block)
        self._auth = ThreadAuthenticator(zmq.Context.shadow(context.underlying))
        self._auth.start()
        if self._auth.thread is not None:
            threads.name_os_thread(self._auth.thread, "zap")
        self._auth.configure_curve_callback(
            _DOMAIN, credentials_provider=_OnlyTheJob(k.client_public)
        )

    def stop(self) -> None:
        self._auth.stop()


def secure_server(sock: zmq.Socket[Any], k: Keys) -> None:
    """Make ``sock`` (before it binds) a CURVE server that the context's :class:`Listener`
    guards, dropping a connection whose handshake does not end within :data:`HANDSHAKE_S`."""
    sock.curve_server = True
    sock.curve_secretkey = k.server_secret
    sock.curve_publickey = k.server_public
    sock.zap_domain = _DOMAIN.encode()
    sock.handshake_ivl = int(HANDSHAKE_S * 1000)


def secure_client(sock: zmq.Socket[Any], k: Keys) -> None:
    """Make ``sock`` (before it connects) a CURVE client of a :func:`secure_server`."""
    sock.curve_serverkey = k.server_public
    sock.curve_publickey = k.client_public
    sock.curve_secretkey = k.client_secret
