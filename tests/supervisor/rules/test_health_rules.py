"""The health rules, from tables: a node's probe judged against what the job needs, a round's
silent nodes, the probe's JSON line read back, and which nodes are excluded."""

from __future__ import annotations

import json

import pytest

from supervisor.rules.health import (
    CommandResult,
    Needs,
    Probe,
    Verdict,
    judge,
    judge_round,
    node_faults,
    parse_probe,
    to_exclude,
)

GIB = 1 << 30
GOOD = Probe(
    node="n1",
    checkpoint_free=100 * GIB,
    shm_free=10 * GIB,
    memory_available=50 * GIB,
    gpus=8,
    command=CommandResult(exit_code=0, output="ok"),
)
NEEDS = Needs(checkpoint_free=5 * GIB, shm_free=2 * GIB, memory_free=GIB, gpus=8)


def _with(**changes: object) -> Probe:
    values = {name: getattr(GOOD, name) for name in Probe.__slots__}
    values.update(changes)
    return Probe(**values)


JUDGE = {
    "everything-fine": (GOOD, NEEDS, {}, {}),
    "checkpoint-dir-not-writable": (
        _with(checkpoint_error="Read-only file system (/ckpt)"),
        NEEDS,
        {"checkpoint_dir": "not writable: Read-only file system (/ckpt)"},
        {},
    ),
    "checkpoint-too-little-space": (
        _with(checkpoint_free=GIB),
        NEEDS,
        {"checkpoint_dir": "1.00 GiB free, 5.00 GiB needed"},
        {},
    ),
    "no-checkpoint-yet-writable-is-enough": (
        _with(checkpoint_free=0),
        Needs(checkpoint_free=0, memory_free=GIB),
        {},
        {},
    ),
    "shm-too-small": (
        _with(shm_free=GIB),
        NEEDS,
        {"shm": "1.00 GiB free in /dev/shm, 2.00 GiB needed"},
        {},
    ),
    "shm-not-needed-is-skipped-with-the-reason": (
        _with(shm_free=0),
        Needs(memory_free=GIB, why={"shm": "checkpoint.async is off"}),
        {},
        {"shm": "checkpoint.async is off"},
    ),
    "memory-short": (
        _with(memory_available=GIB // 2),
        NEEDS,
        {"memory": "0.50 GiB available, 1.00 GiB needed"},
        {},
    ),
    "memory-unreadable-is-skipped": (
        _with(memory_available=None),
        NEEDS,
        {},
        {"memory": "MemAvailable could not be read"},
    ),
    "a-gpu-missing": (
        _with(gpus=7),
        NEEDS,
        {"gpus": "7 GPUs listed by nvidia-smi, the job needs 8"},
        {},
    ),
    "no-nvidia-smi-is-skipped-cleanly": (
        _with(gpus=None, gpus_skipped="nvidia-smi is not installed on this node"),
        NEEDS,
        {},
        {"gpus": "nvidia-smi is not installed on this node"},
    ),
    "command-exit-1-with-its-output": (
        _with(command=CommandResult(exit_code=1, output="ERROR: ib0 down\n")),
        NEEDS,
        {"command": "exited with status 1; output: ERROR: ib0 down"},
        {},
    ),
    "command-killed-at-its-timeout": (
        _with(command=CommandResult(exit_code=-9, timed_out=True, output="checking...")),
        NEEDS,
        {"command": "did not finish within its timeout and was killed; output: checking..."},
        {},
    ),
    "command-killed-by-a-signal": (
        _with(command=CommandResult(exit_code=-11)),
        NEEDS,
        {"command": "killed by signal 11"},
        {},
    ),
    "command-not-found": (
        _with(command=CommandResult(exit_code=None, error="No such file or directory: 'nhc'")),
        NEEDS,
        {"command": "could not run: No such file or directory: 'nhc'"},
        {},
    ),
}


@pytest.mark.parametrize(("probe", "needs", "failed", "skipped"), JUDGE.values(), ids=list(JUDGE))
def test_judge(probe: Probe, needs: Needs, failed: dict[str, str], skipped: dict[str, str]) -> None:
    """Each check fails, passes or is skipped with its reason, as the module's rules say."""
    verdict = judge(probe, needs)
    assert (dict(verdict.failed), dict(verdict.skipped)) == (failed, skipped)
    assert verdict.healthy is (not failed)


def test_a_silent_node_is_unhealthy_only_when_another_reported() -> None:
    """A node with no report in a round where others reported is unhealthy (with srun's words);
    a round where no node reported says nothing about any node (skipped everywhere)."""
    some = judge_round(("n1", "n2"), [GOOD], NEEDS, "srun: error: task launch failed on n2")
    assert [v.node for v in some] == ["n1", "n2"]
    assert some[0].healthy
    assert some[1].failed == {
        "report": "the node sent no report: srun: error: task launch failed on n2"
    }
    none = judge_round(("n1", "n2"), [], NEEDS, "srun: Unable to create step")
    assert all(v.healthy for v in none)
    assert none[1].skipped == {"all": "the checks could not run: srun: Unable to create step"}


def test_parse_probe_reads_what_the_probe_prints_and_refuses_the_rest() -> None:
    """A probe line reads back into the same Probe; a line that is not one is None, and a
    value of the wrong type is 'not measured'."""
    line = json.dumps(
        {
            "node": "n1",
            "checkpoint_error": "",
            "checkpoint_free": 100 * GIB,
            "shm_free": 10 * GIB,
            "memory_available": 50 * GIB,
            "gpus": 8,
            "gpus_skipped": "",
            "command": {"exit_code": 0, "timed_out": False, "output": "ok"},
            "seconds": 0.0,
        }
    )
    assert parse_probe(line) == GOOD
    assert parse_probe("srun: warning") is None
    assert parse_probe('{"node": ""}') is None
    assert parse_probe("[1]") is None
    odd = parse_probe('{"node": "n3", "gpus": true, "memory_available": -1, "command": 3}')
    assert odd == Probe(node="n3")


EXCLUDE = {
    "exclusion-off-excludes-nothing": ({"n1": "memory"}, {"n2": 5}, (), 0, []),
    "unhealthy-at-once": (
        {"n1": "memory: 0.50 GiB available"},
        {},
        (),
        2,
        [("n1", "failed its health check: memory: 0.50 GiB available", 0)],
    ),
    "failures-reach-exclude-after": (
        {},
        {"n1": 1, "n2": 2, "n3": 3},
        (),
        2,
        [("n2", "2 failures attributed to it", 2), ("n3", "3 failures attributed to it", 3)],
    ),
    "exclude-after-1": ({}, {"n1": 1}, (), 1, [("n1", "1 failure attributed to it", 1)]),
    "already-excluded-never-twice": ({"n2": "gpus"}, {"n2": 4}, ("n2",), 2, []),
    "unhealthy-reason-wins-over-the-count": (
        {"n2": "command: exited with status 1"},
        {"n2": 2},
        (),
        2,
        [("n2", "failed its health check: command: exited with status 1", 2)],
    ),
}


@pytest.mark.parametrize(
    ("unhealthy", "failures", "excluded", "after", "expected"),
    EXCLUDE.values(),
    ids=list(EXCLUDE),
)
def test_to_exclude(
    unhealthy: dict[str, str],
    failures: dict[str, int],
    excluded: tuple[str, ...],
    after: int,
    expected: list[tuple[str, str, int]],
) -> None:
    """A failed health check excludes at once, exclude_after failures then, 0 never, each node
    once."""
    assert to_exclude(unhealthy, failures, excluded, after) == expected


def test_verdict_healthy_is_no_failed_check() -> None:
    """A verdict with only skipped checks is healthy."""
    assert Verdict("n1", {}, {"gpus": "no nvidia-smi"}).healthy
    assert not Verdict("n1", {"memory": "low"}, {}).healthy


FULL = {"checkpoint_dir": "0.00 GiB free, 5.00 GiB needed"}
FAULTS = {
    "one-node-s-own-failure": (
        [Verdict("n1", {"gpus": "7 GPUs"}, {}), Verdict("n2", {}, {})],
        {"n1": "gpus: 7 GPUs"},
    ),
    "failing-everywhere-is-shared": (
        [Verdict("n1", FULL, {}), Verdict("n2", FULL, {})],
        {},
    ),
    "shared-check-dropped-own-kept": (
        [Verdict("n1", {**FULL, "memory": "low"}, {}), Verdict("n2", FULL, {})],
        {"n1": "memory: low"},
    ),
    "one-node-round-storage-is-shared": ([Verdict("n1", FULL, {})], {}),
    "one-node-round-other-checks-are-the-node-s": (
        [Verdict("n1", {"command": "exited with status 1"}, {})],
        {"n1": "command: exited with status 1"},
    ),
}


@pytest.mark.parametrize(("verdicts", "faults"), FAULTS.values(), ids=list(FAULTS))
def test_node_faults(verdicts: list[Verdict], faults: dict[str, str]) -> None:
    """A check that failed on every node of a round of several (or the checkpoint directory in a
    round of one) is shared, not a node's fault; the rest are the node's, joined."""
    assert node_faults(verdicts) == faults
