"""rvsup inside real Slurm allocations: 2 nodes x 2 ranks of the process tests' trainer, submitted
with examples/slurm/train.sbatch, through a killed rank, preemption and time signals with requeue,
a real time limit, and the loss of a node.

Every job's final model, optimizer, scheduler and per-rank RNG states are compared with those
of the same 2 x 2 job run without interruption (``reference``) with torch.equal. (The trainer
builds DDP with find_unused_parameters=True: see docs/sdk.md, bit-identical resume with 3+ ranks.)

A test waits for its job to leave the queue, so that the next one finds its nodes free; the node
failure tests bring node2 back before they end. Jobs run on node1 and node2; node3 is the spare
that a 3-node allocation restarts on after losing node2.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import pytest

from supervisor.record import rundir
from supervisor.slurm import commands as slurm
from supervisor.slurm import text as slurm_text
from tests.helpers.states import assert_same_state, load_final
from tests.slurm.cluster import SlurmCluster
from tests.slurm.jobs import (
    REFERENCE_STEPS,
    TrainerJob,
    ranks_past,
    submit,
    wait_until,
    write_trainer_job,
)
from tests.slurm.node_loss import kill_node_during, run_to_end

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("needs_venv")]

TOTAL = REFERENCE_STEPS  # every job's here (the reference's, conftest.py: the final states compare)
START_S = 90.0  # a 2-node job's start: scheduling, 6 Python processes importing torch on 2 cores
END_S = 120.0  # from the last signal to the job leaving the queue (requeues included)
ZYGOTE_CMDLINE = "worker_sdk.spawn.zygote --socket"  # what a zygote's command line shows


@pytest.fixture
def cancel_later(slurm_cluster: SlurmCluster) -> Iterator[list[str]]:
    """Job ids appended here are cancelled, and waited for, after the test (also on failure)."""
    jobs: list[str] = []
    yield jobs
    for job_id in jobs:
        slurm_cluster.scancel(job_id)
    for job_id in jobs:
        slurm_cluster.wait_gone(job_id, timeout=60)


@contextlib.contextmanager
def _cancelled_on_error(cluster: SlurmCluster, job_id: str) -> Iterator[None]:
    """Cancel the job, and wait for it to leave the queue, if the block raises."""
    try:
        yield
    except BaseException:
        cluster.scancel(job_id)
        cluster.wait_gone(job_id, timeout=60)
        raise


@contextlib.contextmanager
def _past_step_12(
    cluster: SlurmCluster, root: Path, *, health: str = ""
) -> Iterator[tuple[TrainerJob, str, dict[str, Any]]]:
    """A 2 x 2 job (0.05 s steps; ``health``: its [health] table) submitted and awaited until
    every rank is past step 12: the block acts on it (the job, its id, `rvsup status`; cancelled
    if the block raises), then the job is awaited until it leaves the queue."""
    job = write_trainer_job(root, total=TOTAL, env={"STEP_SLEEP": "0.05"}, health=health)
    job_id = submit(cluster, job)
    with _cancelled_on_error(cluster, job_id):
        status = wait_until(lambda: ranks_past(job, 12), timeout=START_S, what="4 ranks at 12")
        yield job, job_id, status
    run_to_end(cluster, job, job_id, timeout=START_S + END_S)


def _failure_kinds(job: TrainerJob) -> list[str]:
    return [e["kind"] for e in job.named("failure_detected")]


def _rank_logs(job: TrainerJob, attempt: int | None = None) -> str:
    """What the ranks wrote on stderr (torchrun's per-rank logs, every node's)."""
    folder = job.run_dir / "logs" if attempt is None else rundir.logs_dir(job.run_dir, attempt)
    logs = sorted(folder.glob("**/stderr.log"))
    assert logs, f"no rank logs under {folder}"
    return "".join(log.read_text(errors="replace") for log in logs)


def _when(event: dict[str, Any]) -> float:
    return datetime.datetime.fromisoformat(event["timestamp"]).timestamp()


# ------------------------------------------- a rank killed on node2, then node2's zygote
# One job for both faults (one 2-node start saved): attempt 1 loses rank 2, attempt 2 (forked
# from the same zygotes) loses node2's zygote and its ranks with it, attempt 3 forks again.


@dataclass(frozen=True)
class KilledRank:
    """The job whose rank 2 was killed in attempt 1 and whose zygote on node2 was killed in
    attempt 2, and that rank as `rvsup status` showed it."""

    job: TrainerJob
    job_id: str
    victim: dict[str, Any]


def _node2_zygotes(cluster: SlurmCluster) -> list[int]:
    return [pid for pid, cmd in cluster.node_processes("node2").items() if ZYGOTE_CMDLINE in cmd]


@pytest.fixture(scope="module")
def killed_rank(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory, reference: TrainerJob
) -> KilledRank:
    """A 2 x 2 job whose rank 2 (on node2, found with `rvsup status`) gets SIGKILL at step >= 12,
    then, once the restarted attempt's ranks are 5 steps past their resume step, whose zygote on
    node2 gets SIGKILL. Two failures on node2 would exclude it (and requeue the job away from
    it, with no other pair of nodes allowed): exclusion waits for a third here."""
    root = tmp_path_factory.mktemp("killed")
    with _past_step_12(slurm_cluster, root, health="exclude_after = 3") as (job, job_id, status):
        victim = next(r for r in status["ranks"] if r["rank"] == 2)
        assert victim["host"] == "node2"
        on_node2 = slurm_cluster.node_processes("node2")
        assert victim["pid"] in on_node2, "rank 2 is not on node2"
        parent = on_node2.get(psutil.Process(victim["pid"]).ppid(), "")
        assert ZYGOTE_CMDLINE in parent, f"rank 2 is not forked from node2's zygote: {parent}"
        os.kill(victim["pid"], signal.SIGKILL)
        resumed = wait_until(
            lambda: job.named("attempt_started")[1:], timeout=START_S, what="attempt 2"
        )[0]

        def attempt_2_past(step: int) -> dict[str, Any] | None:
            status = ranks_past(job, step)
            return status if status is not None and status["attempt"] == 2 else None

        wait_until(
            lambda: attempt_2_past(resumed["resume_step"] + 5),
            timeout=START_S,
            what="4 ranks of attempt 2 five steps past their resume step",
        )
        zygotes = _node2_zygotes(slurm_cluster)
        assert len(zygotes) == 1, slurm_cluster.node_processes("node2")
        os.kill(zygotes[0], signal.SIGKILL)
    return KilledRank(job, job_id, victim)


def test_rank_killed_on_node2_is_restarted_and_ends_as_the_reference(
    killed_rank: KilledRank, reference: TrainerJob
) -> None:
    """SIGKILL of rank 2 on node2: a crash, a restart from the last checkpoint within the same
    allocation (every attempt carries the job id), and a final state bit-identical to the
    reference's (model, optimizer, scheduler, every rank's RNG)."""
    job, job_id = killed_rank.job, killed_rank.job_id
    assert _failure_kinds(job) == ["crash", "crash"], job.output_text()[-3000:]
    attempts = job.named("attempt_started")
    assert [(a["slurm_job_id"], a["restart_count"]) for a in attempts] == [(job_id, 0)] * 3
    assert [(a["nnodes"], a["nproc_per_node"]) for a in attempts] == [(2, 2)] * 3
    assert attempts[1]["resume_step"] >= 10 and attempts[1]["resume_step"] % 10 == 0
    assert len(job.named("restart_scheduled")) == 2 and job.named("job_succeeded")
    assert_same_state(load_final(reference.final), load_final(job.final))


def test_the_ranks_of_both_nodes_are_forked_from_their_zygotes(
    killed_rank: KilledRank, reference: TrainerJob
) -> None:
    """With the default launch.zygote, no rank of a 2-node job starts cold, neither at the first
    start nor after a crash: no cold_start event, no rank saying it starts cold (the killed job:
    none before its zygote was killed)."""
    assert reference.named("cold_start") == [], reference.named("cold_start")
    assert "starts cold" not in _rank_logs(reference)
    for attempt in (1, 2):
        assert "starts cold" not in _rank_logs(killed_rank.job, attempt=attempt)
    cold = [e["reason"] for e in killed_rank.job.named("cold_start")]
    assert cold == ["the zygote on node2 killed by signal 9"], cold  # nothing before it


def test_rank_killed_on_node2_is_named_as_the_culprit(killed_rank: KilledRank) -> None:
    """The crash names rank 2 killed by SIGKILL, as it would on a single node, and is attributed
    to node2 alone (the ranks the teardown ended on node1 are collateral)."""
    failure = killed_rank.job.named("failure_detected")[0]
    assert failure["ranks"][0] == 2 and failure["signals"][:1] == ["SIGKILL"], failure["detail"]
    assert failure["nodes"] == ["node2"], failure


def test_a_killed_zygote_takes_its_ranks_and_the_next_attempt_forks_again(
    killed_rank: KilledRank, reference: TrainerJob
) -> None:
    """node2's zygote killed (in attempt 2): its ranks die with it (a crash), the history says
    the zygote on node2 was killed, the zygotes' step starts again and the next attempt's ranks
    are forked, not cold; the final state is the reference's, bit for bit."""
    job = killed_rank.job
    assert _failure_kinds(job) == ["crash", "crash"], job.output_text()[-3000:]
    said = [e["reason"] for e in job.named("cold_start")]
    assert said == ["the zygote on node2 killed by signal 9"], said
    assert len(job.named("attempt_started")) == 3 and job.named("job_succeeded")
    assert "starts cold" not in _rank_logs(job, attempt=3)
    assert_same_state(load_final(reference.final), load_final(job.final))


# ---------------------------------------------------------------------- preemption and requeue


def test_term_then_usr1_requeue_and_resume_with_zero_steps_redone(
    slurm_cluster: SlurmCluster, tmp_path: Path, reference: TrainerJob, cancel_later: list[str]
) -> None:
    """`scancel --batch -s TERM`, then in the requeued allocation USR1: each time a checkpoint at a
    common step, `scontrol requeue`, a new allocation (SLURM_RESTART_COUNT 1, then 2) appending
    to the same history and resuming at the stop's step + 1; bit-identical at the end."""
    # slower from step 25: the USR1 lands before the requeued run's end on a loaded machine
    env = {"STEP_SLEEP": "0.05", "TAIL_FROM": "25", "TAIL_SLEEP": "0.2"}
    job = write_trainer_job(tmp_path, total=TOTAL, env=env)
    job_id = submit(slurm_cluster, job)
    cancel_later.append(job_id)
    wait_until(lambda: ranks_past(job, 10), timeout=START_S, what="4 ranks at step 10")
    slurm_cluster.scancel(job_id, "--batch", "--signal=TERM")
    stop = wait_until(lambda: job.named("job_stopped"), timeout=60, what="the TERM stop")[0]
    assert stop["step"] is not None, job.output_text()[-3000:]
    wait_until(lambda: ranks_past(job, stop["step"] + 5), timeout=START_S, what="the requeued run")
    slurm_cluster.scancel(job_id, "--batch", "--signal=USR1")
    run_to_end(slurm_cluster, job, job_id, timeout=END_S + START_S)

    started = job.named("job_started")
    assert [(s["slurm_job_id"], s["restart_count"]) for s in started] == [
        (job_id, 0),
        (job_id, 1),
        (job_id, 2),
    ]
    requested = [(e["reason"], e["source"]) for e in job.named("stop_requested")]
    assert requested == [("preempted", "signal SIGTERM"), ("timelimit", "signal SIGUSR1")]
    stops = job.named("job_stopped")
    assert [(s["reason"], s["requeued"]) for s in stops] == [
        ("preempted", True),
        ("timelimit", True),
    ]
    attempts = job.named("attempt_started")
    assert [a["restart_count"] for a in attempts] == [0, 1, 2]
    assert [a["resume_step"] for a in attempts] == [0] + [s["step"] + 1 for s in stops]
    assert _failure_kinds(job) == [] and job.named("job_succeeded")
    assert_same_state(load_final(reference.final), load_final(job.final))


def test_stop_before_end_of_a_real_time_limit_requeues_and_completes(
    slurm_cluster: SlurmCluster, tmp_path: Path, reference: TrainerJob, cancel_later: list[str]
) -> None:
    """--time=2 with stop_before_end = "90s": about 30 s into the allocation rvsup sees 90 s left
    (squeue), checkpoints at a common step and requeues; the next allocation, which reads job.toml
    again, resumes at that step + 1 and completes: nothing redone or lost."""
    slurm_toml = 'requeue = "auto"\nstop_before_end = "90s"'
    # >= 30 s of steps: still training when the stop comes
    job = write_trainer_job(tmp_path, total=TOTAL, env={"STEP_SLEEP": "0.5"}, slurm=slurm_toml)
    # the example's USR1 at 120 s before the end would come first: send it as late as possible
    job_id = submit(slurm_cluster, job, "--time=2", "--signal=B:USR1@5")
    cancel_later.append(job_id)
    wait_until(lambda: job.named("job_stopped"), timeout=START_S, what="the time-limit stop")
    # fast steps from the next allocation on, and its stop 100 s in: it ends long before that
    # stop, even when a loaded machine takes 30 s to start its 6 processes (a stop that lands
    # after the last step, while the ranks exit, would be a second stop_requested)
    write_trainer_job(
        tmp_path,
        total=TOTAL,
        env={"STEP_SLEEP": "0.05"},
        slurm='requeue = "auto"\nstop_before_end = "20s"',
    )
    run_to_end(slurm_cluster, job, job_id, timeout=START_S + END_S)

    requested = job.named("stop_requested")
    assert [e["reason"] for e in requested] == ["timelimit"], job.output_text()[-3000:]
    assert requested[0]["source"].endswith("left of the time limit"), requested
    stops = job.named("job_stopped")
    assert [(s["reason"], s["requeued"]) for s in stops] == [("timelimit", True)]
    assert stops[0]["step"] is not None, job.output_text()[-3000:]
    started = job.named("job_started")
    assert [(s["slurm_job_id"], s["restart_count"]) for s in started] == [(job_id, 0), (job_id, 1)]
    stop_after_s = _when(requested[0]) - _when(started[0])
    assert 20 <= stop_after_s <= 50, f"stopped {stop_after_s:.0f}s after the start"
    attempts = job.named("attempt_started")
    assert [a["resume_step"] for a in attempts] == [0, stops[0]["step"] + 1]
    assert _failure_kinds(job) == [] and job.named("job_succeeded")
    assert_same_state(load_final(reference.final), load_final(job.final))


# ---------------------------------------------------------------------- losing node2


SRUN_LAUNCH_FAILED = (
    "srun: error: Task launch for StepId=7.1 failed on node node2: Communication connection "
    "failure\nsrun: error: Application launch failed: Communication connection failure\n"
    "srun: Job step aborted: Waiting up to 7 seconds for job step to finish.\n"
    "srun: error: node1: task 0: Killed\n"
)


@pytest.mark.parametrize(
    ("stderr", "expected"),
    [
        ("", []),
        (SRUN_LAUNCH_FAILED, ["node2"]),  # Slurm 22.05, slurmd of node2 dead
        ("srun: error: Node failure on node1\n", ["node1"]),
        ("srun: error: node1: task 0: Killed\n", []),  # a task killed is no lost node
        ("srun: error: Task launch for StepId=3.0 failed on node node9: Timeout\n", []),
        (
            (
                "srun: error: Node failure on node2\nsrun: error: Task launch for StepId=1.0 failed "
                "on node node1: Socket timed out\n"
            ),
            ["node1", "node2"],
        ),
    ],
)
def test_parse_probe_failures(stderr: str, expected: list[str]) -> None:
    """srun's stderr names the nodes it could not launch on; others, and killed tasks, are not."""
    assert slurm_text.parse_probe_failures(stderr, ("node1", "node2")) == expected


@pytest.mark.parametrize(
    ("sinfo", "expected"),
    [
        ("node1 idle\nnode2 mixed\n", []),
        ("node1 allocated\nnode2 allocated*\n", ["node2"]),  # not responding
        ("node1 down*\nnode2 down\n", ["node1", "node2"]),
        ("node1 drained\nnode2 draining\n", []),  # drained by an admin: still runs tasks
        ("node1 idle~\nnode2 fail\n", ["node2"]),  # powered off / failed
        ("node1 completing*\nnode1 completing*\n", ["node1"]),  # listed once per partition
        ("", []),
    ],
)
def test_parse_lost_nodes(sinfo: str, expected: list[str]) -> None:
    """sinfo states that mean a node cannot run tasks now: down, failed, not responding."""
    assert list(slurm_text.parse_lost_nodes(sinfo)) == expected


@dataclass(frozen=True)
class LostNode:
    """The job that lost node2; what lost_nodes() named before and after; how fast rvsup
    ended."""

    job: TrainerJob
    job_id: str
    probe_before: dict[str, str]
    probe_after: dict[str, str]
    probe_after_s: float
    ended_after_s: float


@pytest.fixture(scope="module")
def lost_node(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> LostNode:
    """A 2 x 2 job (on_node_failure = "fail") while every process of node2 (slurmd, the step,
    torchrun, the ranks) gets SIGKILL at step >= 12, like a node that crashed; node2 comes back
    once rvsup has ended."""
    job = write_trainer_job(
        tmp_path_factory.mktemp("lost-node"),
        total=TOTAL,
        env={"STEP_SLEEP": "0.05"},
        restart='max_restarts = 1\nbackoff = "0.1s"\nbackoff_max = "1s"\non_node_failure = "fail"',
    )
    job_id = submit(slurm_cluster, job)
    alloc = slurm.Allocation(job_id, ("node1", "node2"), "node1", None, 1, 0)
    ended_after_s, before, after, after_s = kill_node_during(
        slurm_cluster, job, job_id, "node2", probe=alloc
    )
    return LostNode(job, job_id, before, after, after_s, ended_after_s)


def test_node_loss_ends_the_job_and_is_recorded(lost_node: LostNode) -> None:
    """After node2 dies rvsup gives up by itself (exit 3) within a minute, the history has the
    failure at or after step 12 in attempt 1, and Slurm names node2 as the lost node."""
    job = lost_node.job
    assert job.named("job_gave_up"), job.output_text()[-3000:]
    assert lost_node.ended_after_s < 60
    failures = job.named("failure_detected")
    assert failures and failures[0]["attempt"] == 1 and failures[0]["last_step"] >= 12
    assert len(job.named("attempt_started")) <= 2  # max_restarts = 1
    assert (lost_node.probe_before, list(lost_node.probe_after)) == ({}, ["node2"])


def test_a_lost_node_is_established_in_seconds_and_says_how(lost_node: LostNode) -> None:
    """The lost node is established from its slurmd's refused connection, in well under 5 s
    (the probe step took Slurm's MessageTimeout, ~11 s here), and the failure says so; the
    teardown does not wait term_timeout (3 s) for srun, which would wait for node2's ranks."""
    assert "refused the connection" in lost_node.probe_after["node2"], lost_node.probe_after
    assert lost_node.probe_after_s < 5.0, lost_node.probe_after_s
    failure = lost_node.job.named("failure_detected")[0]
    assert "node2: slurmd at " in failure["detail"], failure["detail"]
    ended = [e for e in lost_node.job.named("processes_ended") if e["attempt"] == 1]
    assert ended and ended[0]["seconds"] < 3.0, ended


def test_node_loss_is_classified_as_node_failure(lost_node: LostNode) -> None:
    """The failure is `node_failure` naming node2, and on_node_failure = "fail" gives up at once."""
    failure = lost_node.job.named("failure_detected")[0]
    assert (failure["kind"], failure["nodes"]) == ("node_failure", ["node2"]), failure["detail"]
    assert "node failure" in lost_node.job.named("job_gave_up")[0]["reason"]


# ---------------------------------------------------------------------- a spare node


@pytest.fixture(scope="module")
def spare_node(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> TrainerJob:
    """A 2 x 2 job (nnodes = 2, on_node_failure = "restart") in a 3-node allocation submitted
    with --no-kill, whose node2 is lost at step >= 12 as in ``lost_node``."""
    job = write_trainer_job(
        tmp_path_factory.mktemp("spare-node"),
        total=TOTAL,
        env={"STEP_SLEEP": "0.05"},
        nnodes="2",
    )
    job_id = submit(slurm_cluster, job, "--nodes=3", "--nodelist=node1,node2,node3", "--no-kill")
    alloc = slurm.Allocation(job_id, ("node1", "node2"), "node1", None, 1, 0)
    kill_node_during(slurm_cluster, job, job_id, "node2", probe=alloc)
    return job


def test_lost_node_is_replaced_by_a_spare(spare_node: TrainerJob, reference: TrainerJob) -> None:
    """With a spare node in the allocation rvsup restarts on what is left: node_failure naming
    node2, attempt 2 pinned to node1 and node3, and the reference's final state, bit for bit."""
    job = spare_node
    failures = job.named("failure_detected")
    assert [(f["kind"], f["nodes"]) for f in failures] == [("node_failure", ["node2"])], (
        job.output_text()[-3000:]
    )
    attempts = job.named("attempt_started")
    assert [a["nnodes"] for a in attempts] == [2, 2]
    assert "--nodelist=node1,node2" in attempts[0]["launcher"]
    assert "--nodelist=node1,node3" in attempts[1]["launcher"]
    assert job.named("job_succeeded")
    assert_same_state(load_final(reference.final), load_final(job.final))


# ---------------------------------------------------------------------- fewer nodes


@pytest.fixture(scope="module")
def fewer_nodes(
    slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory
) -> TrainerJob:
    """A 2 x 2 job (nnodes = 2, min_nnodes = 1; the memory tier on, a snapshot every step) in
    a 2-node allocation submitted with --no-kill, whose node2 is lost at step >= 12 as in
    ``lost_node``: no spare is left. Storage checkpoints at 29 and 59, and steps of 0.2 s from
    step 12 on: the kill lands before step 29 even when a loaded machine takes seconds to see
    the ranks past 12 and to kill node2's processes."""
    job = write_trainer_job(
        tmp_path_factory.mktemp("fewer-nodes"),
        total=TOTAL,
        env={"STEP_SLEEP": "0.05", "TAIL_FROM": "12", "TAIL_SLEEP": "0.2"},
        nnodes="2\nmin_nnodes = 1",
        checkpoint="every_steps = 30\nmemory_every_steps = 1",
    )
    job_id = submit(slurm_cluster, job, "--nodes=2", "--nodelist=node1,node2", "--no-kill")
    alloc = slurm.Allocation(job_id, ("node1", "node2"), "node1", None, 1, 0)
    kill_node_during(slurm_cluster, job, job_id, "node2", probe=alloc)
    return job


def test_job_goes_on_with_fewer_nodes(fewer_nodes: TrainerJob) -> None:
    """Without a spare, a job that allows fewer nodes finishes on the node left: node_failure
    naming node2, attempt 2 on one node (2 ranks) resumed from a 4-rank snapshot, node1's copy
    (newer than storage's newest), which the history records as resharded_from 4."""
    job = fewer_nodes
    failures = job.named("failure_detected")
    assert [(f["kind"], f["nodes"]) for f in failures] == [("node_failure", ["node2"])], (
        job.output_text()[-3000:]
    )
    attempts = job.named("attempt_started")
    assert [a["nnodes"] for a in attempts] == [2, 1]
    assert attempts[1]["resume_step"] > 0 and attempts[1]["resharded_from"] == 4
    assert attempts[1]["source"] == "memory", attempts[1]
    loaded = [e for e in job.named("checkpoint_loaded") if e["attempt"] == 2]
    assert [(e["source"], e["world_size"]) for e in loaded] == [("memory", 4)], loaded
    assert loaded[0]["resume_step"] == attempts[1]["resume_step"]
    assert loaded[0]["resume_step"] > failures[0]["last_step"] - 3, (loaded, failures)
    assert job.named("job_succeeded")
