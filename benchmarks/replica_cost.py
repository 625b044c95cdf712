"""What the replica check costs a rank (figure 7's rows for ``[anomaly] verify_every_steps``).

At a check, each DDP rank fingerprints its parameters (a strided sample of at most
``worker_sdk.runtime.replicas.SAMPLE`` elements of every parameter, summed in float64) and the
ranks all-gather one int64 each. Timed here on a module with GPT-2 small's parameter shapes
(148 tensors, 124 M parameters; smoke: the same count of tensors, about 64 times narrower): the
fingerprint and the all-gather in a real 1-process gloo group, and (not in the smoke run) the
all-gather between 2 processes on this machine (2 ranks, one per process, as torchrun starts
them).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

_LAYERS = 12


def gpt2_shapes(width: int, vocab: int) -> list[tuple[int, ...]]:
    """The parameter shapes of nanoGPT's GPT-2 small (148 tensors) at ``width``."""
    block = [(width,), (width,), (3 * width, width), (3 * width,), (width, width), (width,)]
    block += [(width,), (width,), (4 * width, width), (4 * width,), (width, 4 * width), (width,)]
    return [(vocab, width), (1024, width), *(block * _LAYERS), (width,), (width,)]


def _module(shapes: list[tuple[int, ...]]) -> Any:
    import torch
    from torch import nn

    module = nn.Module()
    module.params = nn.ParameterList(nn.Parameter(torch.full(s, 0.01)) for s in shapes)
    return module


def _init(store: Path, rank: int, world: int) -> None:
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)


def measure_replica_cost(directory: Path, checks: int, *, smoke: bool) -> dict[str, list[float]]:
    """µs per fingerprint, per all-gather (1 process, then 2) and per whole check (1 process),
    per parameter checksum of the resume check; the parameters' count, in millions."""
    import torch
    import torch.distributed as dist

    from worker_sdk.runtime.replicas import ReplicaCheck, compare, fingerprint
    from worker_sdk.runtime.step_prints import parameter_sum

    directory.mkdir(parents=True, exist_ok=True)
    store = directory / "store"
    store.unlink(missing_ok=True)
    _init(store, 0, 1)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one rank per core, as torchrun's OMP_NUM_THREADS=1 default
    try:
        shapes = gpt2_shapes(12, 804) if smoke else gpt2_shapes(768, 50304)
        module = _module(shapes)
        millions = sum(p.numel() for p in module.parameters()) / 1e6
        check = ReplicaCheck(1, [module], -1)
        result: dict[str, list[float]] = {
            "fingerprint_us": [],
            "gather_us": [],
            "check_us": [],
            "resume_sum_us": [],
        }
        for i in range(checks + 3):  # the first 3 warm up
            t0 = time.perf_counter_ns()
            mine = fingerprint([module], i)
            t1 = time.perf_counter_ns()
            compare(mine)
            t2 = time.perf_counter_ns()
            check.run(i)
            t3 = time.perf_counter_ns()
            float(parameter_sum([module]))  # the resume check's, read at once here
            t4 = time.perf_counter_ns()
            if i >= 3:
                result["resume_sum_us"].append((t4 - t3) / 1000.0)
                result["fingerprint_us"].append((t1 - t0) / 1000.0)
                result["gather_us"].append((t2 - t1) / 1000.0)
                result["check_us"].append((t3 - t2) / 1000.0)
    finally:
        torch.set_num_threads(threads)
        dist.destroy_process_group()
    # 2 more interpreters importing torch: a few seconds, left out of the smoke run
    result["gather_2p_us"] = [] if smoke else _gather_two_processes(directory, checks)
    result["params_m"] = [millions]
    return result


def _gather_two_processes(directory: Path, calls: int) -> list[float]:
    """µs per all-gather of one int64 between 2 processes (rank 0's timings)."""
    store = directory / "store2"
    store.unlink(missing_ok=True)
    env = dict(os.environ, OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "benchmarks.replica_cost", str(store), str(calls)]
    procs = [
        subprocess.Popen([*cmd, str(r)], env=env, stdout=subprocess.PIPE, text=True) for r in (0, 1)
    ]
    outs = [p.communicate(timeout=120)[0] for p in procs]
    if any(p.returncode for p in procs):
        raise RuntimeError(f"the 2-process all-gather failed: {[p.returncode for p in procs]}")
    timings: list[float] = json.loads(outs[0].strip().splitlines()[-1])
    return timings


def _gather_rank(store: Path, calls: int, rank: int) -> None:
    """One rank of the 2-process all-gather: prints its µs per call (JSON)."""
    import torch.distributed as dist

    from worker_sdk.checkpoint.collectives import all_gather_ints

    _init(store, rank, 2)
    try:
        out = []
        for i in range(calls + 3):
            t0 = time.perf_counter_ns()
            all_gather_ints([i])
            if i >= 3:
                out.append((time.perf_counter_ns() - t0) / 1000.0)
        print(json.dumps(out), flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    _gather_rank(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
