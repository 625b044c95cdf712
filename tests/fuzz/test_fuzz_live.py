"""A live job fuzzed from outside: tens of thousands of hostile frames at full speed on its rank
channel (IPC and TCP) and hostile requests on its control socket, all at once. The daemon never
crashes or stalls, counts every dropped frame under the reason its mutation implies, answers every
request, mistakes none of it for a failure, and the job ends bit-identical to an uninterrupted run.

The frames and requests are drawn from a seeded generator: ``RVSUP_FUZZ_SEED`` replays a run
(a failure prints its seed); ``RVSUP_FUZZ_FRAMES`` sets how many frames are sent (default 20,000).
"""

from __future__ import annotations

import collections
import json
import os
import random
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import zmq

from tests.fuzz.control_client import draw_request, exchange, expected_error
from tests.fuzz.frames import draw
from tests.helpers.harness import (
    dropped_since,
    events,
    named,
    running,
    status,
    wait_for,
    wait_progress,
    write_job,
)
from tests.helpers.states import assert_same_state, load_final
from worker_sdk.contract import curve

# serial: floods the daemon; no hang may be declared (5 s timeout)
pytestmark = [pytest.mark.process, pytest.mark.serial]

TOTAL = 60  # as the reference run
FRAMES = int(os.environ.get("RVSUP_FUZZ_FRAMES", "20000"))
SENDERS = 2  # DEALER sockets, each in its own thread


def _flood(endpoint: str, messages: list[tuple[bytes, ...]], secret: bytes) -> float:
    """Send ``messages`` from one DEALER as fast as zmq takes them; the seconds it took. Over
    TCP the sender is an insider holding the job's CURVE client keys (a stranger never gets
    past the handshake: tests/supervisor/ranks/test_hostile_sender.py), so its frames reach the MAC checks."""
    ctx = zmq.Context()
    try:
        dealer = ctx.socket(zmq.DEALER)
        if endpoint.startswith("tcp://"):
            curve.secure_client(dealer, curve.keys(secret, curve.RANKS))
        dealer.setsockopt(zmq.LINGER, 30_000)
        dealer.setsockopt(zmq.SNDHWM, 100_000)
        dealer.connect(endpoint)
        t0 = time.monotonic()
        for parts in messages:
            dealer.send_multipart(list(parts))
        elapsed = time.monotonic() - t0
        dealer.close()  # lingers until zmq has handed everything over
        return elapsed
    finally:
        ctx.term()


def _requests(control: Path, rng: random.Random, stop: threading.Event, bad: list[str]) -> int:
    """Hostile requests on the control socket until ``stop``; each must get its answer. Any
    deviation is appended to ``bad``; returns how many were answered."""
    answered = 0
    while not stop.is_set():
        data = draw_request(rng)
        try:
            lines = exchange(control, data, timeout_s=10)
        except OSError as exc:
            bad.append(f"{data[:80]!r}: {exc!r}")
            continue
        if len(lines) != 1:
            bad.append(f"{data[:80]!r}: {len(lines)} answer lines")
            continue
        answer = json.loads(lines[0])
        error = expected_error(data)
        if error and (answer.get("ok") or not str(answer.get("error", "")).startswith(error)):
            bad.append(f"{data[:80]!r}: {answer}")
        answered += 1
    return answered


@pytest.mark.parametrize("transport", ["ipc", "tcp"])
def test_a_live_job_fuzzed_on_both_sockets_ends_bit_identical(
    tmp_path: Path, reference_final: Path, transport: str
) -> None:
    """Hostile frames at full speed from two senders plus hostile control requests meanwhile:
    each frame dropped and counted under its reason, each request answered as it must be,
    rvsup status answering throughout, no failure detected, and the final state equal to an
    uninterrupted run's bit for bit."""
    seed = int(os.environ.get("RVSUP_FUZZ_SEED", str(random.randrange(2**32))))
    replay = f"replay: RVSUP_FUZZ_SEED={seed}"
    final = tmp_path / "final.pt"
    job = write_job(
        tmp_path,
        total=TOTAL,
        env={"FINAL": str(final), "STEP_SLEEP": "0.15"},
        heartbeat=(
            f'interval = "0.2s"\nstartup_timeout = "60s"\nhang_timeout = "5s"\n'
            f'transport = "{transport}"'
        ),
    )
    run_dir = tmp_path / "run"
    with running(job) as proc:
        first = wait_progress(job, min_step=3)
        daemon = json.loads((run_dir / "daemon.json").read_text())
        secret = bytes.fromhex((run_dir / "secret").read_text())
        rng = random.Random(seed)
        hostile = [draw(rng, secret, first["attempt"]) for _ in range(FRAMES)]
        expected = collections.Counter(h.reason for h in hostile)
        before = dict(first["messages"]["dropped"])

        stop, bad = threading.Event(), list[str]()
        answered: list[int] = []
        asker = threading.Thread(
            target=lambda: answered.append(
                _requests(Path(daemon["control"]), random.Random(seed + 1), stop, bad)
            )
        )
        asker.start()
        share = [[h.parts for h in hostile[i::SENDERS]] for i in range(SENDERS)]
        took: list[float] = []
        senders = [
            threading.Thread(target=lambda s=s: took.append(_flood(daemon["endpoint"], s, secret)))
            for s in share
        ]
        t0 = time.monotonic()
        for t in senders:
            t.start()
        for t in senders:
            t.join(timeout=120)

        def all_counted() -> dict[str, Any] | None:
            st = status(job)
            if st is None:
                return None
            return st if dropped_since(before, st).total() >= expected.total() else None

        st = wait_for(all_counted, timeout=60, what=f"every frame counted ({replay})", interval=0.2)
        counted_s = time.monotonic() - t0
        stop.set()
        asker.join(timeout=30)
        assert dropped_since(before, st) == expected, replay
        assert not bad, f"{replay}: {bad[:5]}"
        assert answered and answered[0] > 0, replay
        assert proc.poll() is None, f"the daemon died ({replay})"
        print(
            f"\n{transport}: {FRAMES} hostile frames sent in {max(took):.2f}s, all counted "
            f"after {counted_s:.2f}s ({FRAMES / counted_s:,.0f}/s); "
            f"{answered[0]} control requests answered meanwhile"
        )
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, f"{replay}\n{out}"
    evs = events(run_dir)
    assert not named(evs, "failure_detected"), replay
    assert [e["last_step"] for e in named(evs, "job_succeeded")] == [TOTAL - 1]
    assert_same_state(load_final(reference_final), load_final(final))
