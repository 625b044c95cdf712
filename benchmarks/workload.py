"""The benchmark workload: one DDP rank (gloo, CPU) of a small MLP, the same for every tool.

Run by every launcher the benchmarks compare. ``BENCH_MODE`` picks how it checkpoints:

- ``rvsup``: the two worker_sdk calls (checkpoint cadence from job.toml);
- ``plain``: what people write without a supervisor: rank 0 ``torch.save``s model, optimizer and
  step to ``BENCH_CKPT_DIR/ckpt-<step>.pt`` every ``BENCH_CKPT_EVERY`` steps, and every rank resumes
  from the newest such file;
- ``nvrx``: ``plain`` plus NVIDIA resiliency-extension heartbeats (one per step).

Every rank appends JSON lines to ``BENCH_RECORD_DIR/rank-<rank>.jsonl``: ``{"t": wall time,
"rank", "pid", "step", "event"}`` with events ``boot`` (process start, before torch is imported),
``start`` (after the resume; ``step`` is the step run next), ``step`` (a finished step), ``fault``
(just before a fault is injected) and ``done``. Every tool's MTTR and lost steps are computed from
these records the same way (:mod:`benchmarks.records`).

Faults: ``BENCH_FAULT="kind:rank:step[:every]"`` (several separated by ","). Without ``every`` a
fault fires once per run (a marker file in the record directory remembers it across restarts).
Kinds: ``kill`` (SIGKILL itself), ``sigstop`` (SIGSTOP itself), ``stuck`` (a receive nobody sends, so
the rank blocks inside gloo while the others block in their next all_reduce: an extra all_reduce
is no hang on gloo, which aborts on the size mismatch), ``oom`` (raise torch.OutOfMemoryError),
``deadlock`` (the main thread waits on a lock it holds), ``asleep`` (sleeps forever outside any
collective), ``loaderdeadlock`` (waits forever on a data-loader worker that never returns a
batch), and healthy slow work of ``BENCH_SLOW_S`` seconds (:func:`slow_work`): ``eval``,
``ckptwrite``, ``hooksleep``, ``epoch``, ``threadwait``, ``queuewait``, ``storagewrite``. The training gone
wrong (main() does it, not the process): ``nan`` poisons that step's batch (its loss is NaN), ``spike`` scales
the loss this process reports from that step on by ``BENCH_SPIKE_FACTOR`` (100; the gradient is
not scaled: what is measured is the detection, not the model's reaction). ``BENCH_LOSS=1`` passes
the loss to ``worker_sdk.step()`` as a float (under rvsup).

Pacing and the final state (figure 12): ``BENCH_STEP_MS`` makes every step take at least that long
(a sleep after a faster step: the same pace under every tool); ``BENCH_FINAL=1`` makes every rank
write its parameters, float32, concatenated in ``parameters()`` order, to
``BENCH_RECORD_DIR/final-rank-<rank>.bin`` after the last step (:func:`write_final`).
"""

from __future__ import annotations

import time

BOOT_T = time.time()

import datetime  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import queue  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
from concurrent.futures import ThreadPoolExecutor  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import IO, Any  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.parallel import DistributedDataParallel  # noqa: E402

IN_FEATURES = 64


class Recorder:
    """Appends this rank's event lines (flushed, not fsynced: a kill -9 keeps what was written)."""

    def __init__(self, directory: Path, rank: int) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.rank = rank
        self.pid = os.getpid()
        self._file: IO[str] = open(directory / f"rank-{rank}.jsonl", "a")  # noqa: SIM115

    def write(self, event: str, step: int, t: float | None = None, **extra: Any) -> None:
        line: dict[str, Any] = {"t": time.time() if t is None else t, "rank": self.rank}
        line["pid"] = self.pid
        line.update(step=step, event=event, **extra)
        self._file.write(json.dumps(line) + "\n")
        self._file.flush()


def parse_faults(spec: str) -> list[tuple[str, int, int, bool]]:
    """``"kill:1:40,oom:0:5:every"`` -> [(kind, rank, step, every_attempt)]."""
    out = []
    for item in filter(None, (s.strip() for s in spec.split(","))):
        kind, rank, step, *rest = item.split(":")
        out.append((kind, int(rank), int(step), bool(rest) and rest[0] == "every"))
    return out


def should_fire(record_dir: Path, kind: str, rank: int, step: int, every: bool) -> bool:
    """True when the fault fires now: always for ``every``, else only the first time in a run."""
    if every:
        return True
    marker = record_dir / f"fault-{kind}-{rank}-{step}.fired"
    try:
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        return False
    return True


def inject(kind: str, step: int) -> None:
    if kind == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "sigstop":
        os.kill(os.getpid(), signal.SIGSTOP)
    elif kind == "stuck":  # a receive nobody sends: the others then wait in their all_reduce
        dist.recv(torch.zeros(1), src=(dist.get_rank() + 1) % dist.get_world_size())
    elif kind == "oom":
        raise torch.OutOfMemoryError(f"CUDA out of memory at step {step} (injected)")
    elif kind == "deadlock":  # the main thread waits on a lock it holds
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()
    elif kind == "asleep":  # a wait on a dead service looks the same: no CPU, no end
        while True:
            time.sleep(3600)
    elif kind == "loaderdeadlock":  # its data-loader worker never returns a batch
        next(iter(torch.utils.data.DataLoader(_NeverReady(), num_workers=1)))
    elif kind in SLOW_KINDS:
        slow_work(kind, float(os.environ.get("BENCH_SLOW_S", "8")))
    else:
        raise ValueError(f"unknown fault kind {kind!r}")


SLOW_KINDS = ("eval", "ckptwrite", "hooksleep", "epoch", "threadwait", "queuewait", "storagewrite")


class _NeverReady(torch.utils.data.Dataset[int]):
    """A dataset whose every item waits forever (a worker deadlocked on a lock of its own)."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: int) -> int:
        threading.Event().wait()
        return index


def slow_work(kind: str, seconds: float) -> None:
    """Healthy work of ``seconds`` between two steps, without ``worker_sdk.phase()``: ``eval``
    (CPU, this rank alone; the others wait in the next all_reduce), ``ckptwrite`` (a checkpoint
    of the user's own: 16 MB writes, each fsynced, to one file), ``hooksleep`` (a blocking
    ``time.sleep`` in a logging hook), ``epoch`` (an epoch boundary: every rank reshuffles, rank
    r for ``seconds / (r + 1)``, then a barrier), ``threadwait`` / ``queuewait`` (the main thread
    waits on a thread of its own that sleeps: on its future, on a ``queue.Queue`` it feeds: an
    upload, a logger's flush), ``storagewrite`` (a 64 KiB file written to ``BENCH_SLOW_DIR``, slow
    storage whose server takes ``seconds`` per write, and closed: ``close()`` flushes in state D)."""
    end = time.monotonic() + (seconds / (dist.get_rank() + 1) if kind == "epoch" else seconds)
    if kind == "hooksleep":
        time.sleep(seconds)
    elif kind == "threadwait":
        with ThreadPoolExecutor(1) as pool:
            pool.submit(time.sleep, seconds).result()
    elif kind == "queuewait":
        done: queue.Queue[float] = queue.Queue()
        threading.Thread(target=lambda: done.put(_slept(seconds))).start()
        done.get()
    elif kind == "storagewrite":
        with open(Path(os.environ["BENCH_SLOW_DIR"]) / f"rank-{dist.get_rank()}.bin", "wb") as f:
            f.write(os.urandom(1 << 16))
    elif kind == "ckptwrite":
        path = Path(os.environ["BENCH_RECORD_DIR"]) / f"user-ckpt-{dist.get_rank()}.bin"
        chunk = os.urandom(16 * 2**20)
        with open(path, "wb") as f:
            while time.monotonic() < end:
                f.write(chunk)
                f.flush()
                os.fsync(f.fileno())
        path.unlink()
    else:
        a = torch.full((64, 64), 0.01)
        while time.monotonic() < end:
            a = torch.tanh(a @ a)
    if kind == "epoch":
        dist.barrier()


def _slept(seconds: float) -> float:
    time.sleep(seconds)
    return seconds


def build_model(width: int) -> nn.Module:
    return nn.Sequential(
        nn.Linear(IN_FEATURES, width),
        nn.ReLU(),
        nn.Linear(width, width),
        nn.ReLU(),
        nn.Linear(width, 1),
    )


class PlainCheckpoints:
    """The usual hand-written scheme: rank 0 torch.saves every N steps; all ranks load the newest."""

    def __init__(self, directory: Path, every: int, rank: int) -> None:
        self.directory = directory
        self.every = every
        self.rank = rank
        directory.mkdir(parents=True, exist_ok=True)

    def resume(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> int:
        files = sorted(self.directory.glob("ckpt-*.pt"))
        if not files:
            return 0
        state = torch.load(files[-1], map_location="cpu", weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        return int(state["step"]) + 1

    def maybe_save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        if self.rank != 0 or self.every <= 0 or (step + 1) % self.every:
            return
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
        torch.save(state, self.directory / f"ckpt-{step:08d}.pt")


class Pacer:
    """Makes every step take at least ``BENCH_STEP_MS`` (0: no pacing): sleeps the rest of a
    faster step. The deadline runs from the previous one, so a slow step is not made up for."""

    def __init__(self, step_ms: float) -> None:
        self.step_s = step_ms / 1000.0
        self._last = time.monotonic()

    @classmethod
    def from_env(cls) -> Pacer:
        return cls(float(os.environ.get("BENCH_STEP_MS", "0") or 0))

    def wait(self) -> None:
        if self.step_s <= 0:
            return
        left = self._last + self.step_s - time.monotonic()
        if left > 0:
            time.sleep(left)
        self._last = time.monotonic()


def write_final(record_dir: Path, rank: int, model: nn.Module) -> None:
    """This rank's parameters as float32 bytes, if ``BENCH_FINAL=1`` (written, then renamed)."""
    if os.environ.get("BENCH_FINAL") != "1":
        return
    with torch.no_grad():
        flat = torch.cat([p.detach().reshape(-1).float() for p in model.parameters()])
    data = bytes(flat.view(torch.uint8).tolist())
    tmp = record_dir / f".final-rank-{rank}.tmp"
    tmp.write_bytes(data)
    os.replace(tmp, record_dir / f"final-rank-{rank}.bin")


def _pg_timeout() -> datetime.timedelta | None:
    raw = os.environ.get("BENCH_PG_TIMEOUT", "")
    return datetime.timedelta(seconds=float(raw)) if raw else None


def main() -> None:
    mode = os.environ.get("BENCH_MODE", "plain")
    record_dir = Path(os.environ["BENCH_RECORD_DIR"])
    total = int(os.environ.get("BENCH_STEPS", "200"))
    width = int(os.environ.get("BENCH_WIDTH", "512"))
    batch = int(os.environ.get("BENCH_BATCH", "200"))
    faults = parse_faults(os.environ.get("BENCH_FAULT", ""))
    timeout = _pg_timeout()
    if timeout is None:
        dist.init_process_group("gloo")
    else:
        dist.init_process_group("gloo", timeout=timeout)
    rank = dist.get_rank()
    rec = Recorder(record_dir, rank)
    rec.write("boot", -1, t=BOOT_T)
    torch.manual_seed(0)
    model = build_model(width)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=1e-3, momentum=0.9)
    torch.manual_seed(1000 + rank)

    plain: PlainCheckpoints | None = None
    heartbeat: Any = None
    if mode == "rvsup":
        import worker_sdk

        start, _ = worker_sdk.resume(ddp, optimizer)
    else:
        every = int(os.environ.get("BENCH_CKPT_EVERY", "50"))
        plain = PlainCheckpoints(Path(os.environ["BENCH_CKPT_DIR"]), every, rank)
        start = plain.resume(model, optimizer)
        if mode == "nvrx":
            ft = importlib.import_module("nvidia_resiliency_ext.fault_tolerance")
            heartbeat = ft.RankMonitorClient()
            heartbeat.init_workload_monitoring()
    rec.write("start", start)
    report_loss = mode == "rvsup" and os.environ.get("BENCH_LOSS") == "1"
    scale = 1.0  # the reported loss's factor: BENCH_SPIKE_FACTOR once a spike fired
    pacer = Pacer.from_env()

    for step in range(start, total):
        poisoned = False
        for kind, r, s, every in faults:
            if r == rank and s == step and should_fire(record_dir, kind, r, s, every):
                rec.write("fault", step, kind=kind)
                if kind == "nan":
                    poisoned = True
                elif kind == "spike":
                    scale = float(os.environ.get("BENCH_SPIKE_FACTOR", "100"))
                else:
                    inject(kind, step)
        x = torch.randn(batch, IN_FEATURES)
        y = x[:, :8].sum(dim=1, keepdim=True)
        if poisoned:
            x[0, 0] = float("nan")
        optimizer.zero_grad(set_to_none=True)
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()
        rec.write("step", step)  # finished; what follows may save (and, under rvsup, exit)
        if plain is not None:
            plain.maybe_save(step, model, optimizer)
        if heartbeat is not None:
            heartbeat.send_heartbeat()
        if report_loss:
            worker_sdk.step(step, loss=loss.item() * scale)
        elif mode == "rvsup":
            worker_sdk.step(step)
        pacer.wait()
    write_final(record_dir, rank, model)
    rec.write("done", total - 1)
    if heartbeat is not None:
        heartbeat.shutdown_workload_monitoring()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
