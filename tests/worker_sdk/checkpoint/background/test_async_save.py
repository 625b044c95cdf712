"""Asynchronous saves (``[checkpoint] async = true``), with real torchrun, 2 ranks, gloo, CPU:
bit-identical to synchronous saves, kill -9 in each phase of a save never loads a torn
checkpoint, a full disk fails one save without losing anything, a stop waits for the save in
flight, and memory does not grow over many saves."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.helpers.harness import events, named, running, rvsup, wait_progress
from tests.helpers.harness import write_job as write_rvsup_job
from tests.helpers.sharded import Run, torchrun
from tests.helpers.states import assert_same_state, load_final
from tests.helpers.tmpfs import tmpfs
from worker_sdk.contract import layout
from worker_sdk.contract.layout import committed_name

pytestmark = [pytest.mark.process, pytest.mark.timeout(240)]


@pytest.fixture(autouse=True)
def no_process_left_behind() -> Iterator[None]:
    """Every test must leave no child process (ranks, writers) alive (those alive before it,
    such as the Slurm test cluster's daemons when it is up, excepted)."""
    before = {p.pid for p in psutil.Process().children(recursive=True)}

    def new() -> list[psutil.Process]:
        return [p for p in psutil.Process().children(recursive=True) if p.pid not in before]

    yield
    deadline = time.monotonic() + 10
    while new() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert new() == []


def _manifest_modes(ckpt: Path) -> set[str | None]:
    valid, _ = layout.scan(ckpt)
    return {info.mode for info in valid}


# FSDP1 only: FSDP2's and DDP's asynchronous saves are killed, resumed and compared bit for bit
# by the kill -9 cases below (the same path, a save in flight at the kill)
@pytest.mark.parametrize("kind", ["fsdp1"])
def test_async_saves_resume_bit_identical_to_an_uninterrupted_sync_run(
    tmp_path: Path, references: dict[str, Run], kind: str
) -> None:
    """Asynchronous saves, rank 1 SIGKILLed at step 9, resumed: the final full state, extra and
    RNG draws equal an uninterrupted run with synchronous saves, bit for bit."""
    ckpt = tmp_path / "ckpt"
    killed = torchrun(
        tmp_path, "killed", kind=kind, ckpt=ckpt, fails=True, FAULT="kill:1:9", RVSUP_CKPT_ASYNC="1"
    )
    assert killed.killed() == {1: "kill 9"}
    assert _manifest_modes(ckpt) == {"async"}
    # step 7's save was in flight when rank 1 died 2 steps later: it may or may not be durable
    latest = layout.latest(ckpt)
    assert latest is not None
    assert latest.step in (3, 7)
    run = torchrun(tmp_path, "resumed", kind=kind, ckpt=ckpt, RVSUP_CKPT_ASYNC="1")
    assert f"rank 1 of 2 resumes at {latest.step + 1}" in run.output
    assert_same_state(references[kind].state(), run.state())
    assert run.ranks() == references[kind].ranks()


@pytest.mark.parametrize(
    ("kind", "fault"),
    [
        ("fsdp2", "killstage:1:11"),
        ("fsdp2", "killwriting:1:11"),
        ("fsdp2", "killrename:0:11"),
        ("ddp", "killwriting:1:11"),
        # no ("ddp", "killrename"): the rename is rank 0's writer's, once every part is
        # written, the same step whatever the parallelism (the FSDP2 case covers it)
    ],
)
def test_kill9_in_each_phase_of_an_async_save_never_loads_it(
    tmp_path: Path, references: dict[str, Run], kind: str, fault: str
) -> None:
    """SIGKILL of a rank while step 11's save is staged, while its writer has written its part
    (before telling rank 0), or once rank 0's writer wrote the manifest (before the rename):
    step 11 is never committed and the newest committed checkpoint is the one before it. The
    run resumed from it ends bit-identical; it runs after the kill that leaves the most behind
    (the manifest written: FSDP2's rename) and after DDP's (its other layout). A torn save
    without a manifest is passed over by the same scan (its temporary name), which
    tests/worker_sdk/checkpoint/test_sharded_resume.py resumes past too."""
    ckpt = tmp_path / "ckpt"
    killed = torchrun(
        tmp_path, "killed", kind=kind, ckpt=ckpt, fails=True, FAULT=fault, RVSUP_CKPT_ASYNC="1"
    )
    fault_kind, rank, step = fault.split(":")
    assert killed.killed() == {int(rank): f"{fault_kind} {step}"}
    assert not (ckpt / committed_name(11)).exists()
    assert _manifest_modes(ckpt) == {"async"}
    [torn] = [p for p in ckpt.iterdir() if p.name.startswith(".tmp-step-0000000011-")]
    if fault.startswith("killrename"):
        assert (torn / layout.MANIFEST).exists(), "the kill came after the manifest"
    # step 7's commit races the teardown that rank 1's death starts on rank 0
    latest = layout.latest(ckpt)
    assert latest is not None
    assert latest.step in (3, 7)
    if kind == "fsdp2" and not fault.startswith("killrename"):
        return
    run = torchrun(tmp_path, "resumed", kind=kind, ckpt=ckpt, RVSUP_CKPT_ASYNC="1")
    assert f"rank 0 of 2 resumes at {latest.step + 1}" in run.output
    assert_same_state(references[kind].state(), run.state())
    assert run.ranks() == references[kind].ranks()


def _async_job(tmp: Path, final: Path, *, asynchronous: bool = True, **env: str) -> Path:
    return write_rvsup_job(
        tmp,
        env={"FINAL": str(final), **env},
        checkpoint=f"every_steps = 10\nasync = {str(asynchronous).lower()}",
    )


def test_under_rvsup_async_commits_are_recorded_and_a_stop_waits_for_the_save_in_flight(
    tmp_path: Path, reference_final: Path
) -> None:
    """Under rvsup with async saves: checkpoint_committed says mode "async" and a blocked time
    below the time until durable; `rvsup stop` lands while saves are in flight, the stop's
    checkpoint is committed after them (exit 75), and the resumed run ends bit-identical to
    the synchronous reference."""
    final = tmp_path / "final.pt"
    # BALLAST_MB makes each background write take a while: the stop meets one in flight
    # and from step 22 a step takes 1 s until the resumed run: on a loaded machine the stop
    # once came after the 60th step (exit 0)
    slow = tmp_path / "slow"
    slow.touch()
    job = _async_job(
        tmp_path,
        final,
        STEP_SLEEP="0.05",
        BALLAST_MB="48",
        TAIL_FROM="22",
        TAIL_SLEEP="1",
        SLOW_WHILE=str(slow),
    )
    with running(job) as proc:
        wait_progress(job, min_step=21)
        res = rvsup("stop", str(job), timeout=60)
        assert res.returncode == 0, res.stderr
        proc.communicate(timeout=60)
    assert proc.returncode == 75
    evs = events(tmp_path / "run")
    commits = named(evs, "checkpoint_committed")
    asynchronous = [c for c in commits if c["mode"] == "async"]
    assert asynchronous, commits
    assert all(c["blocked_s"] < c["seconds"] for c in asynchronous if c["seconds"])
    stop_step = named(evs, "job_stopped")[0]["step"]
    assert [c["mode"] for c in commits if c["step"] == stop_step] == ["sync"]
    assert max(c["step"] for c in commits) == stop_step
    slow.unlink()
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    assert named(events(tmp_path / "run"), "attempt_started")[-1]["resume_step"] == stop_step + 1
    assert_same_state(load_final(reference_final), load_final(final))


@pytest.fixture
def small_tmpfs(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs mounted (as root) on a fresh directory; skipped without root."""
    with tmpfs(tmp_path / "small", "64m", mode="0700") as mounted:
        yield mounted


@pytest.mark.parametrize("asynchronous", [True, False], ids=["async", "sync"])
def test_a_full_disk_fails_one_save_and_nothing_is_lost(
    tmp_path: Path, small_tmpfs: Path, reference_final: Path, asynchronous: bool
) -> None:
    """ENOSPC in the checkpoint directory during a save (a background write, or a synchronous
    one that every rank agrees failed): checkpoint_failed (step, rank, reason), nothing of that
    step committed, the previous checkpoint kept and valid, no failure, training goes on, the
    next save (disk freed) commits, and the job ends bit-identical."""
    final = tmp_path / "final.pt"
    job = _async_job(
        tmp_path,
        final,
        asynchronous=asynchronous,
        FAULT="fill:0:26,unfill:0:35",
        STEP_SLEEP="0.05",
    )
    text = job.read_text().replace('checkpoint_dir = "ckpt"', f'checkpoint_dir = "{small_tmpfs}"')
    job.write_text(text)
    res = rvsup("start", str(job), timeout=180)
    assert res.returncode == 0, res.stderr
    evs = events(tmp_path / "run")
    failed = named(evs, "checkpoint_failed")
    assert failed, res.stderr
    assert {f["step"] for f in failed} == {29}, (failed, res.stderr[-3000:])
    assert any("No space left" in f["reason"] for f in failed), [
        (f["rank"], f["reason"]) for f in failed
    ]
    committed = {c["step"] for c in named(evs, "checkpoint_committed")}
    assert 29 not in committed
    assert {19, 39, 59} <= committed
    assert not named(evs, "failure_detected")
    valid, skipped = layout.scan(small_tmpfs)
    assert not skipped
    assert 29 not in {info.step for info in valid}
    assert_same_state(load_final(reference_final), load_final(final))


def test_memory_does_not_grow_over_many_async_saves(tmp_path: Path) -> None:
    """25 asynchronous saves of a 16 MB model in one process: the resident memory of the rank
    and of its writer after the 25th save is within 8 MB of what it was after the 5th.

    glibc's malloc is pinned to mmap every block over 128 KiB: by default its threshold moves up
    after the first large free, and torch's 16 MB gradients then land on the heap, where the
    rank's resident size wanders by 100 MB from step to step without a single save."""
    script = tmp_path / "many.py"
    script.write_text(
        """
import os, sys, psutil, torch, worker_sdk
model = torch.nn.Linear(2048, 2048)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
worker_sdk.resume(model, opt, checkpoint_dir=sys.argv[1], every_steps=1, keep_last=2,
                  async_save=True)
def rss():
    me = psutil.Process()
    return sum(p.memory_info().rss for p in [me, *me.children()])
marks = {}
for step in range(26):
    model(torch.ones(4, 2048)).sum().backward()
    opt.step()
    opt.zero_grad()
    worker_sdk.step(step)
    worker_sdk._current.saver.wait()
    if step in (5, 25):
        marks[step] = rss()
print("RSS", marks[5], marks[25], flush=True)
"""
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(Path(__file__).resolve().parents[4]),
        "MALLOC_MMAP_THRESHOLD_": str(128 << 10),
    }
    env.pop("RVSUP_ENDPOINT", None)
    done = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ckpt")],
        capture_output=True,
        text=True,
        timeout=180,
        env=env,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    [line] = [line for line in done.stdout.splitlines() if line.startswith("RSS")]
    after5, after25 = (int(x) for x in line.split()[1:])
    assert after25 - after5 < 8 << 20, (after5, after25)
    with contextlib.suppress(FileNotFoundError):
        assert len(layout.scan(tmp_path / "ckpt")[0]) == 2
