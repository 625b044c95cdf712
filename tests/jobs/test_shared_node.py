"""A job of one user on a node it shares with another, who attacks it for real (docs/security.md):
the attacker is a user made for the test, its code run with its own uid (tests/helpers/
other_user.py; root only, skipped elsewhere). The job (the test's user) ends as an uninterrupted
run would, and nothing of the attacker's is run, loaded or trusted:

- a snapshot directory planted where the job's was (0777, a complete snapshot of its own,
  booby-trapped pickled markers, kept re-planted while the job runs) is refused, named in the
  history, never read, and the job resumes from its own storage checkpoint;
- a checkpoint directory another user can replace is refused by ``rvsup start``, naming the
  ancestor; one replaced after the start is never loaded from nor written into;
- thousands of connections to the rank channel and the metrics port leave the job training and
  ``rvsup status`` answering; the other user's own ``rvsup status`` gets one line, exit 2.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import pickle
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor import cli
from supervisor.config.load import load_config
from supervisor.ranks import snapshot_home
from supervisor.record.schema import SnapshotsSwept
from tests.helpers.checkpoint_dirs import make_checkpoint
from tests.helpers.harness import (
    events,
    kill_tree,
    named,
    reaped,
    running,
    rvsup,
    rvsup_env,
    status,
    wait_for,
    wait_progress,
    write_job,
)
from tests.helpers.jobs import snapshot_dir
from tests.helpers.other_user import Stopping, User, another_user, run_as, shared_base, start_as
from tests.helpers.states import assert_same_state, load_final
from worker_sdk.contract import layout

pytestmark = pytest.mark.process


@pytest.fixture
def attacker() -> Any:
    with another_user("atk") as user:
        yield user


@pytest.fixture
def base() -> Any:
    with shared_base() as path:
        yield path


class _Payload:
    """Unpickling this creates the file it names: proof that someone unpickled it."""

    def __init__(self, flag: str) -> None:
        self.flag = flag

    def __reduce__(self) -> tuple[Any, tuple[str, str]]:
        return (open, (self.flag, "w"))


def _plant(directory: str, flag: str) -> list[str]:
    """The attacker (its own uid): at ``directory``, a folder every user may write holding a
    complete snapshot of step 50, and a snapshot in the making whose markers are pickles that
    run code when unpickled."""
    folder = Path(directory)
    folder.mkdir()
    folder.chmod(0o777)
    make_checkpoint(folder, 50)
    making = folder / layout.temp_name(51, "a2")
    making.mkdir()
    for rank in (0, 1):
        (making / f".written-{rank}").write_bytes(pickle.dumps(_Payload(flag)))
    (folder / snapshot_home.OWNER_FILE).write_text('{"host": "elsewhere"}')
    return sorted(os.listdir(folder))


def _replant(shm: str, flag: str) -> dict[str, int]:
    """The attacker, until stopped: pickled markers into every snapshot directory it finds,
    and a new one under every name it can think of. Counts what it got into another user's."""
    me, tries, inside = os.getuid(), 0, 0
    while not Stopping.requested:
        with contextlib.suppress(OSError):
            for entry in os.scandir(shm):
                if not entry.name.startswith("rvsup-"):
                    continue
                tries += 1
                try:
                    making = Path(entry.path) / layout.temp_name(99, "a2")
                    making.mkdir(exist_ok=True)
                    (making / ".written-1").write_bytes(pickle.dumps(_Payload(flag)))
                except OSError:
                    continue
                if entry.stat().st_uid != me:
                    inside += 1
        time.sleep(0.02)
    return {"tries": tries, "inside_others": inside}


@pytest.mark.kills_daemon
def test_a_planted_snapshot_directory_is_refused_and_never_read(
    base: Path, attacker: User, reference_final: Path
) -> None:
    """The job's daemon is killed (its snapshot directory stays), a later start of another job
    sweeps that directory, and the attacker plants its own at the recorded name. The next start
    of the job refuses it (memory_dir_refused names it), resumes from storage, not from the
    planted step 50, runs no pickled payload although the attacker keeps planting markers into
    every snapshot directory it sees, and ends bit-identical to an uninterrupted run."""
    shm = base / "shm"
    shm.mkdir()
    shm.chmod(0o1777)  # as /dev/shm
    job_dir = base / "job"
    job_dir.mkdir(mode=0o755)
    final, flag = job_dir / "final.pt", str(base / "payload-ran")
    job = write_job(
        job_dir,
        env={"FINAL": str(final), "STEP_SLEEP": "0.1"},
        checkpoint=f'every_steps = 10\nmemory_every_steps = 1\nmemory_dir = "{shm}"',
    )
    ckpt = job_dir / "ckpt"

    def snapshot_and_storage() -> bool:
        found = snapshot_dir(job)
        newest = layout.latest(found) if found is not None else None
        stored = layout.latest(ckpt)
        return newest is not None and newest.step >= 12 and stored is not None

    with running(job) as proc:
        wait_for(snapshot_and_storage, timeout=240, what="a snapshot and a checkpoint")
        kill_tree(proc.pid)
    planted = snapshot_dir(job)
    assert planted is not None and planted.is_dir()
    swept = snapshot_home.sweep(shm, keep=None)  # what any other start of the user's does
    assert swept == [SnapshotsSwept(paths=(str(planted),))]
    planted_names = run_as(attacker, _plant, str(planted), flag)
    with start_as(attacker, _replant, str(shm), flag) as planter:
        res = rvsup("start", str(job), timeout=240)
        report = planter.stop()
    assert res.returncode == 0, res.stderr[-3000:]
    evs = events(job_dir / "run")
    (refused,) = named(evs, "memory_dir_refused")
    assert refused["path"] == str(planted)
    assert f"owned by uid {attacker.uid}" in refused["reason"], refused
    resumed = named(evs, "attempt_started")[-1]
    assert resumed["source"] == "storage", resumed
    assert resumed["checkpoint"].startswith(str(ckpt)), resumed
    assert not any(str(planted) in str(e.get("checkpoint")) for e in named(evs, "attempt_started"))
    assert not os.path.exists(flag), "a planted pickle was unpickled"
    assert report["tries"] > 0 and report["inside_others"] == 0, report
    assert snapshot_dir(job) != planted
    assert set(planted_names) <= set(os.listdir(planted))  # never swept: not the job's
    assert os.stat(planted).st_uid == attacker.uid
    assert_same_state(load_final(reference_final), load_final(final))


def _make_folder(path: str, mode: int) -> None:
    Path(path).mkdir()
    Path(path).chmod(mode)


@pytest.mark.parametrize(
    ("shape", "expected"),
    [
        ("the attacker's folder in a sticky one", "is owned by uid {uid}, in the shared directory"),
        ("root's folder, open to all, not sticky", "is writable by others (mode 0777)"),
        ("root's folder, written by the attacker's group", "is writable by its group (mode 0775)"),
    ],
)
def test_a_checkpoint_dir_another_user_can_replace_is_refused_at_the_start(
    base: Path, attacker: User, shape: str, expected: str
) -> None:
    """checkpoint_dir under a folder in which the other user can rename what it holds:
    ``rvsup start`` exits 2 before anything runs, naming that folder and why."""
    job_dir = base / "job"
    job_dir.mkdir(mode=0o755)
    if shape == "the attacker's folder in a sticky one":
        sticky = base / "tmp"
        _make_folder(str(sticky), 0o1777)
        shared = sticky / "theirs"
        run_as(attacker, _make_folder, str(shared), 0o777)
    else:
        shared = base / "project"
        _make_folder(str(shared), 0o777 if "open to all" in shape else 0o775)
        if "group" in shape:
            os.chown(shared, 0, attacker.gid)
    job = write_job(job_dir, checkpoint_dir=str(shared / "ckpt"))
    res = rvsup("start", str(job), timeout=60)
    assert res.returncode == 2, res.stderr
    [line] = [x for x in res.stderr.splitlines() if x.startswith("rvsup: job.checkpoint_dir")]
    assert f"{shared} {expected.format(uid=attacker.uid)}" in line, line
    assert not (shared / "ckpt").exists()


def _swap(parent: str) -> list[str]:
    """The attacker: the job's checkpoint directory renamed away, its own in its place with a
    planted checkpoint of step 50."""
    ckpt = Path(parent) / "ckpt"
    ckpt.rename(Path(parent) / "ckpt-moved")
    ckpt.mkdir(mode=0o755)
    (ckpt / layout.MARKER).write_text("")
    make_checkpoint(ckpt, 50)
    return sorted(os.listdir(ckpt))


def test_a_checkpoint_dir_replaced_after_the_start_is_never_loaded_nor_written(
    base: Path, attacker: User
) -> None:
    """The checkpoint directory's parent was safe at the start; then it is opened to all (an
    administrator's mistake), the attacker puts its own directory in place of the job's, and
    the parent is closed again. The ranks refuse to save into it (checkpoint_failed), and once a
    rank dies the job gives up rather than resume from it: exit 3, the reason in the history,
    nothing of the job's in the attacker's directory."""
    job_dir = base / "job"
    job_dir.mkdir(mode=0o755)
    parent = job_dir / "store"
    parent.mkdir(mode=0o755)
    job = write_job(job_dir, env={"STEP_SLEEP": "0.1"}, checkpoint_dir="store/ckpt", total=400)
    with running(job) as proc:
        wait_for(lambda: layout.latest(parent / "ckpt"), timeout=120, what="a checkpoint")
        parent.chmod(0o777)
        planted = run_as(attacker, _swap, str(parent))
        parent.chmod(0o755)

        def refused_save() -> list[dict[str, Any]]:
            return named(events(job_dir / "run"), "checkpoint_failed")

        (failed, *_) = wait_for(refused_save, timeout=60, what="a save refused")
        assert "nothing is saved into" in failed["reason"], failed
        st = status(job)
        assert st is not None
        os.kill(next(r["pid"] for r in st["ranks"] if r["rank"] == 1), 9)
        out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3, out
    evs = events(job_dir / "run")
    (gave_up,) = named(evs, "job_gave_up")
    assert gave_up["reason"].startswith("checkpoint_dir is not safe any more"), gave_up
    assert f"owned by uid {attacker.uid}" in gave_up["reason"], gave_up
    assert len(named(evs, "attempt_started")) == 1  # no attempt resumed from the planted step
    assert sorted(os.listdir(parent / "ckpt")) == planted


_REOPEN_PER_ROUND = 200  # the attacker's own CPU: it shares the two cores with the job


def _flood(targets: list[tuple[int, str]], per_port: int) -> dict[str, int]:
    """The attacker, until stopped: ``per_port`` connections to each ``(port, what)``, each
    sending ``what`` (nothing: an idle connection, held by the listener until its handshake
    times out; half a request) and held open; a connection the server closes is opened again."""
    opened = reopened = 0
    held: list[tuple[int, str, socket.socket]] = []

    def connect(port: int, what: str) -> None:
        nonlocal opened
        with contextlib.suppress(OSError):
            s = socket.create_connection(("127.0.0.1", port), timeout=2)
            s.setblocking(False)
            if what:
                with contextlib.suppress(OSError):
                    s.send(what.encode())
            held.append((port, what, s))
            opened += 1

    for port, what in targets:
        for _ in range(per_port):
            connect(port, what)
    while not Stopping.requested:
        again = 0
        for item in list(held):
            if again >= _REOPEN_PER_ROUND:
                break
            port, what, s = item
            try:
                closed = s.recv(4096) == b""
            except BlockingIOError:
                closed = False
            except OSError:
                closed = True
            if closed:
                held.remove(item)
                s.close()
                connect(port, what)
                reopened += 1
                again += 1
        time.sleep(0.2)
    for _, _, s in held:
        s.close()
    return {"opened": opened, "reopened": reopened}


def _status_of(job: str) -> dict[str, Any]:
    """The attacker's own ``rvsup status`` of the job: its exit status and what it printed."""
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = cli.main(["status", job])
    return {"code": code, "stderr": err.getvalue()}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
    return port


def test_thousands_of_connections_leave_the_job_training(
    base: Path, attacker: User, reference_final: Path
) -> None:
    """A job on the TCP rank channel with its metrics served, its daemon started with a soft
    limit of 1024 descriptors: the attacker holds 2,000 connections to the channel and 2,000 to
    the metrics port, opening again every one the daemon closes. The daemon raised its limit to
    the hard one, the ranks go on training, ``rvsup status`` answers, and the job ends
    bit-identical; the attacker's own ``rvsup status`` is one line, exit 2."""
    job_dir = base / "job"
    job_dir.mkdir(mode=0o755)
    final, port = job_dir / "final.pt", _free_port()
    slow = job_dir / "slow"
    slow.touch()
    job = write_job(
        job_dir,
        # 1 s a step while the attacker connects: the 60 steps must outlast its 4,000
        # connections on a loaded machine (at 0.2 s a step it once reached step 56 first)
        env={"FINAL": str(final), "STEP_SLEEP": "1", "SLOW_WHILE": str(slow)},
        heartbeat='interval = "0.2s"\nstartup_timeout = "60s"\ntransport = "tcp"',
    )
    with job.open("a") as f:
        f.write(f'\n[metrics]\nlisten = "127.0.0.1:{port}"\n')
    limited = ["prlimit", "--nofile=1024:", "--", sys.executable, "-m", "supervisor"]
    proc = subprocess.Popen(
        [*limited, "start", str(job)],
        env=rvsup_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    with reaped(proc):
        wait_progress(job, min_step=2, timeout=120)
        soft, hard = _nofile(proc.pid)
        assert soft == hard > 1024, (soft, hard)
        targets = [(_channel(job), ""), (port, "GET /metrics HTTP/1.1\r\nHost: x\r\n")]
        with start_as(attacker, _flood, targets, 2000) as flood:

            def opened() -> bool:  # the attacker made its connections (and holds them)
                attacker_proc = psutil.Process(flood.pid)
                if attacker_proc.status() == psutil.STATUS_ZOMBIE:
                    raise AssertionError(f"the attacker ended: {flood.stop()}")
                return attacker_proc.num_fds() >= 2000

            wait_for(opened, timeout=180, what="the attacker's connections")
            before = min(r["last_step"] for r in wait_progress(job, min_step=3)["ranks"])
            assert before + 5 < 60, f"step {before} before the attacker was ready"
            later = wait_progress(job, min_step=before + 5, timeout=120)
            assert later["state"] == "running", later
            other = run_as(attacker, _status_of, str(job))
            made = flood.stop()
        assert made["opened"] >= 4000, made
        assert other["code"] == 2, other
        [line] = other["stderr"].splitlines()
        assert "belongs to another user" in line, line
        slow.unlink()
        out, _ = proc.communicate(timeout=180)
    assert proc.returncode == 0, out[-3000:]
    assert_same_state(load_final(reference_final), load_final(final))


def _nofile(pid: int) -> tuple[int, int]:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            soft, hard = line.split()[3:5]
            return int(soft), int(hard)
    raise AssertionError("no limit of open files")


def _channel(job: Path) -> int:
    info = json.loads((load_config(job).job.run_dir / "daemon.json").read_text())
    return int(str(info["endpoint"]).rsplit(":", 1)[1])
