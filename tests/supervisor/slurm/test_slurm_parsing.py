"""supervisor.slurm without a cluster: Slurm's notations (host lists, per-node counts, squeue %L,
scontrol records), the allocation read from an environment, srun's argv, and retries of failing
commands (a fake squeue)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from supervisor.slurm import commands as slurm
from supervisor.slurm import srun
from supervisor.slurm import text as slurm_text


@pytest.mark.parametrize(
    ("nodelist", "expected"),
    [
        ("node1", ("node1",)),
        ("node[1-3]", ("node1", "node2", "node3")),
        ("node[1-3,5],gpu07", ("node1", "node2", "node3", "node5", "gpu07")),
        ("n[08-11]", ("n08", "n09", "n10", "n11")),
        ("n[098-100]", ("n098", "n099", "n100")),
        ("a[1-2],b", ("a1", "a2", "b")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
        ("rack[1-2]-gpu[01,3]", ("rack1-gpu01", "rack1-gpu3", "rack2-gpu01", "rack2-gpu3")),
        ("node[7]", ("node7",)),
        ("node[3-3],x.y-z", ("node3", "x.y-z")),
        (" node[1-2] ", ("node1", "node2")),
    ],
)
def test_expand_hostlist(nodelist: str, expected: tuple[str, ...]) -> None:
    """Slurm host lists expand in order, with zero padding and several bracket groups."""
    assert slurm_text.expand_hostlist(nodelist) == expected


@pytest.mark.parametrize(
    "nodelist",
    ["node[1-3", "node1-3]", "node[a-b]", "node[3-1]", "node[1,,2]", "a,,b", "", "x[1-2]]"],
)
def test_expand_hostlist_rejects_malformed(nodelist: str) -> None:
    """Malformed host lists raise ValueError instead of producing wrong names."""
    with pytest.raises(ValueError, match=r"host|range|bracket"):
        slurm_text.expand_hostlist(nodelist)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("UNLIMITED", None),
        ("NOT_SET", None),
        ("INVALID", None),
        ("1-02:03:04", 93784.0),
        ("12-00:00:00", 1036800.0),
        ("02:03:04", 7384.0),
        ("2:03:04", 7384.0),
        ("03:04", 184.0),
        ("4:59", 299.0),
        ("0:04", 4.0),
        ("0:00", 0.0),
        ("  5:00\n", 300.0),
        ("1-02:03", None),
        ("", None),
        ("N/A", None),
        ("5", None),
    ],
)
def test_parse_time_left(text: str, expected: float | None) -> None:
    """squeue %L text becomes seconds; no limit, an invalid one or garbage become None."""
    assert slurm_text.parse_time_left(text) == expected


def _env(**values: str) -> dict[str, str]:
    # a node list scontrol cannot expand without a cluster is expanded by the Python parser
    return {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[1-2]", **values}


def test_detect_outside_slurm_is_none() -> None:
    """Without SLURM_JOB_ID there is no allocation."""
    assert slurm.detect({"SLURM_NODELIST": "node1"}) is None


@pytest.mark.parametrize(
    ("env", "field", "expected"),
    [
        (_env(), "nodes", ("node1", "node2")),
        (_env(SLURMD_NODENAME="node2"), "this_node", "node2"),
        (_env(), "restart_count", 0),
        (_env(SLURM_RESTART_COUNT="3"), "restart_count", 3),
        (_env(SLURM_GPUS_ON_NODE="8", SLURM_GPUS_PER_NODE="4"), "gpus_per_node", 8),
        (_env(SLURM_GPUS_PER_NODE="a100:4"), "gpus_per_node", 4),
        (_env(SLURM_GPUS_PER_NODE="a100:2,v100:1"), "gpus_per_node", 3),
        (_env(), "gpus_per_node", None),
        (_env(SLURM_CPUS_ON_NODE="16"), "cpus_on_node", 16),
    ],
)
def test_detect_reads_environment(env: dict[str, str], field: str, expected: object) -> None:
    """Each Allocation field comes from the Slurm variable that describes it."""
    alloc = slurm.detect(env)
    assert alloc is not None
    assert getattr(alloc, field) == expected


def test_srun_argv_one_task_per_node() -> None:
    """The step covers every node with one task each, and ends with the inner command."""
    alloc = slurm.detect(_env(SLURM_CPUS_ON_NODE="16", SLURM_GPUS_ON_NODE="8"))
    assert alloc is not None
    argv = srun.srun_argv(alloc, ["torchrun", "--nnodes=2", "train.py"], job_name="rvsup-x")
    assert argv[0] == "srun"
    assert argv[argv.index("--") + 1 :] == ["torchrun", "--nnodes=2", "train.py"]
    flags = argv[1 : argv.index("--")]
    for flag in (
        "--nodes=2",
        "--ntasks=2",
        "--ntasks-per-node=1",
        "--nodelist=node1,node2",
        "--cpus-per-task=16",
        "--gpus-per-node=8",
        "--overlap",
        "--kill-on-bad-exit=1",
        "--export=ALL",
        "--job-name=rvsup-x",
    ):
        assert flag in flags


def test_srun_argv_runs_on_the_nodes_left() -> None:
    """After a node failure the step is pinned to the nodes rvsup restarts on."""
    alloc = slurm.detect(_env(SLURM_JOB_NODELIST="node[1-3]"))
    assert alloc is not None
    left = dataclasses.replace(alloc, nodes=("node1", "node3"))
    flags = srun.srun_argv(left, ["true"], job_name="x")
    assert "--nodes=2" in flags and "--nodelist=node1,node3" in flags


def test_srun_argv_leaves_out_unknown_resources() -> None:
    """Without CPU or GPU counts in the environment srun picks its defaults."""
    alloc = slurm.detect(_env())
    assert alloc is not None
    argv = srun.srun_argv(alloc, ["true"], job_name="x")
    assert not [flag for flag in argv if flag.startswith(("--cpus-per-task", "--gpus-per-node"))]


RECORD = (
    "JobId=7 JobName=my job UserId=root(0) GroupId=root(0) Priority=1 JobState=RUNNING "
    "Reason=None Requeue=1 Restarts=2 BatchFlag=1 TimeLimit=00:05:00 "
    "EndTime=2026-11-22T19:20:00 NodeList=node[1-2] NumNodes=2 TRES=cpu=2,node=2,billing=2 "
    "Socks/Node=* NtasksPerN:B:S:C=0:0:*:* Command=/tmp/a b.sh Comment=x"
)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        ("JobId", "7"),
        ("JobName", "my job"),
        ("JobState", "RUNNING"),
        ("Requeue", "1"),
        ("Restarts", "2"),
        ("TimeLimit", "00:05:00"),
        ("EndTime", "2026-11-22T19:20:00"),
        ("TRES", "cpu=2,node=2,billing=2"),
        ("Socks/Node", "*"),
        ("NtasksPerN:B:S:C", "0:0:*:*"),
        ("Command", "/tmp/a b.sh"),
        ("Comment", "x"),
    ],
)
def test_parse_job_record(key: str, expected: str) -> None:
    """Each Key=Value of scontrol's one-line record is read, spaces in values included."""
    assert slurm_text.parse_job_record(RECORD, "7")[key] == expected


def test_parse_job_record_picks_the_asked_job() -> None:
    """Of several records (an array job) the one of the asked id is used."""
    text = "JobId=8 ArrayTaskId=1 JobState=PENDING\nJobId=9 ArrayTaskId=2 JobState=RUNNING\n"
    assert slurm_text.parse_job_record(text, "9")["JobState"] == "RUNNING"
    assert slurm_text.parse_job_record(text, "10")["JobState"] == "PENDING"
    assert slurm_text.parse_job_record("", "10") == {}


FAKE_SQUEUE = """#!/bin/bash
# answers from $FAKE_DIR/answers, one line per call: transient, permanent, hang or the stdout
echo "$*" >> "$FAKE_DIR/calls"
answer=$(sed -n "$(wc -l < "$FAKE_DIR/calls")p" "$FAKE_DIR/answers")
case $answer in
  transient) echo "squeue: error: Socket timed out on send/recv operation" >&2; exit 1 ;;
  permanent) echo "slurm_load_jobs error: Invalid job id specified" >&2; exit 1 ;;
  hang) exec sleep 5 ;;
  *) echo "$answer" ;;
esac
"""


@pytest.mark.parametrize(
    ("answers", "expected", "calls"),
    [
        (["4:59"], 299.0, 1),
        (["transient", "transient", "1:00"], 60.0, 3),
        (["hang", "2:00"], 120.0, 2),
        (["transient"] * 4, "transient", 4),
        (["permanent", "1:00"], "permanent", 1),
    ],
)
def test_transient_failures_are_retried(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    answers: list[str],
    expected: float | str,
    calls: int,
) -> None:
    """Transient failures and timeouts are retried a bounded number of times, others not."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "squeue").write_text(FAKE_SQUEUE)
    (bin_dir / "squeue").chmod(0o755)
    (tmp_path / "answers").write_text("\n".join(answers) + "\n")
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setattr(slurm, "RETRY_WAIT_S", 0.01)
    monkeypatch.setattr(slurm, "COMMAND_TIMEOUT_S", 0.5)
    if isinstance(expected, float):
        assert slurm.time_left_s("7") == expected
    else:
        with pytest.raises(slurm.SlurmError) as raised:
            slurm.time_left_s("7")
        assert raised.value.transient is (expected == "transient")
        assert raised.value.stderr
    assert (tmp_path / "calls").read_text().splitlines() == ["-h -j 7 -o %L"] * calls


FAKE_SCONTROL = """#!/bin/sh
# requeue: ended by SIGTERM before it exits (Slurm ending the job it runs in); show job: the
# restart count in $FAKE_DIR/restarts
if [ "$1" = requeue ]; then kill -TERM $$; sleep 5; fi
echo "JobId=$4 JobState=REQUEUED Requeue=1 Restarts=$(cat "$FAKE_DIR/restarts")"
"""


@pytest.mark.parametrize(("restarts", "accepted"), [("2", True), ("1", False)])
def test_a_requeue_ended_by_sigterm_is_accepted_when_slurm_counts_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, restarts: str, accepted: bool
) -> None:
    """``scontrol requeue`` run inside the job may be ended by the SIGTERM Slurm sends every
    process of the job once it accepted the requeue: accepted when ``scontrol show job``
    counts more restarts than this allocation's SLURM_RESTART_COUNT (1), else the error
    stands, saying the signal."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "scontrol").write_text(FAKE_SCONTROL)
    (bin_dir / "scontrol").chmod(0o755)
    (tmp_path / "restarts").write_text(restarts)
    monkeypatch.setenv("FAKE_DIR", str(tmp_path))
    monkeypatch.setenv("SLURM_RESTART_COUNT", "1")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    if accepted:
        slurm.requeue("9")
    else:
        with pytest.raises(slurm.SlurmError, match="killed by signal 15") as raised:
            slurm.requeue("9")
        assert raised.value.killed_by == 15
