"""Where each attempt runs after a node failure: spares first, then fewer nodes down to
launch.min_nnodes (pure planning: no process is started)."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from supervisor.config.torchrun import Torchrun
from supervisor.process.launch_plan import build_plan
from supervisor.process.plan import Launches, PortHold
from supervisor.process.zygote import zygote_step_argv
from supervisor.service.sdnotify import CHILD_ENV_VARS
from supervisor.slurm.commands import Allocation
from tests.helpers.core_fakes import job_config
from worker_sdk.contract.protocol import ENV_REPORT_EXIT

TORCHRUN = Torchrun(("/venv/bin/torchrun",), None, "test")


def _launches(
    tmp: Path, nodes: tuple[str, ...], launch: str, swept: list[tuple[str, ...]] | None = None
) -> Launches:
    cfg = job_config(
        tmp, f"[launch]\nnproc_per_node = 2\nwarm_standby = false\nzygote = false\n{launch}\n"
    )
    alloc = Allocation("7", nodes, nodes[0], None, 2, 0)
    sweeps = [] if swept is None else swept
    return Launches(cfg, alloc, TORCHRUN, sweep=lambda a, _name: sweeps.append(a.nodes))


def test_a_multi_node_jobs_end_sweeps_the_nodes_left(tmp_path: Path) -> None:
    """At a multi-node job's end every node not lost gets a sweep step (what node wrappers
    killed with their torchrun left), once; a single-node job's end runs none."""
    swept: list[tuple[str, ...]] = []
    launches = _launches(tmp_path, ("n1", "n2", "n3"), "nnodes = 2", swept)
    launches.lose(["n2"])
    launches.close()
    launches.close()
    assert swept == [("n1", "n3")]
    single = _launches(tmp_path, ("n1",), "nnodes = 1", swept)
    single.close()
    assert swept == [("n1", "n3")]


@pytest.mark.parametrize(("memory", "removes"), [('"auto"', True), ('"off"', False)])
def test_the_sweep_removes_each_nodes_snapshots_when_the_tier_is_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, memory: str, removes: bool
) -> None:
    """The sweep step's command removes every node's copies of the job's memory snapshots
    (worker_sdk.spawn.sweep_snapshots) when the tier is on; it only ends what is left else."""
    ran: list[list[str]] = []
    monkeypatch.setattr(
        "supervisor.process.plan.subprocess.run", lambda argv, **_kw: ran.append(argv)
    )
    cfg = job_config(
        tmp_path,
        f"[launch]\nnproc_per_node = 2\nnnodes = 2\nwarm_standby = false\nzygote = false\n"
        f"[checkpoint]\nmemory_every_steps = {memory}\n",
    )
    alloc = Allocation("7", ("n1", "n2"), "n1", None, 2, 0)
    on = cfg.checkpoint.memory_every_steps != 0
    Launches(
        cfg, alloc, TORCHRUN, snapshots=tmp_path / "shm" / "rvsup-snapshots" if on else None
    ).close()
    (argv,) = ran
    inner = argv[argv.index("--") + 1 :]
    assert inner[:4] == [sys.executable, "-m", "worker_sdk.spawn.node_group", "0"]
    if removes:
        assert inner[4:] == [
            sys.executable,
            "-m",
            "worker_sdk.spawn.sweep_snapshots",
            str(tmp_path / "shm" / "rvsup-snapshots"),
        ]
    else:
        assert inner[4:] == ["true"]


@pytest.mark.parametrize(
    ("nodes", "launch", "lost", "verdict", "nnodes"),
    [
        (("n1", "n2"), "nnodes = 2", ("n2",), (1, 2), 1),  # no spare, no minimum: give up
        (("n1", "n2", "n3"), "nnodes = 2", ("n2",), (2, 2), 2),  # the spare takes n2's place
        (("n1", "n2"), "nnodes = 2\nmin_nnodes = 1", ("n2",), (1, 1), 1),  # go on with n1
        (("n1", "n2", "n3"), "nnodes = 3\nmin_nnodes = 2", ("n3",), (2, 2), 2),
        (("n1", "n2", "n3"), "nnodes = 3\nmin_nnodes = 2", ("n2", "n3"), (1, 2), 1),
    ],
)
def test_nodes_after_a_loss(
    tmp_path: Path,
    nodes: tuple[str, ...],
    launch: str,
    lost: tuple[str, ...],
    verdict: tuple[int, int],
    nnodes: int,
) -> None:
    """lose() answers (nodes left, the job's minimum) for the policy, and the next plan runs on
    the nodes left, as many as the job wants."""
    launches = _launches(tmp_path, nodes, launch)
    assert launches.lose(lost) == verdict
    try:
        plan = launches.plan(2, {})
    finally:
        launches.close()
    assert plan.nnodes == nnodes
    assert plan.nproc_per_node == 2
    if nnodes == 1:
        assert "--rdzv-backend=static" in plan.argv and plan.alloc is None
    else:
        assert f"--nnodes={nnodes}" in plan.argv
        assert plan.alloc is not None and not set(plan.alloc.nodes) & set(lost)
        # static on several nodes too (no pickled state in the store), on the first node
        assert "--rdzv-backend=static" in plan.argv
        assert f"--master-addr={plan.alloc.nodes[0]}" in plan.argv
        assert not any("c10d" in arg or "rdzv-endpoint" in arg for arg in plan.argv)


def test_min_nnodes_above_nnodes_is_refused(tmp_path: Path) -> None:
    """launch.min_nnodes larger than launch.nnodes is a configuration error naming the key."""
    from supervisor.config.model import ConfigError

    with pytest.raises(ConfigError, match="min_nnodes"):
        job_config(tmp_path, "[launch]\nnnodes = 2\nmin_nnodes = 3\n")


def test_multi_node_ranks_are_forked_from_each_nodes_zygote(tmp_path: Path) -> None:
    """A multi-node attempt with a zygote: srun runs torchrun on every node, the ranks' command
    names the zygote (the same name on every node: each node's own socket) and their clients
    report how they end; the zygotes run as a step of their own, each watched, where one
    node's zygote ending does not end the step."""
    cfg = job_config(tmp_path, "[launch]\nnnodes = 2\nnproc_per_node = 2\n")
    alloc = Allocation("7", ("n1", "n2"), "n1", None, 2, 0)
    plan = build_plan(
        cfg, attempt=1, torchrun=TORCHRUN, rank_env={}, alloc=alloc, zygote="rvsup-zygote-x"
    )
    assert plan.argv[0] == "srun" and "--kill-on-bad-exit=1" in plan.argv
    inner = plan.argv[plan.argv.index("--") + 1 :]
    assert inner[:4] == (
        sys.executable,
        "-m",
        "worker_sdk.spawn.node_group",
        "5.0",
    )  # a group per node
    assert plan.forked and plan.env[ENV_REPORT_EXIT] == "1"
    bootstrap = plan.argv.index("worker_sdk.spawn.bootstrap")
    assert plan.argv[bootstrap + 1 : bootstrap + 4] == ("--zygote", "rvsup-zygote-x", "python")
    zygote = ["/venv/bin/python", "-c", "..."]
    step = zygote_step_argv(alloc, zygote, step_name="core-zygote")
    assert step[0] == "srun" and "--kill-on-bad-exit=0" in step and "--overlap" in step
    assert "--job-name=core-zygote" in step and "--nodelist=n1,n2" in step
    assert step[step.index("--") + 1 :] == [
        sys.executable,
        "-m",
        "worker_sdk.spawn.zygote_watch",
        *zygote,
    ]


def test_a_single_node_attempt_rendezvouses_on_a_port_held_for_it(tmp_path: Path) -> None:
    """One node: torchrun's static rendezvous on a port the supervisor holds (no --standalone,
    whose c10d rendezvous waits up to 0.3 s at random); each attempt gets a port of its own and
    run id; the previous attempt's port is let go."""
    cfg = job_config(
        tmp_path, "[launch]\nnproc_per_node = 2\nwarm_standby = false\nzygote = false\n"
    )
    launches = Launches(cfg, None, TORCHRUN)
    try:
        first = launches.plan(1, {})
        second = launches.plan(2, {})
    finally:
        launches.close()
    for attempt, plan in ((1, first), (2, second)):
        assert "--standalone" not in plan.argv
        assert "--rdzv-backend=static" in plan.argv and "--master-addr=localhost" in plan.argv
        assert f"--rdzv-id={cfg.job.name}-{attempt}" in plan.argv
    ports = [
        next(int(a.split("=", 1)[1]) for a in plan.argv if a.startswith("--master-port="))
        for plan in (first, second)
    ]
    assert ports[0] != ports[1]


def test_a_held_port_is_refused_to_others_and_given_to_the_rendezvous_store() -> None:
    """While held, a plain bind of the port fails (nobody else takes it), and a listener that
    sets SO_REUSEADDR, as torch's TCPStore does, binds and accepts connections on it."""
    hold = PortHold()
    try:
        with socket.socket() as other, pytest.raises(OSError, match="in use"):
            other.bind(("", hold.port))
        with socket.socket() as store:
            store.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            store.bind(("", hold.port))
            store.listen()
            with socket.create_connection(("127.0.0.1", hold.port), timeout=5):
                conn, _ = store.accept()
                conn.close()
    finally:
        hold.close()


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        (
            {
                "NOTIFY_SOCKET": "/run/systemd/notify",
                "WATCHDOG_USEC": "30000000",
                "WATCHDOG_PID": "42",
                "PATH": "/usr/bin",
                "RVSUP_JOB": "gpt",
            },
            {"PATH": "/usr/bin", "RVSUP_JOB": "gpt"},
        ),
        ({"NOTIFY_SOCKET": "@x"}, {}),
        ({"PATH": "/usr/bin"}, {"PATH": "/usr/bin"}),
        ({}, {}),
    ],
    ids=["all-three", "socket-only", "none", "empty"],
)
def test_systemds_variables_are_withheld_from_the_children(
    tmp_path: Path, env: dict[str, str], expected: dict[str, str]
) -> None:
    """With the daemon's CHILD_ENV_VARS withheld, a plan's environment lacks exactly systemd's
    three main-process variables, and the environment it was built from is left as it was."""
    cfg = job_config(tmp_path, "[launch]\nwarm_standby = false\nzygote = false\n")
    base = dict(env)
    plan = build_plan(
        cfg,
        attempt=1,
        torchrun=TORCHRUN,
        rank_env={},
        base_env=base,
        withheld_env=CHILD_ENV_VARS,
    )
    assert {k: v for k, v in plan.env.items() if k in env} == expected
    assert base == env
