"""Hostile messages for the rank channel, each with the reason the daemon must drop it for.

Every message is built from a valid frame of this job (the right secret and attempt) by one
mutation, so its drop reason is known by construction, not by asking the code under test:
random bytes, a flipped byte, a frame cut short or extended, a frame signed with another key,
one re-signed with a single header field or the payload made invalid (magic, kind, direction,
attempt, sequence number, payload), a multipart message. None of them is accepted: a job that
receives them trains on undisturbed.

The same mutations are drawn by hypothesis (:data:`hostile`) and by a seeded ``random.Random``
(:func:`draw`) for the floods of the process tests.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass

from hypothesis import strategies as st

from worker_sdk.contract import protocol as p

__all__ = [
    "FAKE_PID",
    "Hostile",
    "Mutation",
    "build",
    "draw",
    "hostile",
    "signed",
    "valid",
]

FAKE_PID = 4_000_000  # above any pid_max: no rank has it
_MIN = p.HEADER.size + p.MAC_BYTES  # the shortest frame that can authenticate
_TO_SUPERVISOR = [k for k in p.Kind if k < p.Kind.SYNC_REQUEST]
_TO_RANKS = [k for k in p.Kind if k >= p.Kind.SYNC_REQUEST]
_UNKNOWN_KINDS = [n for n in range(256) if n not in {int(k) for k in p.Kind}]
# payloads decode() refuses: not JSON, not UTF-8, not an object, or an object with a value
# that is not a scalar (nested, or an integer beyond 64 bits)
_BAD_PAYLOADS = [
    b"{not json",
    b"\xff\xfe{}",
    b"[1, 2]",
    b'"text"',
    b"null",
    b'{"host": ["n1"]}',
    b'{"a": {"b": 1}}',
    b'{"pid": ' + str(2**64).encode() + b"}",
    b"[" * 3000 + b"]" * 3000,  # deeper than the parser's recursion limit
    b'{"h":' + b"[" * 900 + b"]" * 900 + b"}",  # parses; str() of it would not
]


@dataclass(frozen=True)
class Hostile:
    """The parts of one message a DEALER sends, and the reason it is dropped."""

    parts: tuple[bytes, ...]
    reason: str


def signed(
    secret: bytes,
    *,
    attempt: int,
    kind: int = int(p.Kind.HEARTBEAT),
    magic: bytes = p.MAGIC,
    rank: int = 0,
    seq: int = 1,
    step: int = 1,
    payload: bytes = b"",
) -> bytes:
    """A frame with a correct MAC over any header (even an invalid one) and raw payload bytes."""
    body = p.HEADER.pack(magic, kind, 0, rank, attempt, FAKE_PID, seq, step, 0.0) + payload
    return body + p.mac(secret, body)


def valid(secret: bytes, attempt: int, kind: p.Kind, seq: int, payload_text: str) -> bytes:
    """A frame the channel accepts (from a rank that does not exist), to be mutated."""
    payload = {"host": payload_text} if payload_text else None
    return p.encode(
        secret,
        kind,
        rank=0,
        attempt=attempt,
        pid=FAKE_PID,
        seq=seq,
        step=seq % 2**63,
        payload=payload,
    )


def _by_length(frame: bytes) -> str:
    """Why bytes that cannot carry a valid MAC are dropped."""
    if len(frame) > p.MAX_MESSAGE_BYTES:
        return "oversized"
    return "truncated" if len(frame) < _MIN else "unauthenticated"


@dataclass(frozen=True)
class _Knobs:
    """The random choices of one mutation."""

    base: bytes  # a valid frame
    index: int  # a position, or a choice among options (taken modulo their count)
    value: int  # a byte value 1..255, or a length
    junk: bytes  # random bytes


Mutation = Callable[[bytes, int, bytes, _Knobs], Hostile]
"""A mutation: (secret, attempt, another key, its choices) -> the hostile message."""


def _random_bytes(secret: bytes, attempt: int, other_key: bytes, k: _Knobs) -> Hostile:
    return Hostile((k.junk,), _by_length(k.junk))


def _flipped(secret: bytes, attempt: int, other_key: bytes, k: _Knobs) -> Hostile:
    i = k.index % len(k.base)
    frame = k.base[:i] + bytes([k.base[i] ^ k.value]) + k.base[i + 1 :]
    return Hostile((frame,), "unauthenticated")


def _cut(secret: bytes, attempt: int, other_key: bytes, k: _Knobs) -> Hostile:
    frame = k.base[: k.index % len(k.base)]
    return Hostile((frame,), _by_length(frame))


def _extended(secret: bytes, attempt: int, other_key: bytes, k: _Knobs) -> Hostile:
    # at least one byte more: the valid frame itself is not hostile (found by the fuzz test)
    frame = k.base + (k.junk or b"\0") + (b"\0" * k.value * 80 if k.index % 4 == 0 else b"")
    return Hostile((frame,), _by_length(frame))


def _other_key(secret: bytes, attempt: int, other_key: bytes, k: _Knobs) -> Hostile:
    body = k.base[: -p.MAC_BYTES]
    return Hostile((body + p.mac(other_key, body),), "unauthenticated")


def _resigned(secret: bytes, attempt: int, other_key: bytes, k: _Knobs) -> Hostile:
    """One header field made wrong, or the payload made invalid; correctly signed."""
    which = k.index % 6
    if which == 0:
        magic = k.junk[:3].ljust(3, b"\0")
        magic = magic if magic != p.MAGIC else b"RV1"
        return Hostile((signed(secret, attempt=attempt, magic=magic),), "bad magic")
    if which == 1:
        kind = _UNKNOWN_KINDS[k.value % len(_UNKNOWN_KINDS)]
        return Hostile((signed(secret, attempt=attempt, kind=kind),), "unknown kind")
    if which == 2:
        kind = int(_TO_RANKS[k.value % len(_TO_RANKS)])
        return Hostile((signed(secret, attempt=attempt, kind=kind),), "wrong direction")
    if which == 3:
        other = (attempt + 1 + k.value * 7919) % 2**32
        return Hostile((signed(secret, attempt=other),), "other attempt")
    if which == 4:  # a sequence number never above the last one from this sender
        kind = int(_TO_SUPERVISOR[k.value % len(_TO_SUPERVISOR)])
        return Hostile((signed(secret, attempt=attempt, kind=kind, seq=0),), "replayed")
    payload = _BAD_PAYLOADS[k.value % len(_BAD_PAYLOADS)]
    kind = int(_TO_SUPERVISOR[k.index % len(_TO_SUPERVISOR)])
    return Hostile((signed(secret, attempt=attempt, kind=kind, payload=payload),), "bad payload")


def _multipart(secret: bytes, attempt: int, other_key: bytes, k: _Knobs) -> Hostile:
    parts = (k.base,) * (2 + k.value % 3) if k.index % 2 else (k.base, k.junk)
    return Hostile(parts, "malformed")


_MUTATIONS: tuple[Mutation, ...] = (
    _random_bytes,
    _flipped,
    _cut,
    _extended,
    _other_key,
    _resigned,
    _resigned,
    _multipart,
)


def build(
    secret: bytes,
    attempt: int,
    *,
    mutation: int,
    kind: p.Kind,
    seq: int,
    text: str,
    index: int,
    value: int,
    junk: bytes,
) -> Hostile:
    """The hostile message of these choices (``value`` 1..255)."""
    base = valid(secret, attempt, kind, seq, text)
    knobs = _Knobs(base, index, value, junk)
    other_key = bytes(b ^ 0x5A for b in secret)
    return _MUTATIONS[mutation % len(_MUTATIONS)](secret, attempt, other_key, knobs)


def _repeated(pattern: bytes, size: int) -> bytes:
    return (pattern * (size // len(pattern) + 1))[:size]


def hostile(secret: bytes, attempt: int) -> st.SearchStrategy[Hostile]:
    """Hostile messages for this job, drawn by hypothesis."""
    return st.builds(
        build,
        st.just(secret),
        st.just(attempt),
        mutation=st.integers(0, len(_MUTATIONS) - 1),
        kind=st.sampled_from(_TO_SUPERVISOR),
        seq=st.integers(1, 2**64 - 1),
        text=st.text(max_size=30),
        index=st.integers(0, 2**16),
        value=st.integers(1, 255),
        junk=st.binary(max_size=300)
        | st.builds(
            _repeated,
            st.binary(min_size=1, max_size=64),
            st.integers(_MIN, p.MAX_MESSAGE_BYTES + 50),
        ),
    )


def draw(rng: random.Random, secret: bytes, attempt: int) -> Hostile:
    """One hostile message for this job, drawn by ``rng``."""
    size = rng.choice([rng.randrange(_MIN), rng.randrange(_MIN, 400), rng.randrange(17_000)])
    return build(
        secret,
        attempt,
        mutation=rng.randrange(len(_MUTATIONS)),
        kind=rng.choice(_TO_SUPERVISOR),
        seq=rng.randrange(1, 2**64),
        text=json.dumps(rng.random())[: rng.randrange(12)],
        index=rng.randrange(2**16),
        value=rng.randrange(1, 256),
        junk=rng.randbytes(size),
    )
