"""classify(): each precedence rule, signals, shell-style 128+N codes and the wording of details."""

from __future__ import annotations

from dataclasses import dataclass, replace

import pytest

from supervisor.rules.failures import classify, deterministic_signature
from supervisor.rules.observation import (
    Failure,
    FailureKind,
    Observation,
    RankExit,
    RankReport,
    StopReason,
    signal_name,
)
from worker_sdk.contract.protocol import EXIT_OOM

K = FailureKind
OOM_REPORT = RankReport(
    1, "oom", "torch.OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB", 30
)
VALUE_ERROR = RankReport(1, "exception", "ValueError", "bad batch\n  shape (3,)", 30)


def sig(rank: int | None, signum: int, node: str | None = None, pid: int = 0) -> RankExit:
    return RankExit(rank, pid or 1000 + (rank or 0), None, signum, node)


def code(rank: int | None, status: int, node: str | None = None, pid: int = 0) -> RankExit:
    return RankExit(rank, pid or 1000 + (rank or 0), status, None, node)


@dataclass(frozen=True)
class Row:
    obs: Observation
    kind: FailureKind
    ranks: tuple[int, ...]
    detail: str
    exit_codes: tuple[int, ...] = ()
    signals: tuple[str, ...] = ()
    last_step: int | None = None
    nodes: tuple[str, ...] = ()


EVERYTHING_WRONG = Observation(
    exits=(sig(2, 9, "n2"), code(1, EXIT_OOM, "n1")),
    reports=(OOM_REPORT,),
    silent_ranks=(0,),
    hang_timeout_s=300,
    last_steps={0: 57, 1: 30, 2: 56},
    lost_nodes={"n2": ""},
    oom_kills=1,
    stderr_tail="torch.OutOfMemoryError: CUDA out of memory",
)

ROWS = {
    # ---- 1. a requested stop beats everything
    "preempted-beats-all": Row(
        Observation(
            exits=EVERYTHING_WRONG.exits,
            reports=EVERYTHING_WRONG.reports,
            silent_ranks=(0,),
            last_steps={0: 57, 1: 30, 2: 56},
            lost_nodes={"n2": ""},
            oom_kills=1,
            stop_reason=StopReason.PREEMPTED,
        ),
        K.PREEMPTED,
        (),
        "stopped on preemption at step 57",
        last_step=57,
    ),
    "timelimit": Row(
        Observation(stop_reason=StopReason.TIMELIMIT, last_steps={0: 99, 1: 99}),
        K.TIMELIMIT,
        (),
        "stopped before the time limit at step 99",
        last_step=99,
    ),
    "stopped-on-request": Row(
        Observation(stop_reason=StopReason.STOPPED, exits=(code(0, 0),), last_steps={0: 5}),
        K.STOPPED,
        (),
        "stopped on request at step 5",
        last_step=5,
    ),
    # ---- 2. a lost node beats OOM, hang and crash
    "lost-node-beats-oom": Row(
        EVERYTHING_WRONG,
        K.NODE_FAILURE,
        (2,),
        "node n2 lost (rank 2) at step 57",
        signals=("SIGKILL",),
        last_step=57,
        nodes=("n2",),
    ),
    "lost-node-says-how": Row(
        Observation(
            exits=(sig(1, 9, "n2"),),
            lost_nodes={"n2": "slurmd at 10.0.0.2:6818 refused the connection (no slurmd listens)"},
        ),
        K.NODE_FAILURE,
        (1,),
        "node n2 lost (rank 1) (n2: slurmd at 10.0.0.2:6818 refused the connection (no slurmd"
        " listens))",
        signals=("SIGKILL",),
        nodes=("n2",),
    ),
    "two-lost-nodes": Row(
        Observation(
            exits=(sig(3, 9, "n3"), code(0, 1, "n1"), sig(2, 15, "n3"), sig(1, 9, "n2")),
            lost_nodes={"n3": "", "n2": ""},
        ),
        K.NODE_FAILURE,
        (3, 1, 2),
        "nodes n3, n2 lost (ranks 3, 1, 2)",
        signals=("SIGKILL", "SIGTERM", "SIGKILL"),
        nodes=("n3", "n2"),
    ),
    # ---- 3. out of memory, from any of its four sources, beats hang and crash
    "oom-report-beats-hang": Row(
        Observation(
            exits=(code(1, 1),),
            reports=(OOM_REPORT,),
            silent_ranks=(0,),
            last_steps={0: 31, 1: 30},
        ),
        K.OOM,
        (1,),
        "rank 1 ran out of memory at step 30 "
        "(torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB)",
        last_step=31,
    ),
    "oom-exit-code": Row(
        Observation(exits=(code(0, 0), code(3, EXIT_OOM)), last_steps={3: 12}),
        K.OOM,
        (3,),
        f"rank 3 exited with code {EXIT_OOM} (out of memory) at step 12",
        exit_codes=(EXIT_OOM,),
        last_step=12,
    ),
    "oom-killer-of-the-jobs-process": Row(
        Observation(exits=(sig(1, 9), sig(0, 15)), oom_kills=1, last_steps={1: 7}),
        K.OOM,
        (1,),
        "the OOM killer killed 1 of the job's processes (rank 1 killed by SIGKILL) at step 7",
        signals=("SIGKILL",),
        last_step=7,
    ),
    # the job's count names no rank when the victim was a process of a rank (a DataLoader
    # worker, a snapshot writer) and the rank died of its loss
    "oom-killer-of-a-ranks-helper": Row(
        Observation(exits=(code(0, 1),), oom_kills=1, last_steps={0: 4}),
        K.OOM,
        (),
        "the OOM killer killed 1 of the job's processes at step 4",
        last_step=4,
    ),
    "host-oom-killer": Row(
        Observation(
            exits=(sig(1, 9), sig(0, 15)),
            oom_kills=1,
            oom_kills_host_wide="no memory cgroup",
            last_steps={1: 7},
        ),
        K.OOM,
        (1,),
        "the host OOM killer killed 1 process (rank 1 killed by SIGKILL) at step 7; counted"
        " host-wide (no memory cgroup)",
        signals=("SIGKILL",),
        last_step=7,
    ),
    "host-oom-killer-shell-137": Row(
        Observation(exits=(code(0, 137),), oom_kills=2, oom_kills_host_wide="no memory cgroup"),
        K.OOM,
        (0,),
        "the host OOM killer killed 2 processes (rank 0 killed by SIGKILL); counted host-wide"
        " (no memory cgroup)",
        exit_codes=(137,),
        signals=("SIGKILL",),
    ),
    # another node's agent counted the kill in its node's group: the rank it killed is named
    "oom-killer-on-another-node": Row(
        Observation(
            exits=(sig(3, 9, "node2"), sig(0, 15, "node1")),
            node_oom_kills={"node2": (1, "")},
            rank_nodes={0: "node1", 3: "node2"},
            last_steps={3: 40},
        ),
        K.OOM,
        (3,),
        "the OOM killer killed 1 of the job's processes on node2 (rank 3 killed by SIGKILL) at"
        " step 40",
        signals=("SIGKILL",),
        last_step=40,
        nodes=("node2",),
    ),
    "host-oom-killer-on-another-node": Row(
        Observation(
            exits=(sig(3, 9, "node2"),),
            node_oom_kills={"node2": (2, "no memory cgroup")},
            rank_nodes={3: "node2"},
            last_steps={3: 40},
        ),
        K.OOM,
        (3,),
        "the host OOM killer of node2 killed 2 processes (rank 3 killed by SIGKILL) at step 40;"
        " counted host-wide on node2 (no memory cgroup)",
        signals=("SIGKILL",),
        last_step=40,
        nodes=("node2",),
    ),
    # a host-wide count of a node where no rank died of SIGKILL is another job's kill
    "host-oom-killer-of-another-nodes-other-job": Row(
        Observation(
            exits=(sig(0, 9, "node1"),),
            node_oom_kills={"node2": (1, "no memory cgroup")},
            rank_nodes={0: "node1", 3: "node2"},
            last_steps={0: 40},
        ),
        K.CRASH,
        (0,),
        "rank 0 killed by SIGKILL at step 40",
        signals=("SIGKILL",),
        last_step=40,
        nodes=("node1",),
    ),
    "oom-in-stderr-beats-hang": Row(
        Observation(
            silent_ranks=(1,),
            stderr_tail="Traceback ...\ntorch.OutOfMemoryError: CUDA out of memory.",
            last_steps={0: 3},
        ),
        K.OOM,
        (),
        "out of memory reported in the ranks' stderr at step 3",
        last_step=3,
    ),
    "oom-launcher-exit": Row(
        Observation(launcher_exit=EXIT_OOM),
        K.OOM,
        (),
        f"launcher exited with code {EXIT_OOM} (out of memory)",
    ),
    # ---- 4. silent ranks: a hang beats a crash; the ranks furthest behind come first
    "hang-behind-first": Row(
        Observation(
            silent_ranks=(0, 3, 1), hang_timeout_s=300, last_steps={0: 50, 1: 41, 2: 50, 3: 50}
        ),
        K.HANG,
        (1, 0, 3),
        "ranks 1, 0, 3 made no progress for 300s; rank 1 is furthest behind, at step 41",
        last_step=50,
    ),
    "hang-culprit-from-stacks-first": Row(
        Observation(
            silent_ranks=(0, 1),
            hang_timeout_s=5,
            last_steps={0: 50, 1: 50},
            hang_culprits=(1,),
            hang_evidence="rank 1 is not in a collective (train.py:42 in inject); rank 0 waits "
            "in all_reduce",
        ),
        K.HANG,
        (1, 0),
        "ranks 1, 0 made no progress for 5s; rank 1 is not in a collective (train.py:42 in "
        "inject); rank 0 waits in all_reduce",
        last_step=50,
    ),
    "hang-beats-crash": Row(
        Observation(exits=(code(0, 1),), silent_ranks=(1,), hang_timeout_s=12.5, last_steps={1: 9}),
        K.HANG,
        (1,),
        "rank 1 made no progress for 12.5s at step 9",
        last_step=9,
    ),
    "hang-before-first-step": Row(
        Observation(silent_ranks=(0,), hang_timeout_s=600),
        K.HANG,
        (0,),
        "rank 0 made no progress for 600s before its first step",
    ),
    # ---- 5. crash: the first failing exit is the culprit
    "crash-sigkill": Row(
        Observation(exits=(sig(1, 9),), last_steps={0: 57, 1: 57}),
        K.CRASH,
        (1,),
        "rank 1 killed by SIGKILL at step 57",
        signals=("SIGKILL",),
        last_step=57,
    ),
    "crash-status-unread-first": Row(
        Observation(
            exits=(RankExit(1, 1001, None, None, None), code(0, 1)),
            reports=(RankReport(0, "exception", "DistBackendError", "Connection reset", 57),),
            last_steps={0: 57, 1: 57},
        ),
        K.CRASH,
        (1, 0),
        "rank 1 ended first, its exit status unknown (reaped before rvsup read it) at step 57; "
        "then rank 0 exited with code 1",
        exit_codes=(1,),
        last_step=57,
    ),
    "crash-status-unread-after-a-failure": Row(
        Observation(exits=(sig(1, 9), RankExit(0, 1000, None, None, None)), last_steps={1: 57}),
        K.CRASH,
        (1,),
        "rank 1 killed by SIGKILL at step 57",
        signals=("SIGKILL",),
        last_step=57,
    ),
    "crash-status-unread-of-a-rank-that-raised": Row(
        Observation(
            exits=(RankExit(1, 1001, None, None, None), code(0, 1)),
            reports=(RankReport(1, "exception", "ValueError", "bad", 5),),
            last_steps={0: 5, 1: 5},
        ),
        K.CRASH,
        (1, 0),
        "rank 1 raised at step 5 (ValueError: bad); then rank 0 exited with code 1",
        exit_codes=(1,),
        last_step=5,
    ),
    "crash-shell-128-plus-n": Row(
        Observation(exits=(code(1, 137),), last_steps={1: 57}),
        K.CRASH,
        (1,),
        "rank 1 killed by SIGKILL (exit code 137) at step 57",
        exit_codes=(137,),
        signals=("SIGKILL",),
        last_step=57,
    ),
    "crash-sigsegv": Row(
        Observation(exits=(sig(0, 11),)),
        K.CRASH,
        (0,),
        "rank 0 killed by SIGSEGV",
        signals=("SIGSEGV",),
    ),
    "crash-exit-zero-ranks-ignored": Row(
        Observation(exits=(code(0, 0), code(2, 0), code(1, 1)), last_steps={0: 99, 1: 98}),
        K.CRASH,
        (1,),
        "rank 1 exited with code 1 at step 98",
        exit_codes=(1,),
        last_step=99,
    ),
    "crash-collateral-ranks-sorted": Row(
        Observation(exits=(code(2, 1), sig(1, 15), sig(0, 15)), last_steps={2: 4}),
        K.CRASH,
        (2, 0, 1),
        "rank 2 exited with code 1 at step 4",
        exit_codes=(1,),
        signals=("SIGTERM", "SIGTERM"),
        last_step=4,
    ),
    "crash-with-exception-report": Row(
        Observation(exits=(code(1, 1),), reports=(VALUE_ERROR,), last_steps={1: 30}),
        K.CRASH,
        (1,),
        "rank 1 exited with code 1 at step 30 (ValueError: bad batch shape (3,))",
        exit_codes=(1,),
        last_step=30,
    ),
    "crash-report-without-exit": Row(
        Observation(reports=(VALUE_ERROR,)),
        K.CRASH,
        (1,),
        "rank 1 raised at step 30 (ValueError: bad batch shape (3,))",
        last_step=29,  # it raised while running step 30: step 29 is the last it finished
    ),
    "crash-rank-never-said-hello": Row(
        Observation(exits=(code(None, 1, pid=4242),)),
        K.CRASH,
        (),
        "pid 4242 (rank unknown) exited with code 1",
        exit_codes=(1,),
    ),
    "crash-sync-timeout-code": Row(
        Observation(exits=(code(0, 88),)),
        K.CRASH,
        (0,),
        "rank 0 exited with code 88 (a coordinated save timed out)",
        exit_codes=(88,),
    ),
    "sigkill-without-host-oom-is-crash": Row(
        Observation(exits=(sig(0, 9),), oom_kills=0),
        K.CRASH,
        (0,),
        "rank 0 killed by SIGKILL",
        signals=("SIGKILL",),
    ),
    # ---- nothing but the launcher
    "empty-observation": Row(
        Observation(), K.CRASH, (), "launcher exited without any rank reporting a failure"
    ),
    "launcher-exit-code": Row(
        Observation(exits=(code(0, 0),), launcher_exit=1),
        K.CRASH,
        (),
        "launcher exited with code 1",
    ),
    "launcher-negative-signal": Row(
        Observation(launcher_exit=-9), K.CRASH, (), "launcher killed by SIGKILL"
    ),
    "launcher-shell-143": Row(
        Observation(launcher_exit=143), K.CRASH, (), "launcher killed by SIGTERM"
    ),
}


@pytest.mark.parametrize("row", list(ROWS.values()), ids=list(ROWS))
def test_classify(row: Row) -> None:
    """classify() picks the kind by precedence and reports ranks, codes, signals, step, detail
    (the ranks on its nodes are test_attribution's)."""
    assert replace(classify(row.obs), node_ranks={}) == Failure(
        kind=row.kind,
        ranks=row.ranks,
        exit_codes=row.exit_codes,
        signals=row.signals,
        last_step=row.last_step,
        detail=row.detail,
        nodes=row.nodes,
    )


def test_empty_observation_detail_names_the_launcher() -> None:
    """With nothing observed, the failure is a crash whose detail says the launcher exited."""
    failure = classify(Observation())
    assert failure.kind is FailureKind.CRASH
    assert failure.detail.startswith("launcher exited")


@pytest.mark.parametrize(
    ("exits", "report", "expected"),
    [
        ((code(1, 1),), VALUE_ERROR, "rank 1 exited with code 1 at step 30 (ValueError"),
        ((), VALUE_ERROR, "rank 1 raised at step 30 (ValueError"),
        ((), OOM_REPORT, "rank 1 ran out of memory at step 30"),
        ((sig(1, 9),), None, "rank 1 killed by SIGKILL at step 27"),
    ],
)
def test_detail_takes_the_step_from_the_rank_s_own_report(
    exits: tuple[RankExit, ...], report: RankReport | None, expected: str
) -> None:
    """Heartbeats are rate-limited, so the last one may be steps behind: a rank's own report
    says exactly where it failed and wins; only without one does the heartbeat's step show."""
    obs = Observation(
        exits=exits, reports=() if report is None else (report,), last_steps={1: 27, 0: 27}
    )
    assert classify(obs).detail.startswith(expected), classify(obs).detail


def test_long_report_message_is_shortened() -> None:
    """A huge exception message does not flood the one-sentence detail."""
    report = RankReport(0, "exception", "RuntimeError", "x" * 10_000, 1)
    detail = classify(Observation(reports=(report,))).detail
    assert len(detail) < 250
    assert detail.endswith("...)")


@pytest.mark.parametrize(
    ("signum", "name"),
    [(9, "SIGKILL"), (15, "SIGTERM"), (6, "SIGABRT"), (11, "SIGSEGV"), (200, "SIG200")],
)
def test_signal_name(signum: int, name: str) -> None:
    """Signal numbers become names; an unknown number still gets a readable one."""
    assert signal_name(signum) == name


def test_failure_kind_values_are_the_event_strings() -> None:
    """The enum's values are the documented `kind` strings, and str() gives the value."""
    assert [str(k) for k in FailureKind] == [
        "crash",
        "oom",
        "hang",
        "preempted",
        "timelimit",
        "node_failure",
        "stopped",
        "nonfinite_loss",
        "loss_spike",
        "replicas_diverged",
        "resume_diverged",
    ]
    assert FailureKind("oom") is FailureKind.OOM


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        pytest.param(
            Observation(exits=(code(1, 1), sig(0, 15)), last_steps={0: 30, 1: 30}),
            Observation(exits=(code(1, 1), sig(0, 15)), last_steps={0: 30, 1: 30}),
            True,
            id="same-crash",
        ),
        pytest.param(
            Observation(exits=(code(2, 1), sig(0, 15), sig(1, 15)), last_steps={2: 30}),
            Observation(exits=(code(2, 1), sig(1, 15), sig(0, 15)), last_steps={2: 30}),
            True,
            id="collateral-order-differs",
        ),
        pytest.param(  # rank 0 died of the broken connection in time to be seen, or not
            Observation(exits=(code(1, 1), sig(0, 15)), last_steps={0: 2, 1: 2}),
            Observation(exits=(code(1, 1),), last_steps={0: 2, 1: 2}),
            True,
            id="collateral-seen-or-not",
        ),
        pytest.param(
            Observation(exits=(code(1, 1),), last_steps={1: 30}),
            Observation(exits=(code(1, 1),), last_steps={1: 31}),
            False,
            id="different-step",
        ),
        pytest.param(
            Observation(exits=(code(1, 1),), last_steps={1: 30}),
            Observation(exits=(code(0, 1),), last_steps={0: 30}),
            False,
            id="different-rank",
        ),
        pytest.param(
            Observation(exits=(code(1, 1),), last_steps={1: 30}),
            Observation(exits=(code(1, EXIT_OOM),), last_steps={1: 30}),
            False,
            id="different-kind",
        ),
    ],
)
def test_deterministic_signature(a: Observation, b: Observation, same: bool) -> None:
    """Two failures share a signature exactly when kind, first rank and last step agree."""
    assert (deterministic_signature(classify(a)) == deterministic_signature(classify(b))) is same


def test_deterministic_signature_shape() -> None:
    """The signature is (kind string, first rank, last step)."""
    failure = classify(Observation(exits=(sig(1, 9),), last_steps={1: 57}))
    assert deterministic_signature(failure) == ("crash", (1,), 57)


def test_a_usage_errors_traceback_carries_the_marker_the_failure_is_read_by() -> None:
    """The last line of the traceback a rank prints for worker_sdk.UsageError starts with
    USAGE_MARKER, wherever the class is defined: moving it must not hide the SDK's message."""
    import traceback

    from supervisor.rules.failures import USAGE_MARKER
    from worker_sdk.contract.protocol import UsageError

    try:
        raise UsageError("call init_process_group() first")
    except UsageError as exc:
        printed = "".join(traceback.format_exception(exc))
    assert printed.splitlines()[-1] == USAGE_MARKER + "call init_process_group() first"
