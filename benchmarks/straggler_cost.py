"""What naming stragglers costs a rank (figure 7's last rows), in a real 1-process gloo group.

The SDK adds nothing to ``step()``: it asks DDP's reducer to sample its backward-pass timings
more often than torch's default (every step at most, instead of every 100th) and reads the
newest sample when a heartbeat is due. Measured here: a small DDP training step (forward,
backward with its all-reduce, optimizer step) with the reducer sampling every step against
torch's default, interleaved in batches so that drift of a shared machine hits both alike; and
one read of the newest sample (``worker_sdk.runtime.stragglers.CommWait.read``).

Under FSDP the SDK times the blocking collectives FSDP calls through ``torch.distributed``
(``worker_sdk.runtime.device_wait.timed``): measured here, what the timer adds to one call
(a timed no-op against the no-op, interleaved), to be multiplied by the collectives of a step
(FSDP: about three per sharded unit: its forward all-gather, its backward all-gather and its
reduce-scatter).
"""

from __future__ import annotations

import time
from pathlib import Path

_DEFAULT_RATE = 100  # torch's kDDPRuntimeLoggingSampleRate


def measure_straggler_cost(directory: Path, batches: int, per_batch: int) -> dict[str, list[float]]:
    """µs per DDP step sampled every step / at torch's default rate (one value per batch), and
    µs per read of the newest sample."""
    import torch
    import torch.distributed as dist
    from torch import nn

    from worker_sdk.runtime.stragglers import CommWait

    directory.mkdir(parents=True, exist_ok=True)
    store = directory / "store"
    store.unlink(missing_ok=True)
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one rank per core, as torchrun's OMP_NUM_THREADS=1 default
    try:
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 1))
        ddp = nn.parallel.DistributedDataParallel(model)
        opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
        x = torch.randn(64, 256)

        def run(n: int) -> float:
            t0 = time.perf_counter_ns()
            for _ in range(n):
                ddp(x).pow(2).mean().backward()
                opt.step()
                opt.zero_grad()
            return (time.perf_counter_ns() - t0) / n / 1000.0

        run(50)  # warm-up: the first iterations are always sampled, buckets are rebuilt
        every, default = [], []
        for _ in range(batches):
            ddp._set_ddp_runtime_logging_sample_rate(1)
            every.append(run(per_batch))
            ddp._set_ddp_runtime_logging_sample_rate(_DEFAULT_RATE)
            default.append(run(per_batch))
        wait = CommWait.of([ddp])
        assert wait is not None
        reads = []
        for _ in range(200):
            run(1)
            t0 = time.perf_counter_ns()
            wait.read(2)
            reads.append((time.perf_counter_ns() - t0) / 1000.0)
    finally:
        torch.set_num_threads(threads)
        dist.destroy_process_group()
    return {
        "sampled_every_us": every,
        "sampled_default_us": default,
        "read_us": reads,
        "timed_call_ns": _timer_cost(batches, per_batch * 100),
    }


def _noop(*args: object, **kwargs: object) -> None:
    return None


def _timer_cost(batches: int, calls: int) -> list[float]:
    """ns the collective timer adds to one call: a timed no-op less the no-op, per batch."""
    from worker_sdk.runtime.device_wait import timed

    wrapped = timed(_noop, [0.0])
    out = []
    for _ in range(batches):
        t0 = time.perf_counter_ns()
        for _ in range(calls):
            _noop(1, group=None)
        t1 = time.perf_counter_ns()
        for _ in range(calls):
            wrapped(1, group=None)
        t2 = time.perf_counter_ns()
        out.append(((t2 - t1) - (t1 - t0)) / calls)
    return out
