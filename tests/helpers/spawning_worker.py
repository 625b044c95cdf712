"""A training script whose ranks start processes that try to outlive their attempt.

Every rank starts, at the beginning of every attempt: a child; a grandchild in a session of its
own (its parent, a shell, exits at once, so it is re-parented); a double-forked daemon; and
DataLoader workers (2, persistent on rank 0, not on rank 1), kept busy by an iterator that lives
as long as the rank. Each helper's command line carries ``SPAWN_MARK`` and ``aNrR-what``; the
DataLoader workers write ``PID STARTTIME`` to ``SPAWN_DIR/workers-aN-rR``.

With ``KILL_AT=step``, rank 1 of attempt 1 kills itself with SIGKILL there. Before the first step
of a later attempt rank 0 writes ``SPAWN_DIR/alive-before-aN.json``: every process of an earlier
attempt that is still alive.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, Dataset

import worker_sdk

SLEEP = "import time; time.sleep(300)"
DAEMON = (
    "import os, time\n"
    "if os.fork(): os._exit(0)\n"
    "os.setsid()\n"
    "if os.fork(): os._exit(0)\n"
    "time.sleep(300)\n"
)


def start_time(pid: int) -> float | None:
    """When ``pid`` started; None when it is gone (or a zombie)."""
    try:
        proc = psutil.Process(pid)
        return None if proc.status() == psutil.STATUS_ZOMBIE else proc.create_time()
    except psutil.Error:
        return None


def marked(mark: str) -> dict[int, str]:
    """pid -> label (the word after ``mark`` in its command line) of every live process whose
    command line carries ``mark``."""
    found = {}
    for proc in psutil.process_iter():
        try:
            words = proc.cmdline()
            if mark in words[:-1] and proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = words[words.index(mark) + 1]
        except psutil.Error:
            continue
    return found


class Numbers(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 10**6

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.full((32,), float(index % 7))


def note_worker(_: int) -> None:
    pid = os.getpid()
    path = (
        Path(os.environ["SPAWN_DIR"])
        / f"workers-a{os.environ['RVSUP_ATTEMPT']}-r{os.environ['RANK']}"
    )
    with open(path, "a") as f:
        f.write(f"{pid} {start_time(pid)!r}\n")


def spawn_helpers(mark: str, label: str) -> None:
    py = sys.executable
    subprocess.Popen([py, "-c", SLEEP, mark, f"{label}-child"])
    subprocess.Popen(["sh", "-c", f'setsid "$0" -c "{SLEEP}" {mark} {label}-setsid &', py])
    subprocess.Popen([py, "-c", DAEMON, mark, f"{label}-daemon"]).wait()


def alive_from_before(attempt: int) -> list[str]:
    """Processes of attempts before ``attempt`` still alive: helpers by their mark, DataLoader
    workers by pid and start time."""
    alive = [
        f"{pid} {label}"
        for pid, label in marked(os.environ["SPAWN_MARK"]).items()
        if int(label[1 : label.index("r")]) < attempt
    ]
    for path in Path(os.environ["SPAWN_DIR"]).glob("workers-a*"):
        if int(path.name.split("-")[1][1:]) < attempt:
            alive += [f"{line} dataloader worker" for line in still_running(path)]
    return alive


def still_running(workers: Path) -> list[str]:
    """The lines ``PID STARTTIME`` of ``workers`` whose process still runs."""
    return [
        line
        for line in workers.read_text().splitlines()
        if start_time(int(line.split()[0])) == float(line.split()[1])
    ]


def main() -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    attempt = int(os.environ["RVSUP_ATTEMPT"])
    out = Path(os.environ["SPAWN_DIR"])
    spawn_helpers(os.environ["SPAWN_MARK"], f"a{attempt}r{rank}")
    loader = DataLoader(
        Numbers(),
        batch_size=4,
        num_workers=2,
        persistent_workers=rank == 0,
        worker_init_fn=note_worker,
    )
    batches = iter(loader)
    next(batches)
    workers = out / f"workers-a{attempt}-r{rank}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and len(workers.read_text().splitlines()) < 2:
        time.sleep(0.05)
    torch.manual_seed(0)
    ddp = DistributedDataParallel(nn.Linear(32, 1))
    opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
    start, _ = worker_sdk.resume(ddp, opt)
    if rank == 0 and attempt > 1:
        alive = alive_from_before(attempt)
        (out / f"alive-before-a{attempt}.json").write_text(json.dumps(alive))
    kill_at = int(os.environ.get("KILL_AT", "-1"))
    for step in range(start, int(os.environ["TOTAL_STEPS"])):
        if step == kill_at and rank == 1 and attempt == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        x = next(batches)
        loss = ddp(x).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(0.02)
        worker_sdk.step(step)


if __name__ == "__main__":
    main()
