"""Reading typed messages under fuzzing: any authenticated frame of any kind, with any payload
the framing accepts, reads as the message class of its kind without raising."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from worker_sdk.contract import messages as m
from worker_sdk.contract import protocol as p

from .strategies import FUZZ

KEY = bytes(range(32))
_KEYS = st.sampled_from(
    ["host", "total_steps", "loss", "path", "reason", "pid", "code", "signal", "since", "ranks",
     "name", "begin", "kind", "type", "message", "bytes", "blocked_s", "stdout", "x"]
)  # fmt: skip
_SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)


@FUZZ
@given(
    kind=st.sampled_from(list(p.Kind)),
    payload=st.dictionaries(_KEYS, _SCALARS, max_size=6),
    step=st.integers(-(2**63), 2**63 - 1),
    value=st.floats(allow_nan=True, allow_infinity=True),
    flags=st.integers(0, 255),
)
def test_any_authenticated_message_reads_as_its_kinds_class(
    kind: p.Kind, payload: dict[str, object], step: int, value: float, flags: int
) -> None:
    """Every kind, with any scalar payload, step, value and flags, reads without raising as the
    one class of its kind."""
    frame = p.encode(
        KEY, kind, rank=0, attempt=1, pid=2, seq=3, step=step, value=value, flags=flags,
        payload=dict(payload),
    )  # fmt: skip
    body = m.read(p.decode(KEY, frame))
    assert body.KIND is kind
