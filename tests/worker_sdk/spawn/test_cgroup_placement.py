"""The one rule of containment, on real processes: the process that starts another places it in
its group before it runs anything, and the started one only checks that it is there."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from supervisor.process.cgroup import JobGroups
from supervisor.process.launcher import bootstrap
from supervisor.process.zygote import Zygote
from worker_sdk.spawn import cgroup

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[3]
# the command: where it runs, written to the file it is given
WHERE = "import sys; from worker_sdk.spawn import cgroup; print(cgroup.own_group_dir(), end='')"
MARK = "open(__import__('sys').argv[1], 'w').write('ran')"


@pytest.fixture
def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


def _group(job_groups: JobGroups, number: int) -> str:
    path = job_groups.attempt(number)
    os.makedirs(path)
    return path


def _waiting_on_a_pipe(pid: int) -> None:
    """Until process ``pid`` blocks reading a pipe (its wait channel says so)."""
    deadline = time.monotonic() + 60
    while not Path(f"/proc/{pid}/wchan").read_text().endswith("pipe_read"):
        assert time.monotonic() < deadline, "the bootstrap never waited on its pipe"
        time.sleep(0.01)


def test_the_bootstrap_runs_nothing_before_it_is_placed(
    job_groups: JobGroups, tmp_path: Path, env: dict[str, str]
) -> None:
    """``bootstrap --cgroup DIR FD CMD`` waits, before it runs anything, until the process that
    started it has placed it in DIR and closed the pipe: while it waits the command has not
    run; once placed, the command runs there."""
    group, mark = _group(job_groups, 1), tmp_path / "ran"
    held, release = os.pipe()
    argv = [sys.executable, "-m", "worker_sdk.spawn.bootstrap", "--cgroup", group, str(held)]
    proc = subprocess.Popen(
        [*argv, sys.executable, "-c", f"{MARK}; {WHERE}", str(mark)],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
        pass_fds=(held,),
    )
    os.close(held)
    try:
        _waiting_on_a_pipe(proc.pid)
        assert not mark.exists()
        assert cgroup.own_group_dir(proc.pid) != group
        cgroup.place(proc.pid, group)
    finally:
        os.close(release)
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert out == group and mark.exists()


def _run(argv: list[str], env: dict[str, str], cwd: Path, group: str) -> tuple[int, str]:
    """``argv`` started through the bootstrap as the daemon starts a launcher, placed in
    ``group``: its exit status and output."""
    proc = bootstrap(
        argv, env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, cgroup=group
    )
    out, _ = proc.communicate(timeout=60)
    return proc.returncode, out.decode()


def test_the_supervisor_places_what_it_starts(
    job_groups: JobGroups, tmp_path: Path, env: dict[str, str]
) -> None:
    """A launcher started as the daemon starts one runs in the group it was given."""
    group = _group(job_groups, 2)
    assert _run([sys.executable, "-c", WHERE], env, tmp_path, group) == (0, group)


def test_a_process_that_could_not_be_placed_runs_nothing_and_says_where_it_is(
    tmp_path: Path, env: dict[str, str], capfd: pytest.CaptureFixture[str]
) -> None:
    """Given a directory that is no cgroup, the supervisor cannot place the launcher (it says
    so); the launcher does not run its command, says where it is instead, and exits 126."""
    mark = tmp_path / "ran"
    proc = bootstrap(
        [sys.executable, "-c", MARK, str(mark)],
        env=env,
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        cgroup=str(tmp_path),
    )
    assert proc.wait(timeout=60) == 126
    assert not mark.exists()
    err = capfd.readouterr().err
    assert f"cannot place process {proc.pid} in {tmp_path}" in err, err
    assert f"not in {tmp_path}, where it was to be placed" in err, err


@pytest.fixture
def zygote(job_groups: JobGroups, tmp_path: Path, env: dict[str, str]) -> Iterator[Zygote]:
    """A zygote placed in the job's ``zygote`` group, as the daemon starts one."""
    z = Zygote(sys.executable, ["json"], defaults=())
    z.ensure(env, tmp_path, nproc=1, cgroup=job_groups.zygote())
    try:
        yield z
    finally:
        z.close()


def test_a_forked_rank_is_placed_in_its_clients_group(
    zygote: Zygote, job_groups: JobGroups, tmp_path: Path, env: dict[str, str]
) -> None:
    """The zygote (in its own group) forks a rank for a client placed in an attempt's group:
    the rank runs in the client's group, not in the zygote's, and was forked, not started
    cold."""
    group = _group(job_groups, 3)
    script = tmp_path / "where.py"
    script.write_text(f"import os\n{WHERE}\nprint(' parent', os.getppid(), end='')\n")
    argv = ["--zygote", zygote.name, sys.executable, str(script)]
    assert _run(argv, env, tmp_path, group) == (0, f"{group} parent {zygote.pid}")
    assert cgroup.own_group_dir(zygote.pid if zygote.pid is not None else 0) != group


def test_a_rank_the_zygote_cannot_place_is_refused_with_the_reason() -> None:
    """The zygote's placement of a forked child into a directory that is no cgroup fails, and
    says why (the request is then refused: the client starts the rank cold, in its group)."""
    from worker_sdk.spawn import zygote

    assert zygote._place(os.getpid(), "") is None  # the zygote's own group: nothing to do
    why = zygote._place(os.getpid(), "/nonexistent-group")
    assert why is not None
    assert why.startswith("the rank cannot be placed in its client's cgroup /nonexistent-group")
