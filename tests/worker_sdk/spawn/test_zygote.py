"""The zygote and its clients on real processes (no torchrun): a forked rank is what a cold exec
would have started, its client mirrors it toward torchrun, and every way out is clean."""

from __future__ import annotations

import contextlib
import json
import os
import resource
import signal
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from supervisor.process.zygote import Zygote
from supervisor.record.schema import ColdStart
from tests.helpers.harness import reaped, wait_for
from tests.helpers.memory_cgroup import limited
from worker_sdk.spawn import zygote_wire as wire
from worker_sdk.spawn.zygote_client import request_of

pytestmark = [pytest.mark.process, pytest.mark.timeout(120)]

REPO = Path(__file__).resolve().parents[3]

PROBE = """\
import json, os, random, resource, sys
print(json.dumps({
    "argv": sys.argv, "path0": sys.path[0], "path": sys.path[1:], "cwd": os.getcwd(),
    "name": __name__, "file": __file__, "umask": os.umask(0),
    "nofile": resource.getrlimit(resource.RLIMIT_NOFILE), "affinity": sorted(os.sched_getaffinity(0)),
    "env": {k: v for k, v in os.environ.items() if k.startswith("PROBE_")},
    "stdin": sys.stdin.read(), "fds": [os.readlink(f"/proc/self/fd/{fd}") for fd in (0, 1, 2)],
    "stdout": [sys.stdout.line_buffering, sys.stdout.write_through, sys.stdout.encoding],
    "stderr": [sys.stderr.line_buffering, sys.stderr.write_through],
    "modules_main": sys.modules["__main__"].__dict__.get("__file__"),
    "sid_is_pid": os.getsid(0) == os.getpid(),
}))
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    """The environment of the zygote and of the ranks (rvsup's checkout importable)."""
    return dict(os.environ, PYTHONPATH=str(REPO), PROBE_A="1")


@pytest.fixture
def zygote(tmp_path: Path, env: dict[str, str]) -> Iterator[Zygote]:
    """A zygote that imports json only (fast), started as the supervisor starts one."""
    z = Zygote(sys.executable, ["json"], defaults=())
    z.ensure(env, tmp_path, nproc=1)
    try:
        yield z
    finally:
        z.close()


def client(
    zygote: Zygote | None,
    argv: list[str],
    env: dict[str, str],
    cwd: Path,
    **kwargs: object,
) -> subprocess.Popen[str]:
    """A rank's bootstrap, as torchrun starts it (with ``--zygote`` when given a zygote)."""
    via = ["--zygote", zygote.name] if zygote is not None else []
    return subprocess.Popen(  # type: ignore[call-overload,no-any-return]
        [sys.executable, "-m", "worker_sdk.spawn.bootstrap", *via, *argv],
        env=env,
        cwd=cwd,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **kwargs,
    )


def forked_rank(zygote: Zygote, script: str) -> psutil.Process:
    """The zygote's child that runs ``script`` (its command line says so, as a cold one's)."""
    assert zygote.pid is not None
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        for child in psutil.Process(zygote.pid).children():
            with contextlib.suppress(psutil.Error):
                if child.cmdline() == [sys.executable, script]:
                    return child
        time.sleep(0.02)
    raise AssertionError("no forked rank")


def wait_ready(zygote: Zygote) -> None:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if zygote.ready_s is not None:
            return
        zygote.cold_starts()
        time.sleep(0.02)
    raise AssertionError("the zygote never said it was ready")


def test_a_forked_rank_gets_what_a_cold_exec_gives(
    tmp_path: Path, env: dict[str, str], zygote: Zygote
) -> None:
    """argv, sys.path, cwd, __main__, umask, limits, affinity, env, stdio (the client's own fds,
    buffered alike) and a session of its own: a forked rank's probe prints exactly what a cold
    one prints, for a script and for ``-m``."""
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "probe.py").write_text(PROBE)
    (tmp_path / "work").mkdir()

    def limits() -> None:
        os.umask(0o027)
        resource.setrlimit(
            resource.RLIMIT_NOFILE, (512, resource.getrlimit(resource.RLIMIT_NOFILE)[1])
        )
        os.sched_setaffinity(0, {0})

    for argv, cwd in (
        ([sys.executable, "../pkg/probe.py", "--x", "1"], tmp_path / "work"),
        ([sys.executable, "-u", "-m", "pkg.probe", "y"], tmp_path),
    ):
        outs = []
        for z in (None, zygote):
            with reaped(
                client(z, argv, env, cwd, stdin=subprocess.PIPE, preexec_fn=limits)
            ) as proc:
                out, err = proc.communicate("the input", timeout=60)
                assert proc.returncode == 0, err
                assert "starts cold" not in err
                outs.append(json.loads(out))
        cold, forked = outs
        for seen in outs:  # the test reads the rank's stdout: it is the client's pipe
            assert [fd.split(":")[0] for fd in seen.pop("fds")] == ["pipe"] * 3
        assert forked == cold
        assert forked["umask"] == 0o027 and forked["nofile"][0] == 512 and forked["affinity"] == [0]
        assert forked["stdin"] == "the input"
    assert zygote.cold_starts() == []


def test_a_forked_rank_is_in_its_clients_memory_group(
    tmp_path: Path, env: dict[str, str], zygote: Zygote
) -> None:
    """A client in another cgroup v1 memory group than the zygote's (a node wrapper's): the
    forked rank is placed in the client's, where a cold one would be, so that the node's OOM
    kills are counted where its agent reads them."""
    with limited(1 << 40, "client") as group:
        if not (group / "memory.limit_in_bytes").exists():
            pytest.skip("no cgroup v1 memory controller here")
        (tmp_path / "m.py").write_text(
            "from worker_sdk.spawn.cgroup import own_memory_v1_dir; print(own_memory_v1_dir())\n"
        )

        def join() -> None:
            (group / "cgroup.procs").write_text(str(os.getpid()))

        argv = [sys.executable, "m.py"]
        with reaped(client(zygote, argv, env, tmp_path, preexec_fn=join)) as proc:
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert "starts cold" not in err
        assert out.strip() == str(group)
    assert zygote.cold_starts() == []


@pytest.mark.parametrize(
    ("script", "expected_rc"),
    [
        ("import sys; sys.exit(3)", 3),
        ("raise ValueError('boom')", 1),
        ("raise KeyboardInterrupt", -signal.SIGINT),
        ("import os, signal; os.kill(os.getpid(), signal.SIGSEGV)", -signal.SIGSEGV),
        ("import sys; sys.exit('bye')", 1),
    ],
    ids=["code", "exception", "keyboard-interrupt", "signal", "message"],
)
def test_the_client_ends_as_the_rank_ended(
    tmp_path: Path, env: dict[str, str], zygote: Zygote, script: str, expected_rc: int
) -> None:
    """Exit codes, uncaught exceptions (traceback from the script's frame on, as the interpreter
    prints it) and deaths by signal are mirrored by the client, so torchrun sees a cold rank's."""
    (tmp_path / "s.py").write_text(script + "\n")
    results = []
    for z in (None, zygote):
        with reaped(client(z, [sys.executable, "s.py"], env, tmp_path)) as proc:
            _, err = proc.communicate(timeout=60)
            results.append((proc.returncode, err.replace(" (core dumped)", "")))
    assert results[0][0] == expected_rc
    assert results[1] == results[0]


def test_signals_reach_the_rank_and_a_killed_client_takes_it_along(
    tmp_path: Path, env: dict[str, str], zygote: Zygote
) -> None:
    """torchrun's SIGTERM to the client reaches the rank (which dies of it, and so does the
    client); a client killed with SIGKILL leaves no rank behind and no zombie in the zygote."""
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(60)\n")
    env1 = dict(env, PROBE_ID="term")
    with reaped(client(zygote, [sys.executable, "sleep.py"], env1, tmp_path)) as proc:
        rank = forked_rank(zygote, "sleep.py")
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=30)
        assert proc.returncode == -signal.SIGTERM
        assert not rank.is_running() or rank.status() == psutil.STATUS_ZOMBIE
    env2 = dict(env, PROBE_ID="kill")
    with reaped(client(zygote, [sys.executable, "sleep.py"], env2, tmp_path)) as proc:
        rank = forked_rank(zygote, "sleep.py")
        proc.kill()
        proc.communicate(timeout=30)
        rank.wait(timeout=30)  # bounds, not expectations: a loaded machine is slow to reap
    assert zygote.pid is not None
    deadline = time.monotonic() + 30
    while psutil.Process(zygote.pid).children() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert psutil.Process(zygote.pid).children() == []


def test_what_the_zygote_cannot_serve_starts_cold_and_says_why(
    tmp_path: Path, env: dict[str, str], zygote: Zygote
) -> None:
    """Interpreter options, an import-time variable that differs and another interpreter: the
    rank starts cold (and runs), its stderr and the zygote's facts say why."""
    wait_ready(zygote)
    (tmp_path / "s.py").write_text("import sys; sys.exit(4)\n")
    cases = [
        ([sys.executable, "-c", "import sys; sys.exit(4)"], env, "interpreter option -c"),
        ([sys.executable, "s.py"], dict(env, PYTHONHASHSEED="7"), "differs: PYTHONHASHSEED"),
        (["/bin/sh", "-c", "exit 4"], env, "is not the zygote's interpreter"),
    ]
    for rank, (argv, rank_env, why) in enumerate(cases):
        with reaped(client(zygote, argv, dict(rank_env, RANK=str(rank)), tmp_path)) as proc:
            _, err = proc.communicate(timeout=60)
        assert proc.returncode == 4, err
        assert "rvsup: rank starts cold: " in err and why in err
    said = zygote.cold_starts()
    assert [e.ranks for e in said] == [(0,), (1,), (2,)]
    assert all(why in e.reason for e, (_, _, why) in zip(said, cases, strict=True))


def test_an_import_that_starts_a_thread_makes_every_rank_cold(
    tmp_path: Path, env: dict[str, str]
) -> None:
    """A preloaded module that starts a thread would leave forked ranks with half a runtime: the
    zygote refuses to serve, says so once, and every rank starts cold."""
    (tmp_path / "threaded.py").write_text(
        "import threading, time\nthreading.Thread(target=time.sleep, args=(60,), daemon=True).start()\n"
    )
    z = Zygote(sys.executable, ["threaded"], path=str(tmp_path), defaults=())
    z.ensure(env, tmp_path, nproc=1)
    try:
        (tmp_path / "s.py").write_text("print('ran')\n")
        with reaped(client(z, [sys.executable, "s.py"], env, tmp_path)) as proc:
            out, err = proc.communicate(timeout=60)
        assert (proc.returncode, out) == (0, "ran\n")
        assert "thread(s) started while importing" in err
        said = z.cold_starts()
        assert said[0] == ColdStart(ranks=(), reason=said[0].reason)
        assert said[0].reason.startswith("zygote unsafe: 1 thread(s) started while importing")
    finally:
        z.close()


def test_a_dead_zygote_takes_its_ranks_and_the_next_start_is_cold(
    tmp_path: Path, env: dict[str, str], zygote: Zygote
) -> None:
    """The zygote killed under a running rank: the rank dies with it (its client ends as killed
    by SIGKILL, as a cold rank killed would); the next rank starts cold and runs; the supervisor
    learns of the death once, and a new zygote serves again."""
    (tmp_path / "sleep.py").write_text("import time\ntime.sleep(60)\n")
    with reaped(
        client(zygote, [sys.executable, "sleep.py"], dict(env, PROBE_ID="z"), tmp_path)
    ) as proc:
        rank = forked_rank(zygote, "sleep.py")
        assert zygote.pid is not None
        os.kill(zygote.pid, signal.SIGKILL)
        proc.communicate(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        rank.wait(timeout=5)
    (tmp_path / "s.py").write_text("print('ran')\n")
    with reaped(client(zygote, [sys.executable, "s.py"], env, tmp_path)) as proc:
        out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out) == (0, "ran\n")
    assert "rvsup: rank starts cold: no zygote" in err
    said = zygote.cold_starts()
    assert [e.reason for e in said] == ["the zygote killed by signal 9"]
    assert zygote.cold_starts() == []
    zygote.ensure(env, tmp_path, nproc=1)
    with reaped(client(zygote, [sys.executable, "s.py"], env, tmp_path)) as proc:
        out, err = proc.communicate(timeout=60)
    assert (proc.returncode, out, err) == (0, "ran\n", "")


def test_a_client_gone_before_the_answer_leaves_no_rank_that_ran(
    tmp_path: Path, env: dict[str, str], zygote: Zygote
) -> None:
    """A client that hangs up after its request, before the zygote answers (as one whose zygote
    dies between the fork and the answer sees it, and then starts the rank cold): the forked
    child ends without running one line of the rank's program, and the zygote reaps it."""
    wait_ready(zygote)
    assert zygote.pid is not None
    marker = tmp_path / "ran"
    (tmp_path / "mark.py").write_text(f"open({str(marker)!r}, 'w').close()\n")
    request = request_of([sys.executable, "mark.py"])
    request.update(env=env, cwd=str(tmp_path))
    os.kill(zygote.pid, signal.SIGSTOP)  # the request waits in the socket; the answer cannot go
    try:
        with (
            socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock,
            open(os.devnull, "r+b") as null,
        ):
            sock.connect("\0" + zygote.name)
            wire.send(sock, request, fds=(null.fileno(),) * 3)
    finally:
        os.kill(zygote.pid, signal.SIGCONT)
    (tmp_path / "s.py").write_text("print('ran')\n")
    with reaped(client(zygote, [sys.executable, "s.py"], env, tmp_path)) as proc:
        out, err = proc.communicate(timeout=60)  # served after the first request, one at a time
    assert (proc.returncode, out, err) == (0, "ran\n", "")
    deadline = time.monotonic() + 2  # a child that was let go runs mark.py in a few ms
    while time.monotonic() < deadline and not marker.exists():
        time.sleep(0.05)
    assert not marker.exists()
    assert psutil.Process(zygote.pid).children() == []


def test_forked_ranks_draw_their_own_random_numbers(tmp_path: Path, env: dict[str, str]) -> None:
    """Python's, NumPy's and torch's global generators are seeded from the OS in every forked
    rank, as in a cold start: no two ranks (nor the zygote's next fork) share a stream."""
    z = Zygote(sys.executable, ["numpy", "torch"], defaults=())
    z.ensure(env, tmp_path, nproc=1)
    try:
        (tmp_path / "r.py").write_text(
            textwrap.dedent(
                """\
                import random, numpy, torch
                print(random.random(), numpy.random.random(), torch.rand(1).item(), torch.initial_seed())
                """
            )
        )
        draws = []
        for _ in range(3):
            with reaped(client(z, [sys.executable, "r.py"], env, tmp_path)) as proc:
                out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and "starts cold" not in err, err
            draws.append(out.split())
        for column in zip(*draws, strict=True):
            assert len(set(column)) == 3, draws
    finally:
        z.close()


THREADS = """\
import os, torch
before = (torch.get_num_threads(), os.environ.get("OMP_NUM_THREADS"))
torch.set_num_threads(2)
x = torch.randn(512, 512, generator=torch.Generator().manual_seed(0))
total = (x @ x).sum().item()  # an intra-op parallel region in the rank (libgomp's pool)
print(before, torch.get_num_threads(), torch.get_num_interop_threads(), round(total, 3))
"""


@pytest.mark.parametrize("omp", [None, "1"])
def test_a_forked_rank_has_the_threads_of_a_cold_one(
    tmp_path: Path, env: dict[str, str], omp: str | None
) -> None:
    """torch's thread settings in a forked rank are a cold start's: OMP_NUM_THREADS (unset, or
    set as torchrun sets it for several ranks per node) gives the same intra-op threads, and
    ``torch.set_num_threads`` then works, a parallel matmul included (the zygote never ran
    one, so the forked rank's OpenMP pool is its own)."""
    if omp is not None:
        env = {**env, "OMP_NUM_THREADS": omp}
    z = Zygote(sys.executable, ["torch"], defaults=())
    z.ensure(env, tmp_path, nproc=1)
    try:
        (tmp_path / "t.py").write_text(THREADS)
        outs = []
        for via in (None, z):
            with reaped(client(via, [sys.executable, "t.py"], env, tmp_path)) as proc:
                out, err = proc.communicate(timeout=120)
            assert proc.returncode == 0 and "starts cold" not in err, err
            outs.append(out)
        cold, forked = outs
        assert forked == cold, (cold, forked)
        assert z.cold_starts() == []
    finally:
        z.close()


def test_the_zygote_outlives_a_jobs_sigterm_and_its_ranks_get_their_dispositions_back(
    tmp_path: Path, env: dict[str, str], zygote: Zygote
) -> None:
    """Slurm's preemption sends SIGTERM to every process of the job: the zygote ignores it, so
    its forked rank (which dies with it) lives on; the rank itself has SIGTERM, SIGINT and
    SIGHUP as its client had them (default, Python's KeyboardInterrupt, and ignored when the
    client was started ignoring SIGHUP, as under nohup), and dies of the SIGTERM sent to it."""
    (tmp_path / "dispositions.py").write_text(
        textwrap.dedent(
            """\
            import signal, sys, time
            names = {signal.SIG_DFL: "default", signal.SIG_IGN: "ignored",
                     signal.default_int_handler: "python"}
            got = [names.get(signal.getsignal(s), "other") for s in
                   (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)]
            print(*got, flush=True)
            time.sleep(60)
            """
        )
    )

    def client_dispositions() -> None:
        # the rest as an interactive shell gives them (a background job, as under nohup, would
        # start the client ignoring SIGINT: Python then installs no KeyboardInterrupt handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)

    proc = client(
        zygote,
        [sys.executable, "dispositions.py"],
        env,
        tmp_path,
        preexec_fn=client_dispositions,
    )
    with reaped(proc):
        rank = forked_rank(zygote, "dispositions.py")
        assert proc.stdout is not None
        assert proc.stdout.readline().split() == ["default", "python", "ignored"]
        assert zygote.pid is not None
        os.kill(zygote.pid, signal.SIGTERM)
        time.sleep(0.5)
        assert zygote.alive() and rank.is_running()
        rank.send_signal(signal.SIGTERM)
        proc.communicate(timeout=10)
        assert proc.returncode == -signal.SIGTERM
    assert zygote.alive() and zygote.cold_starts() == []


def test_the_watch_of_a_nodes_zygote_says_how_it_ended(tmp_path: Path) -> None:
    """On a multi-node job each zygote runs under a watch that survives SIGTERM like it, and
    says on its output, with the node's name, how the zygote ended (here: killed by SIGKILL)."""
    victim = "import os, signal, time; time.sleep(1); os.kill(os.getpid(), signal.SIGKILL)"
    proc = subprocess.Popen(
        [sys.executable, "-m", "worker_sdk.spawn.zygote_watch", sys.executable, "-c", victim],
        env=dict(os.environ, PYTHONPATH=str(REPO), SLURMD_NODENAME="node7"),
        cwd=tmp_path,
        text=True,
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    with reaped(proc):
        # the watch shields itself before it forks the zygote: once the child exists, a SIGTERM
        # is the one the test means (not one that finds the interpreter still starting)
        wait_for(lambda: psutil.Process(proc.pid).children(), timeout=30, what="the zygote")
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0
    assert json.loads(out) == {"gone": "killed by signal 9", "node": "node7"}
