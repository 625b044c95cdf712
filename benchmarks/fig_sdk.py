"""Figure 7: what the SDK costs a training step, measured in this process against a real socket.

``worker_sdk.resume()`` runs for real (a tiny model, world size 1) with the RVSUP_* environment
pointing at a ZeroMQ ROUTER that a child process binds and drains: what a rank sees under rvsup.
NVRx's heartbeat (a synchronous request/answer to its rank monitor) is timed in a one-rank
``ft_launcher`` job when the package is installed.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from .profiles import Context
from .replica_cost import measure_replica_cost
from .straggler_cost import measure_straggler_cost
from .table import Cell, Table, Target
from .tools import REPO, FtLauncher

STEP_BUDGET_MS = 20.0

FSDP_COLLECTIVES = 96
"""Blocking collectives of one FSDP step for the overhead target: 32 sharded units (a 32-layer
model), each with a forward all-gather, a backward all-gather and a reduce-scatter."""

_BATCH = 10_000
_PACE_S = 0.0002  # between timed heartbeat sends


def per_call_ns(run_batch: Callable[[int, int], None], calls: int) -> list[float]:
    """ns per call of each batch of ``_BATCH`` calls."""
    out = []
    batch = min(_BATCH, calls)
    for b in range(max(1, calls // batch)):
        t0 = time.perf_counter_ns()
        run_batch(b * batch, batch)
        out.append((time.perf_counter_ns() - t0) / batch)
    return out


def _spin(seconds: float) -> None:
    """Wait without sleeping (a sleep would time a cold wake-up, not the send)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def _noop(step: int, extra: Any = None) -> None:
    return None


_DRAIN = """
import signal, sys, zmq
stop = []
signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
sock = zmq.Context().socket(zmq.ROUTER)
sock.setsockopt(zmq.LINGER, 0)
sock.bind(sys.argv[1])
print("ready", flush=True)
n = 0
while not stop:
    if sock.poll(50):
        while True:
            try:
                sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                break
            n += 1
print(n, flush=True)
"""


@contextlib.contextmanager
def _router(directory: Path) -> Iterator[tuple[str, list[int]]]:
    """A ROUTER bound and drained by a child process (no thread here competes for the GIL):
    (endpoint, [frames it received], filled in on exit)."""
    from worker_sdk.contract import protocol as p

    p.write_secret(str(directory / "secret"), p.new_secret())
    endpoint = f"ipc://{directory / 'hb.sock'}"
    child = subprocess.Popen(
        [sys.executable, "-c", _DRAIN, endpoint], stdout=subprocess.PIPE, text=True
    )
    received = [0]
    try:
        assert child.stdout is not None
        if child.stdout.readline().strip() != "ready":
            raise RuntimeError("the draining ROUTER did not start")
        yield endpoint, received
    finally:
        child.send_signal(signal.SIGTERM)
        try:
            out, _ = child.communicate(timeout=10)
            received[0] = int(out.split()[-1]) if out.split() else 0
        except subprocess.TimeoutExpired:
            child.kill()
            child.communicate()


def _armed_loss_ns(rt: Any, calls: int) -> list[float]:
    """step() with a float loss at steps the resume check keeps (``rt``: the Runtime)."""
    import worker_sdk

    prints, step = rt.prints, worker_sdk.step

    def steps_armed_loss(start: int, n: int) -> None:
        # every step armed: a list as long as a batch, so that the store is the one
        # worker_sdk.step makes, nothing added
        prints.base, prints.until = start, start + n
        for i in range(start, start + n):
            step(i, loss=0.5)

    window = (prints.values, prints.base, prints.until)
    prints.values = [None] * min(_BATCH, calls)
    try:
        return per_call_ns(steps_armed_loss, calls)
    finally:
        prints.values, prints.base, prints.until = window


def measure_sdk(directory: Path, calls: int) -> dict[str, list[float]]:
    """step() with nothing due (without a loss, with a float, with a tensor, with a float at
    steps the resume check keeps), step() with a heartbeat due (without a loss, with a
    tensor), one heartbeat send, an empty call."""
    import torch

    import worker_sdk
    from worker_sdk.contract import messages as m
    from worker_sdk.contract import protocol as p

    directory.mkdir(parents=True, exist_ok=True)
    with _router(directory) as (endpoint, received):
        env = {
            p.ENV_ENDPOINT: endpoint,
            p.ENV_SECRET_FILE: str(directory / "secret"),
            p.ENV_ATTEMPT: "1",
            p.ENV_HEARTBEAT_INTERVAL: "3600",  # nothing due during the loop
            p.ENV_CHECKPOINT_DIR: str(directory / "ckpt"),
            p.ENV_CKPT_EVERY_STEPS: "0",
        }
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            torch.manual_seed(0)  # as a script does (resume() warns otherwise)
            model = torch.nn.Linear(8, 8)
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
            worker_sdk.resume(model, optimizer)
            step = worker_sdk.step

            def steps(start: int, n: int) -> None:
                for i in range(start, start + n):
                    step(i)

            def empty(start: int, n: int) -> None:
                for i in range(start, start + n):
                    _noop(i)

            loss_tensor = torch.tensor(0.5)

            def steps_float_loss(start: int, n: int) -> None:
                for i in range(start, start + n):
                    step(i, loss=0.5)

            def steps_tensor_loss(start: int, n: int) -> None:
                for i in range(start, start + n):
                    step(i, loss=loss_tensor)

            result = {"step_ns": per_call_ns(steps, calls), "empty_ns": per_call_ns(empty, calls)}
            result["float_loss_ns"] = per_call_ns(steps_float_loss, calls)
            result["tensor_loss_ns"] = per_call_ns(steps_tensor_loss, calls)
            rt = worker_sdk._current
            assert rt is not None
            result["armed_loss_ns"] = _armed_loss_ns(rt, calls)
            assert rt.channel is not None
            sends, due = [], []
            # paced (as heartbeats are) so that the send queue never fills: a full queue drops
            # the message, which is a different (exception) path
            for i in range(min(5_000, calls // 20)):
                _spin(_PACE_S)
                t0 = time.perf_counter_ns()
                rt.channel.send(m.Heartbeat(i, 0.02))
                sends.append((time.perf_counter_ns() - t0) / 1000.0)
            for i in range(min(5_000, calls // 20)):
                _spin(_PACE_S)
                rt.hb_due = rt.next_due = 0.0
                t0 = time.perf_counter_ns()
                step(calls + i)
                due.append((time.perf_counter_ns() - t0) / 1000.0)
            due_tensor = []
            for i in range(min(5_000, calls // 20)):
                _spin(_PACE_S)
                rt.hb_due = rt.next_due = 0.0
                t0 = time.perf_counter_ns()
                step(calls + i, loss=loss_tensor)
                due_tensor.append((time.perf_counter_ns() - t0) / 1000.0)
            result["send_us"], result["due_us"] = sends, due
            result["due_tensor_us"] = due_tensor
            result["dropped"] = [float(rt.channel.dropped)]
        finally:
            worker_sdk._reset_for_tests()
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    result["received"] = [float(received[0])]
    return result


def measure_nvrx(venv: str, workdir: Path, calls: int) -> dict[str, Any] | str:
    """NVRx's heartbeat round trip, timed in a one-rank ft_launcher job (or why it could not)."""
    tool = FtLauncher(venv=venv)
    if tool.unavailable():
        return tool.unavailable() or ""
    exe = tool.executable()
    assert exe is not None
    workdir.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, NVRX_PROBE_CALLS=str(calls), OMP_NUM_THREADS="1")
    try:
        done = subprocess.run(
            [
                str(exe),
                "--standalone",
                "--nproc-per-node=1",
                "--max-restarts=0",
                str(REPO / "benchmarks" / "nvrx_probe.py"),
            ],
            env=env,
            cwd=workdir,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
    except subprocess.TimeoutExpired:
        return "n/a (the probe did not finish within 180 s)"
    for line in done.stdout.splitlines() + done.stderr.splitlines():
        if "NVRX_PROBE " in line:
            text = line.split("NVRX_PROBE ", 1)[1]
            parsed: dict[str, Any] = json.JSONDecoder().raw_decode(text)[0]
            return parsed
    return f"n/a (probe failed, exit {done.returncode}: {done.stderr.strip()[-200:]})"


def _replica_rows(t: Table, cols: list[str], m: dict[str, list[float]]) -> None:
    """The replica check's rows: per check, and per step at two ``verify_every_steps``."""
    size = f"148 tensors, {m['params_m'][0]:.3g} M parameters"
    fp, gather = Cell(m["fingerprint_us"], " µs"), Cell(m["gather_us"], " µs")
    gather2: Cell | str = Cell(m["gather_2p_us"], " µs") if m["gather_2p_us"] else "n/a (smoke)"
    t.row(f"replica check: fingerprint ({size})", {cols[0]: fp, cols[1]: "-"})
    t.row("replica check: all-gather, 1-process gloo group", {cols[0]: gather, cols[1]: "-"})
    t.row("replica check: all-gather, 2 processes (gloo)", {cols[0]: gather2, cols[1]: "-"})
    t.row(
        "replica check: whole check, 1 process", {cols[0]: Cell(m["check_us"], " µs"), cols[1]: "-"}
    )
    used = gather2 if isinstance(gather2, Cell) else gather
    per_check = (fp.median or 0.0) + (used.median or 0.0)
    for every in (100, 1000):
        t.row(
            f"replica check amortised per step, verify_every_steps = {every} "
            f"({'2 processes' if used is gather2 else '1 process'})",
            {cols[0]: f"{per_check / every:.2f} µs", cols[1]: "-"},
        )
    resume_sum = Cell(m["resume_sum_us"], " µs")
    t.row(f"resume check: parameter checksum ({size})", {cols[0]: resume_sum, cols[1]: "-"})
    t.row(
        "resume check amortised per step (one checksum per 16 steps at most)",
        {cols[0]: f"{(resume_sum.median or 0.0) / 16:.2f} µs", cols[1]: "-"},
    )


def sdk(ctx: Context) -> Table:
    p = ctx.profile
    m = measure_sdk(ctx.scratch / "sdk", p.sdk_calls)
    step_ns = Cell(m["step_ns"], " ns", digits=1)
    empty_ns = Cell(m["empty_ns"], " ns", digits=1)
    send_us = Cell(m["send_us"], " µs")
    due_us = Cell(m["due_us"], " µs")
    cols = ["rvsup SDK", "ft_launcher (NVRx)"]
    t = Table(
        "sdk",
        f"7. SDK cost in-process ({p.sdk_calls} step() calls in batches of "
        f"{min(_BATCH, p.sdk_calls)}; per-call medians)",
        cols,
    )
    nvrx: dict[str, Any] | str = "n/a (nvidia-resiliency-ext not installed; see README)"
    if ctx.nvrx_venv:
        nvrx = measure_nvrx(ctx.nvrx_venv, ctx.scratch / "sdk-nvrx", 2000 if p.smoke else 5000)
    nv_hb: Cell | str = (
        nvrx
        if isinstance(nvrx, str)
        else Cell(
            [nvrx["median_us"]],
            " µs",
            note=f"min {nvrx['min_us']:.1f}, max {nvrx['max_us']:.1f}, {nvrx['n']} calls",
        )
    )
    t.row("step(), nothing due (median of batches)", {cols[0]: step_ns, cols[1]: "-"})
    t.row("empty Python call, same loop (baseline)", {cols[0]: empty_ns, cols[1]: "-"})
    float_ns = Cell(m["float_loss_ns"], " ns", digits=1)
    tensor_ns = Cell(m["tensor_loss_ns"], " ns", digits=1)
    t.row("step(..., loss=float), nothing due (checked)", {cols[0]: float_ns, cols[1]: "-"})
    t.row("step(..., loss=tensor), nothing due (kept)", {cols[0]: tensor_ns, cols[1]: "-"})
    armed_ns = Cell(m["armed_loss_ns"], " ns", digits=1)
    t.row("the float loss, armed (the resume check keeps it)", {cols[0]: armed_ns, cols[1]: "-"})
    t.row("one heartbeat send (paced, 0.2 ms apart)", {cols[0]: send_us, cols[1]: nv_hb})
    t.row("step() with a heartbeat due (send + poll)", {cols[0]: due_us, cols[1]: "-"})
    due_tensor = Cell(m["due_tensor_us"], " µs")
    t.row("the same with a tensor loss (read + payload)", {cols[0]: due_tensor, cols[1]: "-"})
    cost = measure_straggler_cost(
        ctx.scratch / "stragglers", 3 if p.smoke else 10, 30 if p.smoke else 100
    )
    sampled, default = (
        Cell(cost["sampled_every_us"], " µs"),
        Cell(cost["sampled_default_us"], " µs"),
    )
    read_us = Cell(cost["read_us"], " µs")
    t.row("DDP step, reducer sampled every step (stragglers)", {cols[0]: sampled, cols[1]: "-"})
    t.row("the same, torch's default (every 100th step)", {cols[0]: default, cols[1]: "-"})
    t.row("one read of DDP's newest sample (at a heartbeat)", {cols[0]: read_us, cols[1]: "-"})
    timer_ns = Cell(cost["timed_call_ns"], " ns", digits=1)
    t.row("FSDP: the timer around one blocking collective", {cols[0]: timer_ns, cols[1]: "-"})
    _replica_rows(
        t, cols, measure_replica_cost(ctx.scratch / "replicas", p.sdk_calls // 5000, smoke=p.smoke)
    )
    extra_us = max(0.0, (sampled.median or 0.0) - (default.median or 0.0))
    extra_us += STEP_BUDGET_MS / 1000.0 * (read_us.median or 0.0)  # one read per heartbeat
    t.targets.append(
        Target(
            f"stragglers' sampling + reads < 1 % of a {STEP_BUDGET_MS:g} ms step",
            f"{extra_us / 10 / STEP_BUDGET_MS:.4f} % ({extra_us:.1f} µs)",
            extra_us / 1000.0 < STEP_BUDGET_MS / 100.0,
        )
    )
    fsdp_us = FSDP_COLLECTIVES * (timer_ns.median or 0.0) / 1000.0
    t.targets.append(
        Target(
            f"FSDP: timing {FSDP_COLLECTIVES} collectives < 1 % of a {STEP_BUDGET_MS:g} ms step",
            f"{fsdp_us / 10 / STEP_BUDGET_MS:.4f} % ({fsdp_us:.1f} µs)",
            fsdp_us / 1000.0 < STEP_BUDGET_MS / 100.0,
        )
    )
    hb_per_step = STEP_BUDGET_MS / 1000.0  # 1 Hz heartbeats: one per 50 steps of 20 ms
    med_step = step_ns.median or 0.0
    med_due = due_us.median or 0.0
    overhead = (med_step / 1e6 + hb_per_step * med_due / 1e3) / STEP_BUDGET_MS * 100
    t.row(
        f"per-step overhead, % of a {STEP_BUDGET_MS:g} ms step (1 Hz heartbeats)",
        {
            cols[0]: f"{overhead:.5f} %",
            cols[1]: "-"
            if isinstance(nv_hb, str) or nv_hb.median is None
            else f"{nv_hb.median / 1e3 / STEP_BUDGET_MS * 100:.5f} % (one heartbeat per step)",
        },
    )
    if isinstance(nv_hb, Cell):
        t.add_ratio("heartbeat send rvsup / NVRx", send_us, nv_hb)
    t.targets.append(
        Target("step() nothing due <= 0.3 µs", f"{med_step:.1f} ns", med_step <= 300.0)
    )
    med_send = send_us.median
    t.targets.append(
        Target(
            "heartbeat send <= 5 µs",
            f"{med_send:.2f} µs" if med_send else "n/a",
            None if med_send is None else med_send <= 5.0,
        )
    )
    t.notes.append(
        f"{int(m['received'][0])} messages reached the ROUTER, "
        f"{int(m['dropped'][0])} dropped by the full send queue (never blocks); "
        f"stdev of step() batches {statistics.pstdev(m['step_ns']):.1f} ns"
    )
    return t
