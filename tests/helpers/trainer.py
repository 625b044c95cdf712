"""The process tests' training script: the example's DDP MLP plus fault switches.

FAULT="kind:rank:step[:attempt]" (several separated by ","); rank "*" means every rank, attempt
"*" or absent every attempt. Kinds: raise, kill (SIGKILL itself), oom (raise
torch.OutOfMemoryError), sleep (sleep forever inside the loop), sigstop (SIGSTOP itself), deadlock
(the main thread waits on a lock it holds), spin (a busy infinite loop), eval (EVAL_S seconds of
CPU work, undeclared), hooksleep (a blocking sleep of EVAL_S seconds), threadwait / queuewait (EVAL_S seconds
waiting on a thread of its own that sleeps: on its future, on a queue.Queue it feeds), mismatch
(a receive the other rank never sends while it waits in the next all-reduce: a real gloo hang),
pollwait (give it to every rank: rank 0 polls an all-reduce of the default group and rank 1 one
of a second group, ``Work.is_completed()`` in a loop, neither ever joins the other's: two hosts
that spin waiting, as CUDA's wait does behind a hung NCCL kernel), ignore_term (ignore SIGTERM
from that step on), phase (PHASE_S seconds inside
worker_sdk.phase("eval")), exit0 (leave early), fill / unfill (fill the checkpoint
directory's file system with a file, remove it), shmfill / shmunfill (the same in the memory
tier's memory_dir), hostoom (move into a new memory cgroup below its own, limited to
OOM_LIMIT_BYTES, and allocate until the kernel's OOM killer strikes), prep (local rank 0 of
every node prepares its node's data for PREP_S="host:seconds,...,*:seconds" of CPU work while
the other ranks wait in a barrier; give it to every rank), killagent (SIGKILL this node's rvsup
agent of this attempt). OOM_BEFORE_RESUME=n raises
OutOfMemoryError before resume() in attempt n. STEP_SLEEP=seconds slows every step,
TAIL_SLEEP=seconds the steps from TAIL_FROM on (room for an outside fault aimed near the end);
SLOW_WHILE=path: STEP_SLEEP only while that file exists (a test keeps the job slow while it acts
on it, then lets it run to its end at full speed); BALLAST_MB=n adds n MB to every rank's
checkpoint; FINAL=path: rank 0 saves the final model and optimizer there.
LOSS=float passes the loss to step() as a Python float, LOSS=tensor as the 0-d tensor; the kind
nan poisons that step's batch (the loss is NaN); NAN_FROM=n makes every loss from step n on NaN,
whatever the data; SPIKE="from:to:factor" scales the loss of the steps in [from, to); the kind
bitflip flips a bit of the rank's first weight before that step (its replica diverges).
BAD_NODE="host:step": the ranks on that host raise at that step in every attempt (a bad node).
OMIT_STEPS="from:to,..." never runs the steps in [from, to) (the uninterrupted run a rollback that
skipped them must end like). RESHUFFLE=1 draws a permutation from the global RNG right after
resume() (a script reshuffling its data there: a resume is then not exact). ACCUMULATE=k
accumulates gradients over k steps (``no_sync()`` but on the k-th, whose optimizer step ends
with ``zero_grad()``): the saves between are taken mid-accumulation; FINAL then holds the
gradients too. SHAPE=accelerate writes the loop as Hugging Face Accelerate's guides do: model,
optimizer, a shuffling DataLoader over a fixed dataset and the scheduler through
``accelerator.prepare()``, an epoch loop that starts at ``resume()``'s epoch and skips the
batches done with ``accelerator.skip_first_batches`` (the batches come from the loader, not
from the global generator). (The chaos runner's Lightning shape runs
tests/helpers/lightning_worker.py instead, with FAULT and the pacing switches.)
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

import worker_sdk


def faults_now(rank: int, step: int, attempt: int) -> list[str]:
    out = []
    bad_node, _, bad_step = os.environ.get("BAD_NODE", "").partition(":")
    if bad_node and bad_node == socket.gethostname() and int(bad_step or 0) == step:
        out.append("raise")  # a bad node: its ranks fail there at this step, every attempt
    for spec in filter(None, os.environ.get("FAULT", "").split(",")):
        kind, r, s, *a = spec.split(":")
        if r in ("*", str(rank)) and int(s) == step and (not a or a[0] in ("*", str(attempt))):
            out.append(kind)
    return out


def _prep_seconds(spec: str, host: str) -> float:
    """PREP_S's seconds for ``host`` ("node2:30,*:5": 30 on node2, 5 elsewhere)."""
    times = dict(item.split(":") for item in spec.split(","))
    return float(times.get(host, times.get("*", "5")))


def _kill_node_agent() -> None:
    """SIGKILL this node's agent of this attempt (the node wrapper's other child; ranks forked
    from a zygote are not the wrapper's descendants, so it is found by what it runs for)."""
    mine = {k: os.environ.get(k) for k in ("SLURMD_NODENAME", "RVSUP_JOB", "RVSUP_ATTEMPT")}
    agents = []
    for proc in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if "supervisor.agent" in proc.cmdline():
                env = proc.environ()
                if all(env.get(k) == v for k, v in mine.items()):
                    agents.append(proc)
    assert agents, f"no node agent of {mine}"
    for agent in agents:
        agent.kill()


def evaluate(seconds: float) -> None:
    """Busy work that touches neither the model nor any random generator (an evaluation that
    leaves the training bit-identical)."""
    a = torch.full((64, 64), 0.01)
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        a = torch.tanh(a @ a)


def _fill(filler: Path) -> None:
    """Write ``filler`` until its file system is full."""
    with open(filler, "ab", buffering=0) as f:  # unbuffered: closing it cannot fail
        try:
            while True:
                f.write(b"\0" * 2**16)
        except OSError:
            pass


def inject(kind: str, step: int) -> None:
    if kind == "raise":
        raise RuntimeError(f"injected failure at step {step}")
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    if kind == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB (injected)")
    if kind == "sleep":
        while True:
            time.sleep(3600)
    if kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    if kind == "deadlock":  # a Python deadlock: the main thread waits on a lock it holds
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    if kind == "spin":  # a busy infinite loop outside any collective
        spin = 0
        while True:
            spin += 1
    if kind == "eval":  # EVAL_S seconds of CPU work on this rank alone, undeclared (no phase)
        evaluate(float(os.environ.get("EVAL_S", "8")))
    if kind == "hooksleep":  # a blocking sleep of EVAL_S seconds in a logging hook
        time.sleep(float(os.environ.get("EVAL_S", "8")))
    if kind in ("threadwait", "queuewait"):  # EVAL_S seconds waiting on a thread of its own
        _wait_on_own_thread(float(os.environ.get("EVAL_S", "8")), kind == "queuewait")
    if kind == "pollwait":  # every rank spins on a collective the other never joins
        other = dist.new_group([0, 1])
        work = dist.all_reduce(
            torch.ones(1), group=other if dist.get_rank() else None, async_op=True
        )
        while not work.is_completed():
            pass
    if kind == "mismatch":  # a receive the peer never sends; the peer then waits in all-reduce
        dist.recv(torch.zeros(1), src=1 - dist.get_rank())
    if kind == "prep":  # local rank 0 prepares its node's data, the others wait for it
        if os.environ.get("LOCAL_RANK") == "0":
            evaluate(_prep_seconds(os.environ.get("PREP_S", "*:5"), socket.gethostname()))
        dist.barrier()
    if kind == "killagent":
        _kill_node_agent()
    if kind == "ignore_term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if kind == "phase":  # a long declared phase (evaluation) on this rank
        with worker_sdk.phase("eval"):
            time.sleep(float(os.environ.get("PHASE_S", "5")))
    if kind in ("nan", "bitflip"):  # done by main(): the batch, the weights
        return
    if kind == "exit0":
        os._exit(0)
    if kind == "fill":  # fill the checkpoint directory's file system (a file named "filler")
        _fill(Path(os.environ["RVSUP_CHECKPOINT_DIR"]) / "filler")
    if kind == "unfill":
        (Path(os.environ["RVSUP_CHECKPOINT_DIR"]) / "filler").unlink()
    if kind == "shmfill":  # the same in the memory tier's memory_dir (beside the job's folder)
        _fill(Path(os.environ["RVSUP_MEMORY_DIR"]).parent / "filler")
    if kind == "shmunfill":
        (Path(os.environ["RVSUP_MEMORY_DIR"]).parent / "filler").unlink()
    if kind == "hostoom":  # into a memory-limited cgroup, then allocate until the kernel kills us
        limited = _limited_memory_group(int(os.environ["OOM_LIMIT_BYTES"]))
        (limited / "cgroup.procs").write_text(str(os.getpid()))
        hog = []
        while True:
            hog.append(torch.ones(16 * 2**20 // 4))


def _wait_on_own_thread(seconds: float, through_queue: bool) -> None:
    """Wait for a thread of this rank that sleeps ``seconds`` (an upload, a logger's flush): on
    its future, or on a queue.Queue it feeds."""
    if through_queue:
        done: queue.Queue[bool] = queue.Queue()

        def feed() -> None:
            time.sleep(seconds)
            done.put(True)

        feeder = threading.Thread(target=feed)
        feeder.start()
        done.get()
        feeder.join()
        return
    with ThreadPoolExecutor(1) as pool:
        pool.submit(time.sleep, seconds).result()


def _limited_memory_group(limit: int) -> Path:
    """A new memory cgroup below this rank's own (the job's: its OOM kills are the job's),
    limited to ``limit`` bytes; the job's end removes it with the job's group."""
    from worker_sdk.checkpoint.memory.room import memory_groups

    for directory, v2 in memory_groups():
        limit_file = "memory.max" if v2 else "memory.limit_in_bytes"
        if (Path(directory) / limit_file).exists():
            child = Path(directory) / f"oom-{os.getpid()}"
            child.mkdir()
            (child / limit_file).write_text(str(limit))
            return child
    raise RuntimeError("no memory cgroup to limit")


EPOCH_STEPS = 12  # SHAPE=accelerate: the steps of an epoch


def _epochs(accelerator: Any, loader: Any, start: int, total: int) -> Iterator[tuple[int, Any]]:
    """(step, batch) from ``start`` to ``total``, epoch by epoch, as Accelerate's examples
    resume: the epoch of ``start``, its batches before it skipped."""
    per_epoch = len(loader)
    for epoch in range(start // per_epoch, -(-total // per_epoch)):
        skip = start - epoch * per_epoch
        batches = accelerator.skip_first_batches(loader, skip) if skip > 0 else loader
        for i, (x,) in enumerate(batches, start=max(skip, 0)):
            step = epoch * per_epoch + i
            if step >= total:
                return
            yield step, x


def _backward(accelerator: Any, loss: torch.Tensor) -> None:
    if accelerator is None:
        loss.backward()
    else:
        accelerator.backward(loss)


def main() -> None:
    if os.environ.get("OOM_BEFORE_RESUME") == os.environ.get("RVSUP_ATTEMPT"):
        raise torch.OutOfMemoryError("CUDA out of memory (injected before the SDK was set up)")
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("RVSUP_ATTEMPT", "0"))
    total = int(os.environ.get("TOTAL_STEPS", "60"))
    step_sleep = float(os.environ.get("STEP_SLEEP", "0"))
    tail_from = int(os.environ.get("TAIL_FROM", str(total)))
    tail_sleep = float(os.environ.get("TAIL_SLEEP", str(step_sleep)))
    slow_while = os.environ.get("SLOW_WHILE")
    loss_mode = os.environ.get("LOSS", "")
    nan_from = int(os.environ.get("NAN_FROM", str(total)))
    spike = [float(v) for v in os.environ.get("SPIKE", "0:0:1").split(":")]
    accumulate = int(os.environ.get("ACCUMULATE", "1"))
    omitted: set[int] = set()
    for span in filter(None, os.environ.get("OMIT_STEPS", "").split(",")):
        first, end = span.split(":")
        omitted.update(range(int(first), int(end)))
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 1))
    ddp: nn.Module
    accelerator = None
    if os.environ.get("SHAPE") == "accelerate":
        from accelerate import Accelerator
        from torch.utils.data import DataLoader, TensorDataset

        accelerator = Accelerator(cpu=True)
        data = TensorDataset(torch.randn(16 * dist.get_world_size() * EPOCH_STEPS, 32))
        opt = torch.optim.Adam(model.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.7)
        loader = DataLoader(data, batch_size=16, shuffle=True)
        ddp, opt, loader, sched = accelerator.prepare(model, opt, loader, sched)
    else:
        ddp = DistributedDataParallel(
            model, find_unused_parameters=os.environ.get("DDP_FIND_UNUSED") == "1"
        )
        opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=20, gamma=0.7)
    torch.manual_seed(1000 + rank)
    extra = {"seen": torch.zeros(1)}
    ballast_mb = int(os.environ.get("BALLAST_MB", "0"))  # makes every save slow
    if ballast_mb:
        extra["ballast"] = torch.zeros(ballast_mb * 2**18)
    start, extra = worker_sdk.resume(ddp, opt, sched, extra=extra)
    if os.environ.get("RESHUFFLE") == "1":
        torch.randperm(64)  # after the RNG states were restored: the batches shift
    last = os.environ.get("RVSUP_LAST_FAILURE", "-")
    ooms = os.environ.get("RVSUP_OOM_COUNT", "-")
    print(f"rank {rank} attempt {attempt} resumes at {start} after {last} ooms {ooms}", flush=True)
    loss = None  # no step left when the last checkpoint was the last step's
    if accelerator is not None:
        batches = _epochs(accelerator, loader, start, total)
    else:
        batches = ((step, None) for step in range(start, total))
    for step, batch in batches:
        if step in omitted:
            continue
        for kind in faults_now(rank, step, attempt):
            inject(kind, step)
        if "bitflip" in faults_now(rank, step, attempt):
            with torch.no_grad():
                next(model.parameters()).view(-1)[:1].view(torch.int32).bitwise_xor_(1 << 20)
        x = torch.randn(16, 32) if batch is None else batch
        if "nan" in faults_now(rank, step, attempt) or step >= nan_from:
            x[0, 0] = float("nan")  # a poisoned batch
        loss = nn.functional.mse_loss(ddp(x), x[:, :1]) * (
            spike[2] if spike[0] <= step < spike[1] else 1
        )
        if accumulate == 1:
            opt.zero_grad()
            _backward(accelerator, loss)
            opt.step()
            sched.step()
        else:
            synced = (step + 1) % accumulate == 0
            with contextlib.nullcontext() if synced else ddp.no_sync():  # type: ignore[operator]
                _backward(accelerator, loss / accumulate)
            if synced:
                opt.step()
                sched.step()
                opt.zero_grad()
        extra["seen"] += 1
        pause = tail_sleep if step >= tail_from else step_sleep
        if slow_while and not os.path.exists(slow_while):
            pause = 0.0
        if pause:
            time.sleep(pause)
        if loss_mode == "float":
            worker_sdk.step(step, extra=extra, loss=loss.item())
        elif loss_mode == "tensor":
            worker_sdk.step(step, extra=extra, loss=loss.detach())
        else:
            worker_sdk.step(step, extra=extra)
    if loss_mode and loss is not None:
        print(
            f"rank {rank} final loss {loss.item()} skipped {os.environ.get('RVSUP_SKIPPED_STEPS')}",
            flush=True,
        )
    final = os.environ.get("FINAL")
    if rank == 0 and final:
        state = {"model": model.state_dict(), "opt": opt.state_dict(), "seen": extra["seen"]}
        if accumulate > 1:
            state["grads"] = {n: p.grad for n, p in model.named_parameters()}
        torch.save(state, final)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
