"""What the fuzz tests share: the hypothesis profile and generators of hostile input.

``RVSUP_FUZZ_EXAMPLES`` sets how many cases each property tries (the suite's default is 100,
a few seconds each); ``RVSUP_FUZZ_EXAMPLES=5000`` is a longer search. The frame floods of the
process tests are drawn from a seeded generator: ``RVSUP_FUZZ_SEED`` replays one (a failure
prints its seed).
"""

from __future__ import annotations

import json
import os

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

__all__ = ["FUZZ", "json_values", "request_lines"]

settings.register_profile(
    "rvsup-fuzz",
    max_examples=int(os.environ.get("RVSUP_FUZZ_EXAMPLES", "100")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
FUZZ = settings.get_profile("rvsup-fuzz")

_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=False, allow_infinity=False),
    st.text(max_size=12),
    st.sampled_from(["status", "stop", "STATUS", "status\n", "", "op"]),
)
json_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner),
    max_leaves=10,
)
"""Any JSON value, small."""


def _nested(depth: int, opener: bytes) -> bytes:
    closer = b"]" if opener == b"[" else b"}"
    inner = b"1" if opener == b"[" else b""
    if opener == b"{":
        return b'{"op":' * depth + b"1" + closer * depth
    return opener * depth + inner + closer * depth


_valid = st.sampled_from([b'{"op": "status"}', b'{"op": "stop"}', b'{"op": "history"}'])


def _mutate(data: bytes, at: int, junk: bytes, cut: bool) -> bytes:
    at %= len(data) + 1
    return data[:at] + junk + (b"" if cut else data[at:])


request_lines = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode()),
    st.dictionaries(st.sampled_from(["op", "Op", "", "stop"]), json_values, max_size=3).map(
        lambda d: json.dumps(d).encode()
    ),
    st.builds(_mutate, _valid, st.integers(0, 40), st.binary(max_size=8), st.booleans()),
    st.builds(_nested, st.integers(1, 2100), st.sampled_from([b"[", b"{"])),
    st.integers(4000, 70_000).map(lambda n: b'{"op": "' + b"x" * n + b'"}'),
    st.text(max_size=40).map(lambda s: s.encode("utf-8", "surrogatepass")),
)
"""Request lines (without their newline): garbage, any JSON, valid requests mutated, deeply
nested arrays and objects, lines longer than the server reads, unpaired surrogates."""
