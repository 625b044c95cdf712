"""The job's snapshot directory on the daemon's node (supervisor/ranks/snapshot_home.py): made
private under a name nobody predicts, recorded, taken back by the job's next daemon only while
it is still private, and swept once the daemon that made it is dead."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from supervisor.ranks import snapshot_home
from supervisor.record.schema import MemoryDirRefused, SnapshotsSwept

_OTHER_UID = 54321


def _base(tmp_path: Path) -> Path:
    base = tmp_path / "shm"
    base.mkdir()
    base.chmod(0o1777)  # a tmpfs every user writes, as /dev/shm
    return base


def _run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir(mode=0o700)
    return run_dir


@pytest.fixture(name="second_run_dir")
def _second_run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "r2"
    path.mkdir(mode=0o700)
    return path


def test_a_fresh_directory_is_private_unpredictable_and_recorded(
    tmp_path: Path, second_run_dir: Path
) -> None:
    """The directory is made 0700 with 128 random bits in its name, its owner file is locked,
    and the run directory records it (0600)."""
    base, run_dir = _base(tmp_path), _run_dir(tmp_path)
    home, said = snapshot_home.claim(base, run_dir)
    other, _ = snapshot_home.claim(base, second_run_dir)
    try:
        assert said == []
        st = home.path.lstat()
        assert stat.S_ISDIR(st.st_mode) and stat.S_IMODE(st.st_mode) == 0o700
        assert home.path.parent == base
        assert len(home.path.name.rsplit("-", 1)[1]) == 32
        assert home.path != other.path
        assert snapshot_home.recorded(run_dir) == home.path
        assert stat.S_IMODE((run_dir / snapshot_home.RECORD_FILE).stat().st_mode) == 0o600
        assert stat.S_IMODE((home.path / snapshot_home.OWNER_FILE).stat().st_mode) == 0o600
    finally:
        home.close(remove=True)
        other.close(remove=True)
    assert not home.path.exists()


def test_the_next_daemon_of_the_job_takes_its_directory_back(tmp_path: Path) -> None:
    """A daemon that ended without removing the directory (killed): the next one of the same
    job takes it back, with what is in it."""
    base, run_dir = _base(tmp_path), _run_dir(tmp_path)
    first, _ = snapshot_home.claim(base, run_dir)
    (first.path / "kept").write_text("a snapshot")
    first.close(remove=False)
    again, said = snapshot_home.claim(base, run_dir)
    try:
        assert said == []
        assert again.path == first.path
        assert (again.path / "kept").read_text() == "a snapshot"
    finally:
        again.close(remove=True)


@pytest.mark.parametrize("attack", ["world-writable", "another user's", "a symbolic link"])
def test_a_recorded_directory_that_is_no_longer_private_is_refused(
    tmp_path: Path, attack: str
) -> None:
    """The recorded directory replaced (0777, another user's, a link to one): never used, an
    event names it and says why, and a fresh private directory is made."""
    if attack == "another user's" and os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    base, run_dir = _base(tmp_path), _run_dir(tmp_path)
    first, _ = snapshot_home.claim(base, run_dir)
    first.close(remove=True)
    planted = first.path
    if attack == "a symbolic link":
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir(mode=0o700)
        planted.symlink_to(elsewhere)
    else:
        planted.mkdir()
        planted.chmod(0o777)
        (planted / snapshot_home.OWNER_FILE).write_text("{}")
        if attack == "another user's":
            planted.chmod(0o700)
            os.chown(planted, _OTHER_UID, _OTHER_UID)
    home, said = snapshot_home.claim(base, run_dir)
    try:
        assert home.path != planted
        [refused] = said
        assert isinstance(refused, MemoryDirRefused)
        assert refused.path == str(planted)
        expected = {
            "world-writable": "mode 0777",
            "another user's": f"owned by uid {_OTHER_UID}",
            "a symbolic link": "symbolic link",
        }[attack]
        assert expected in refused.reason
        assert snapshot_home.recorded(run_dir) == home.path
    finally:
        home.close(remove=True)


_CLAIM_AND_WAIT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from supervisor.ranks import snapshot_home
    home, _ = snapshot_home.claim(Path(sys.argv[1]), Path(sys.argv[2]))
    print(home.path, flush=True)
    time.sleep(600)
    """
)


def _line(daemon: subprocess.Popen[str]) -> str:
    assert daemon.stdout is not None
    return daemon.stdout.readline().strip()


@pytest.mark.process
def test_a_dead_daemons_directory_is_swept_and_a_live_ones_kept(tmp_path: Path) -> None:
    """Two daemons claim directories; one is killed with SIGKILL. A start sweeps the dead one's
    directory (an event names it), keeps the live one's and its own, finishes a sweep that was
    cut short, and never touches what has no owner file (not this daemon's kind)."""
    base = _base(tmp_path)
    daemons = []
    for name in ("dead", "alive"):
        run_dir = tmp_path / name
        run_dir.mkdir(mode=0o700)
        daemons.append(
            subprocess.Popen(
                [sys.executable, "-c", _CLAIM_AND_WAIT, str(base), str(run_dir)],
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    try:
        dead_dir, alive_dir = (Path(_line(d)) for d in daemons)
        daemons[0].send_signal(signal.SIGKILL)
        daemons[0].wait()
        stranger = base / f"rvsup-{os.getuid()}-{'0' * 32}"  # no owner file: an earlier rvsup's
        stranger.mkdir(mode=0o700)
        cut_short = base / f".rvsup-{os.getuid()}-{'2' * 32}.removing"  # a sweep killed midway
        cut_short.mkdir(mode=0o700)
        own, _ = snapshot_home.claim(base, _run_dir(tmp_path))
        try:
            said = snapshot_home.sweep(base, keep=own.path)
            assert said == [SnapshotsSwept(paths=(str(dead_dir),))]
            assert not dead_dir.exists()
            assert alive_dir.is_dir() and own.path.is_dir() and stranger.is_dir()
            assert not cut_short.exists()
            assert snapshot_home.sweep(base, keep=own.path) == []
        finally:
            own.close(remove=True)
    finally:
        for daemon in daemons:
            daemon.kill()
            daemon.wait()
            if daemon.stdout is not None:
                daemon.stdout.close()


def test_no_directory_can_be_made_in_a_missing_base(tmp_path: Path) -> None:
    """A memory_dir that vanished: OSError, nothing recorded."""
    run_dir = _run_dir(tmp_path)
    with pytest.raises(OSError, match="No such file"):
        snapshot_home.claim(tmp_path / "gone", run_dir)
    assert snapshot_home.recorded(run_dir) is None
