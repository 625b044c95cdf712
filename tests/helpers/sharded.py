"""The SDK's sharded jobs without rvsup: tests/helpers/sharded_worker.py run by torchrun to
completion, and what each run left behind (for the checkpoint tests, sync and async)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.fixtures import built_once
from tests.helpers.harness import reaped

__all__ = ["References", "Run", "torchrun"]

WORKER = Path(__file__).with_name("sharded_worker.py")
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Run:
    """What one torchrun left behind."""

    out: Path  # rank 0's full state (torch.save); OUT.rank<r>.json beside it
    output: str  # torchrun's and the ranks' stdout and stderr
    world: int

    def state(self) -> Any:
        """The full (unsharded) model, optimizer and schedule state rank 0 wrote."""
        import torch  # only here: the conftest that holds the fixture is read without torch too

        return torch.load(self.out, map_location="cpu", weights_only=True)

    def ranks(self) -> list[dict[str, Any]]:
        """Every rank's extra counter and next random draw."""
        return [json.loads(Path(f"{self.out}.rank{r}.json").read_text()) for r in range(self.world)]

    def killed(self) -> dict[int, str]:
        """The ranks that killed themselves by a FAULT, each with its own word for it
        ("<fault> <step>", written just before its SIGKILL)."""
        marks = {r: Path(f"{self.out}.rank{r}.killed") for r in range(self.world)}
        return {r: p.read_text() for r, p in marks.items() if p.exists()}


def torchrun(
    tmp: Path,
    name: str,
    *,
    kind: str,
    nproc: int = 2,
    total: int = 16,
    ckpt: Path | None = None,
    fails: bool = False,
    **env: str,
) -> Run:
    """Run the worker on ``nproc`` ranks to completion (checkpoints every 4 steps), expecting
    success or (``fails``) a failure; every process of the run is SIGKILLed on the way out."""
    out = tmp / f"{name}.pt"
    full_env = {
        **{k: v for k, v in os.environ.items() if not k.startswith("RVSUP_")},
        "PYTHONPATH": str(REPO),
        "OMP_NUM_THREADS": "1",
        "KIND": kind,
        "CKPT": str(ckpt or tmp / f"{name}-ckpt"),
        "OUT": str(out),
        "TOTAL": str(total),
        "EVERY": "4",
        **env,
    }
    argv = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "--max-restarts=0",
        "--monitor-interval=0.1",
        str(WORKER),
    ]
    proc = subprocess.Popen(
        argv, env=full_env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    with reaped(proc):
        output, _ = proc.communicate(timeout=150)
    assert (proc.returncode != 0) == fails, _failure_text(proc.returncode, output)
    return Run(out, output, nproc)


def _failure_text(returncode: int, output: str) -> str:
    """Why a run ended unexpectedly: its exit code and the lines that say why first (a
    truncated report still shows them), then the end of its output."""
    telling = [
        line
        for line in output.splitlines()
        if any(word in line for word in ("Error", "error:", "exitcode", "Signal", "Killed"))
    ]
    summary = "\n".join(telling[:20])
    return f"torchrun exited {returncode}\n{summary}\n--- output:\n{output[-6000:]}"


class References(dict[str, Run]):
    """Uninterrupted 16-step runs by parallelism, each run when first asked for, once for the
    whole test run (every pytest-xdist worker reads the same one: see built_once)."""

    def __init__(self, factory: pytest.TempPathFactory) -> None:
        super().__init__()
        self.factory = factory

    def __missing__(self, kind: str) -> Run:
        def build(tmp: Path) -> Path:
            run = torchrun(tmp, kind, kind=kind)
            (tmp / OUTPUT).write_text(run.output)
            return run.out

        out = built_once(self.factory, f"reference-sharded-{kind}", build)
        run = Run(out, (out.parent / OUTPUT).read_text(), world=2)
        self[kind] = run
        return run


OUTPUT = "output.txt"  # beside a reference run's state: what torchrun printed
