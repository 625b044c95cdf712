"""Run one schedule for real: ``rvsup start`` (again after every stop or kill of rvsup), the faults
from outside aimed at their step, checkpoints damaged between starts; what happened, recorded.

Whatever of a run outlives it is found, reported and killed by the test suite's own guard
(``tests/helpers/process_guard.py``): the runner is the subreaper of everything it starts, so a run's
processes stay its descendants however they were started (forked from the zygote, double-forked,
``setsid()``-ed, with their environment cleared).
"""

from __future__ import annotations

import contextlib
import os
import queue
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
from watchdog.events import FileSystemEvent, FileSystemEventHandler
from watchdog.observers import Observer

from tests.helpers.harness import TRAINER, events, kill_tree, rvsup, rvsup_env, status, write_job
from tests.helpers.process_guard import guard
from worker_sdk.contract import layout

from .schedule import EXTERNAL, LAST_STEP, SKIP_STEPS, TOTAL_STEPS, Fault, Schedule

__all__ = ["WORKLOAD", "Observed", "execute", "guarded_run", "reference"]

STEP_SLEEP = "0.04"
# the last steps a fault may aim at, slower: a signal sent to rvsup after the runner saw that
# step (through `rvsup status`, tenths of a second under load) lands before the training ends
TAIL_SLEEP = "0.25"
HANG_TIMEOUT = "4s"
TMPFS_SIZE = "4m"  # a few dozen of the trainer's checkpoints
SHM_TMPFS_SIZE = "8m"  # memory_dir for a shmfull fault: the job's snapshots and room to spare
BALLAST_MB = "48"  # makes a save last long enough to be aimed at
RUN_TIMEOUT_S = 300.0
LEFTOVER_GRACE_S = 1.0  # rvsup has ended its processes when it exits: what remains is left
WORKLOAD: dict[str, str] = {}
"""More environment for every run of the chaos job, the reference runs included (``--accumulate
K``: ``ACCUMULATE``, gradients accumulated over K steps: tests/helpers/trainer.py; ``--shape``:
``SHAPE``, the job's loop, ``lightning`` running tests/helpers/lightning_worker.py)."""
_FROM_OUTSIDE = (*EXTERNAL, "writerkill")  # the runner strikes these, the trainer the rest
LIGHTNING = TRAINER.with_name("lightning_worker.py")  # the Lightning shape's script
_ZYGOTE = "-m worker_sdk.spawn.zygote "  # in a zygote's command line
_FORKED_WRITER = "(forked beside its rank)"  # in the command line of a forked snapshot writer


@dataclass
class Observed:
    """What one run did: exit code of every ``rvsup start``, its history, and the facts the
    runner itself caused (the step each aimed kill struck, the checkpoints it damaged)."""

    exit_codes: list[int] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    save_killed: dict[int, int] = field(default_factory=dict)
    """attempt -> step of the checkpoint (or snapshot) being written when a rank was killed,
    or the ranks' step when the zygote was."""
    damaged: dict[int, str] = field(default_factory=dict)
    """attempt -> checkpoint directory damaged after that attempt."""
    snapshot_damaged: dict[int, str] = field(default_factory=dict)
    """attempt -> memory snapshot directory damaged after that attempt."""
    writers_killed: dict[int, int] = field(default_factory=dict)
    """attempt -> how many snapshot writers a ``writerkill`` killed in it."""
    leftovers: list[str] = field(default_factory=list)
    history: str = ""
    memory_left: list[str] = field(default_factory=list)
    """What the job left in its ``memory_dir`` (the memory tier's snapshots) after it ended."""
    final: Path | None = None
    errors: list[str] = field(default_factory=list)
    """What went wrong in the runner itself (an aim missed, a timeout)."""
    seconds: float = 0.0


def reference(workdir: Path, omitted: Sequence[tuple[int, int]] = ()) -> Path:
    """The final state of the chaos job run without faults, the steps of the half-open ranges
    ``omitted`` left out (never run: what a rollback skips)."""
    workdir.mkdir(parents=True, exist_ok=True)
    final = workdir / "final.pt"
    omit = ",".join(f"{a}:{b}" for a, b in omitted)
    job = _job(workdir, Schedule(0, ()), ckpt="ckpt", final=final, omit=omit, paced=False)
    res = rvsup("start", str(job), timeout=RUN_TIMEOUT_S)
    if res.returncode != 0:
        raise RuntimeError(f"the fault-free reference run failed: {res.stderr[-2000:]}")
    return final


def execute(schedule: Schedule, workdir: Path, *, memory: str | None = None) -> Observed:
    """Run ``schedule`` in ``workdir`` (created); never leaves a process behind. ``memory``:
    the job's ``memory_every_steps`` (``"auto"`` or a number; None: the tier off), its
    snapshots in a directory of its own in ``/dev/shm``."""
    workdir.mkdir(parents=True)
    final = workdir / "final.pt"
    seen = Observed(final=final)
    started = time.monotonic()
    with (
        _checkpoint_dir(workdir, tmpfs=schedule.fills_checkpoints) as ckpt,
        _memory_dir(memory is not None, seen, tmpfs=schedule.fills_memory) as shm,
        guarded_run(seen),
    ):
        tier = None if memory is None or shm is None else (memory, shm)
        job = _job(workdir, schedule, ckpt=str(ckpt), final=final, memory=tier)
        try:
            _invocations(schedule, job, (ckpt, shm), seen, deadline=started + RUN_TIMEOUT_S)
        except (TimeoutError, subprocess.TimeoutExpired) as e:
            seen.errors.append(f"timed out: {e}")
    seen.events = events(workdir / "run")
    seen.history = rvsup("history", str(job), timeout=60).stdout
    seen.seconds = time.monotonic() - started
    return seen


def _job(
    workdir: Path,
    schedule: Schedule,
    *,
    ckpt: str,
    final: Path,
    omit: str = "",
    paced: bool = True,
    memory: tuple[str, Path] | None = None,
) -> Path:
    """The chaos job; ``paced``: slow steps that a fault from outside can be aimed at (a
    reference run, with nothing to aim, runs at full speed: its final state is the same);
    ``memory``: the memory tier's interval and directory (None: storage only)."""
    env = {
        "FINAL": str(final),
        "STEP_SLEEP": STEP_SLEEP if paced else "0",
        "TAIL_FROM": str(LAST_STEP),
        "TAIL_SLEEP": TAIL_SLEEP if paced else "0",
        "FAULT": schedule.trainer_faults(),
        "LOSS": "float",  # every step's loss is watched: a NaN is caught at its step
        "OMIT_STEPS": omit,
        **WORKLOAD,
    }
    if schedule.aims_at_saves:  # a kill aimed at a snapshot needs none: see _wait_save
        env["BALLAST_MB"] = BALLAST_MB
    checkpoint = "every_steps = 10"
    if memory is not None:
        every, shm = memory
        every = f'"{every}"' if every == "auto" else every
        checkpoint += f'\nmemory_every_steps = {every}\nmemory_dir = "{shm}"'
    return write_job(
        workdir,
        script=LIGHTNING if WORKLOAD.get("SHAPE") == "lightning" else TRAINER,
        name="chaos",
        total=TOTAL_STEPS,
        env=env,
        checkpoint=checkpoint,
        heartbeat=f'interval = "0.2s"\nstartup_timeout = "60s"\nhang_timeout = "{HANG_TIMEOUT}"',
        restart=(
            f'max_restarts = {schedule.max_restarts}\nbackoff = "0.1s"\nbackoff_max = "0.5s"\n'
            "max_no_progress = 99"
        ),
        checkpoint_dir=ckpt,
        anomaly=f"skip_steps = {SKIP_STEPS}\nmax_rollbacks = {schedule.max_rollbacks}",
    )


@contextlib.contextmanager
def guarded_run(seen: Observed) -> Iterator[None]:
    """Whatever of ours the block (a run) leaves alive is killed and listed in
    ``seen.leftovers`` ("PID COMMAND LINE"), however it was started."""
    before = set(guard().processes(exempt=False))
    try:
        yield
    finally:
        left = guard().check(before, grace_s=LEFTOVER_GRACE_S)
        seen.leftovers = [f"{pid} {cmd}" for pid, cmd in sorted(left.items())]


def _invocations(
    schedule: Schedule,
    job: Path,
    dirs: tuple[Path, Path | None],
    seen: Observed,
    *,
    deadline: float,
) -> None:
    """Every ``rvsup start`` of the run; ``dirs``: the checkpoint directory and the memory
    tier's ``memory_dir`` (None: the tier off)."""
    ckpt, shm = dirs
    outside = [f for f in schedule.faults if f.kind in _FROM_OUTSIDE]
    env = rvsup_env()
    while True:
        proc = subprocess.Popen(
            [sys.executable, "-m", "supervisor", "start", str(job)],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            ended_by_us = False
            while outside and not ended_by_us:
                fault = outside.pop(0)
                ended_by_us = _strike(fault, proc, job, dirs, seen, deadline)
            _, err = proc.communicate(timeout=max(1.0, deadline - time.monotonic()))
            seen.exit_codes.append(proc.returncode)
            if proc.returncode not in (0, 3, 75, -signal.SIGKILL):
                seen.errors.append(f"rvsup exited {proc.returncode}: {err[-1500:]}")
        finally:
            kill_tree(proc.pid)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.communicate(timeout=10)
        if not ended_by_us:
            return
        for damage in schedule.in_attempt(fault.attempt):
            if damage.kind in ("corrupt", "truncate"):
                damaged = _damage(ckpt, damage.kind)
                if damaged is not None:
                    seen.damaged[damage.attempt] = damaged
            elif damage.kind == "shmcorrupt" and shm is not None:
                snapshots = next((d for d in shm.iterdir() if d.is_dir()), None)
                damaged = None if snapshots is None else _damage(snapshots, "corrupt")
                if damaged is not None:
                    seen.snapshot_damaged[damage.attempt] = damaged


def _strike(
    fault: Fault,
    proc: subprocess.Popen[str],
    job: Path,
    dirs: tuple[Path, Path | None],
    seen: Observed,
    deadline: float,
) -> bool:
    """Wait for ``fault``'s attempt and step, then strike; True when rvsup itself was stopped."""
    if fault.kind in ("savekill", "snapkill"):
        saving = _save_seen(fault, proc, dirs, deadline)
        st = None if saving is None else status(job)
        if saving is None or st is None or st["attempt"] != fault.attempt:
            seen.errors.append(f"{fault.text()}: no save to aim at{_tier_said(job, fault)}")
            return False
        victim = next((r["pid"] for r in st["ranks"] if r["rank"] == fault.rank), None)
        if victim is None:
            seen.errors.append(f"{fault.text()}: rank {fault.rank} is not running")
            return False
        with contextlib.suppress(ProcessLookupError):
            os.kill(victim, signal.SIGKILL)
        seen.save_killed[fault.attempt] = saving
        return False
    st = _wait_step(job, proc, fault, deadline)
    if st is None:
        seen.errors.append(f"{fault.text()}: rvsup ended before the fault's step")
        return False
    if fault.kind == "writerkill":
        seen.writers_killed[fault.attempt] = _kill_writers([r["pid"] for r in st["ranks"]])
        return False
    if fault.kind == "zygotekill":
        zygotes = [z for z in psutil.Process(proc.pid).children(recursive=True) if _is_zygote(z)]
        if not zygotes:
            seen.errors.append(f"{fault.text()}: no zygote to kill")
            return False
        for zygote in zygotes:
            with contextlib.suppress(psutil.Error):
                zygote.kill()
        seen.save_killed[fault.attempt] = min(r["last_step"] for r in st["ranks"])
        return False
    sig = {"term": signal.SIGTERM, "usr1": signal.SIGUSR1, "daemonkill": signal.SIGKILL}
    tree = psutil.Process(proc.pid).children(recursive=True)
    os.kill(proc.pid, sig[fault.kind])
    proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    if fault.kind == "daemonkill":
        _, alive = psutil.wait_procs(tree, timeout=30)
        if alive:
            seen.errors.append(f"survived the killed daemon: {[p.pid for p in alive]}")
    return True


def _save_seen(
    fault: Fault, proc: subprocess.Popen[str], dirs: tuple[Path, Path | None], deadline: float
) -> int | None:
    """The step of the save of ``fault``'s attempt, at its step or later, seen being written:
    a checkpoint (savekill) or a snapshot (snapkill); None when rvsup ended first. The saves
    are watched from the attempt's start, not from when `rvsup status` says the step was
    reached: under load its answer can come late, after the last save of the run."""
    ckpt, shm = dirs
    if fault.kind == "savekill":
        return _wait_save(ckpt, proc, deadline, fault)
    if shm is None:
        return None
    return _wait_save(shm, proc, deadline, fault, "*/")  # the job's own folder in memory_dir


def _tier_said(job: Path, fault: Fault) -> str:
    """What the memory tier said in ``fault``'s attempt (why it went off or paused, its
    summary): why no snapshot was seen, in the error."""
    said = [
        {k: v for k, v in e.items() if k not in ("job", "level", "timestamp")}
        for e in events(job.parent / "run")
        if e.get("attempt") == fault.attempt and e["event"].startswith(("memory", "snapshot"))
    ]
    return f" (the tier said: {said[-6:]})" if said else " (the tier said nothing)"


def _wait_step(
    job: Path, proc: subprocess.Popen[str], fault: Fault, deadline: float
) -> dict[str, Any] | None:
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            return None
        st = status(job)
        ranks = st["ranks"] if st else []
        if (
            st
            and st["attempt"] == fault.attempt
            and len(ranks) == 2
            and min(r["last_step"] for r in ranks) >= fault.step
        ):
            return st
        time.sleep(0.05)
    raise TimeoutError(f"waiting for step {fault.step} of attempt {fault.attempt}")


def _wait_save(
    ckpt: Path, proc: subprocess.Popen[str], deadline: float, fault: Fault, below: str = ""
) -> int | None:
    """The step of the first checkpoint of ``fault``'s attempt seen being written at its step
    or later (not an old checkpoint that a prune renamed aside to remove it); ``below``: a glob
    of the folder in ``ckpt`` it is written in ("*/": the snapshots' directory in
    ``memory_dir``); the folders are waited for (rvsup makes them when it starts).

    Its temporary directory is seen when it is made (inotify, through watchdog), not by
    polling: a snapshot of the chaos job is written in milliseconds, so a poll could miss every
    one of a run ("no save to aim at"). A kill aimed at one may still land just after it was
    committed, a kill of a rank like any other."""
    folders: list[Path] = []
    while not folders and proc.poll() is None and time.monotonic() < deadline:
        folders = [p for p in (ckpt.glob(below) if below else [ckpt]) if p.is_dir()]
        if not folders:
            time.sleep(0.02)
    found: queue.SimpleQueue[int] = queue.SimpleQueue()
    handler = _TempMade(found, fault.step, f"a{fault.attempt}")
    observer = Observer()
    for folder in folders:
        observer.schedule(handler, str(folder), recursive=False)
    observer.start()
    try:
        for tmp in ckpt.glob(f"{below}.tmp-step-*"):  # one made before the watch began
            handler.seen(tmp.name)
        while time.monotonic() < deadline and proc.poll() is None:
            with contextlib.suppress(queue.Empty):
                return found.get(timeout=0.05)
        return None
    finally:
        observer.stop()
        observer.join()


class _TempMade(FileSystemEventHandler):
    """Puts the step of each checkpoint's temporary directory made at ``from_step`` or later
    by the attempt tagged ``tag``."""

    def __init__(self, found: queue.SimpleQueue[int], from_step: int, tag: str) -> None:
        self.found, self.from_step, self.tag = found, from_step, tag

    def on_created(self, event: FileSystemEvent) -> None:
        self.seen(os.path.basename(os.fsdecode(event.src_path)))

    def on_moved(self, event: FileSystemEvent) -> None:  # made under another name, renamed
        self.seen(os.path.basename(os.fsdecode(event.dest_path)))

    def seen(self, name: str) -> None:
        m = layout.TEMP_RE.match(name)
        if m and m.group(2) == self.tag and int(m.group(1)) >= self.from_step:
            self.found.put(int(m.group(1)))


def _is_zygote(process: psutil.Process) -> bool:
    """Whether ``process`` is a node's zygote (``worker_sdk/spawn/zygote.py``; the ranks it
    forks show their own command lines)."""
    try:
        return _ZYGOTE in " ".join(process.cmdline())
    except psutil.Error:
        return False


def _kill_writers(ranks: Sequence[int]) -> int:
    """SIGKILL the snapshot writers forked beside the ranks ``ranks`` (their children named
    so, ``worker_sdk/spawn/zygote_child.py``); how many were killed."""
    killed = 0
    for pid in ranks:
        with contextlib.suppress(psutil.Error):
            for child in psutil.Process(pid).children():
                if _FORKED_WRITER in " ".join(child.cmdline()):
                    child.kill()
                    killed += 1
    return killed


def _damage(ckpt: Path, kind: str) -> str | None:
    """Flip bytes in the middle of (or truncate) the largest file of the newest checkpoint; None
    when no checkpoint was committed yet (a fault struck before the first save)."""
    committed = list(ckpt.glob("step-*"))
    if not committed:
        return None
    newest = max(committed, key=lambda p: int(p.name.split("-")[1]))
    victim = max((p for p in newest.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    data = bytearray(victim.read_bytes())
    if kind == "truncate":
        victim.write_bytes(data[: len(data) // 2])
    else:
        middle = len(data) // 2
        data[middle : middle + 16] = bytes(b ^ 0xFF for b in data[middle : middle + 16])
        victim.write_bytes(data)
    return str(newest)


@contextlib.contextmanager
def _checkpoint_dir(workdir: Path, *, tmpfs: bool) -> Any:
    path = workdir / "ckpt"
    path.mkdir()
    with _mounted(path, TMPFS_SIZE) if tmpfs else contextlib.nullcontext():
        yield path


@contextlib.contextmanager
def _mounted(path: Path, size: str) -> Iterator[None]:
    """A tmpfs of ``size`` mounted on ``path`` for the block (root)."""
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(path)]
    subprocess.run(mount, check=True, capture_output=True)
    try:
        yield
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


@contextlib.contextmanager
def _memory_dir(wanted: bool, seen: Observed, *, tmpfs: bool = False) -> Iterator[Path | None]:
    """A fresh directory in ``/dev/shm`` for the memory tier (``tmpfs``: a small tmpfs of its
    own, that a ``shmfull`` fault fills), or None; what the job left in it goes to
    ``seen.memory_left`` (rvsup removes its snapshots when the job ends; the trainer's
    ``filler`` is not rvsup's)."""
    if not wanted:
        yield None
        return
    path = Path(tempfile.mkdtemp(prefix="rvsup-chaos-", dir="/dev/shm"))
    try:
        with _mounted(path, SHM_TMPFS_SIZE) if tmpfs else contextlib.nullcontext():
            try:
                yield path
            finally:
                left = (p for p in path.iterdir() if p.name != "filler")
                seen.memory_left = sorted(str(p.relative_to(path)) for p in left)
    finally:
        shutil.rmtree(path, ignore_errors=True)
