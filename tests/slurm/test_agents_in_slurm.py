"""The node agents in a real Slurm allocation: the busy-or-stuck judgment and the culprits of a
hang on a node the daemon does not run on, and an agent's loss as its node's.

One 2 x 2 job of the trainer in a 3-node allocation (node3 the spare), four faults in turn:

1. attempt 1, step 5: local rank 0 of every node prepares its node's data (node2's part 30 s,
   node1's 5 s) while the other ranks wait in a barrier: no hang, one slow phase (before the
   agents, node1's ranks waiting in the barrier made the daemon call it a hang at 5 s);
2. attempt 1, step 25: rank 3 (node2) stops itself (SIGSTOP): a hang named on node2, with the
   stacks node2's agent collected;
3. attempt 2, step 35: rank 2 kills node2's agent: a node failure naming node2, and the job
   goes on on node1 and node3;
4. attempt 3, step 40: rank 3 (node3 now) is killed by the kernel's OOM killer in a memory cgroup
   of its own below its node's: an OOM named on node3, counted by node3's agent (before the
   agents counted, a remote rank's SIGKILL was a crash), and the job ends as the uninterrupted
   one did, bit for bit.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.states import assert_same_state, load_final
from tests.slurm.cluster import SlurmCluster
from tests.slurm.jobs import TrainerJob, attempt_nodes, submit, write_trainer_job
from tests.slurm.node_loss import START_S, run_to_end

pytestmark = pytest.mark.slurm

FAULTS = "prep:*:5:1,sigstop:3:25:1,killagent:2:35:2,hostoom:3:40:3"


@pytest.fixture(scope="module")
def agents_job(slurm_cluster: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> TrainerJob:
    """The job of the module docstring, run to its end."""
    job = write_trainer_job(
        tmp_path_factory.mktemp("agents"),
        nnodes="2",
        hang_timeout="5s",
        env={
            "FAULT": FAULTS,
            "PREP_S": "node2:30,*:5",
            "OOM_LIMIT_BYTES": str(400 * 2**20),
            "STEP_SLEEP": "0.05",
            # from step 30 on, steps of 0.3 s: the agent's silence (3 s) is found long before
            # the end
            "TAIL_FROM": "30",
            "TAIL_SLEEP": "0.3",
        },
    )
    job_id = submit(slurm_cluster, job, "--nodes=3", "--nodelist=node1,node2,node3", "--no-kill")
    run_to_end(slurm_cluster, job, job_id, timeout=4 * START_S + 120)
    return job


def test_a_slow_data_preparation_on_another_node_is_no_hang(agents_job: TrainerJob) -> None:
    """While node2's local rank 0 prepares its data for 30 s (node1's is done after 5 s, its
    ranks wait in the barrier), nothing is declared: one slow phase, ended by the next step,
    that names rank 2 (node2's) working."""
    job = agents_job
    failures = job.named("failure_detected")
    assert failures and failures[0]["last_step"] >= 24, job.output_text()[-3000:]
    phases = [e for e in job.named("slow_phase") if e["attempt"] == 1]
    assert len(phases) == 1, phases
    phase = phases[0]
    assert phase["finished"] and phase["seconds"] >= 25, phase
    assert 2 in phase["ranks"] and "rank 2 is working" in phase["detail"], phase


def test_a_rank_stopped_on_another_node_is_named_with_its_stacks(agents_job: TrainerJob) -> None:
    """Rank 3, stopped on node2, is the hang's culprit (first of the silent ranks), said to be
    stopped; its stacks, where it stopped (taken by node2's agent), and the note that it was
    stopped are in the attempt's diagnostics."""
    hang = agents_job.named("failure_detected")[0]
    assert (hang["kind"], hang["ranks"][0], hang["nodes"]) == ("hang", 3, ["node2"]), hang
    assert "rank 3 was stopped by a signal" in hang["detail"], hang["detail"]
    diagnostics = Path(hang["diagnostics"])
    assert " in inject" in (diagnostics / "rank-00003.stacks").read_text(), hang
    assert (diagnostics / "rank-00003.stopped").is_file()


def test_a_killed_agent_loses_its_node_and_the_job_goes_on_without_it(
    agents_job: TrainerJob, reference: TrainerJob
) -> None:
    """node2's agent killed in attempt 2: a node failure naming node2, established by the
    agent's silence; the later attempts run on node1 and node3 and the job ends as the
    uninterrupted one did."""
    job = agents_job
    failures = job.named("failure_detected")
    kinds = [f["kind"] for f in failures]
    assert kinds == ["hang", "node_failure", "oom"], job.output_text()[-3000:]
    lost = failures[1]
    assert lost["attempt"] == 2 and lost["nodes"] == ["node2"], lost
    assert "node agent sent nothing" in lost["detail"], lost["detail"]
    assert attempt_nodes(job) == [
        ["node1", "node2"],
        ["node1", "node2"],
        ["node1", "node3"],
        ["node1", "node3"],
    ]
    assert job.named("job_succeeded")
    assert_same_state(load_final(reference.final), load_final(job.final))


def test_a_rank_the_oom_killer_killed_on_another_node_is_an_oom(agents_job: TrainerJob) -> None:
    """Rank 3, killed by the kernel's OOM killer on node3 in attempt 3, is an OOM named on
    node3: node3's agent counted the kill in its node's memory group and beat right after the
    rank's exit report."""
    oom = agents_job.named("failure_detected")[2]
    assert (oom["attempt"], oom["kind"], oom["ranks"][0]) == (3, "oom", 3), oom
    assert oom["nodes"] == ["node3"], oom
    assert "the OOM killer killed 1 of the job's processes on node3" in oom["detail"], oom
    assert "rank 3 killed by SIGKILL" in oom["detail"], oom
