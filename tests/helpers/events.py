"""Events as the supervisor logs them, for the tests of what is built from the history: one of
every kind (:data:`SAMPLES`), and factories of the common ones."""

from __future__ import annotations

from supervisor.record.schema import (
    AnomalyDetected,
    AttemptClosed,
    AttemptStarted,
    CheckpointCommitted,
    CheckpointFailed,
    CheckpointLoaded,
    CheckpointSkipped,
    ColdStart,
    Event,
    ExitAborted,
    ExitStalled,
    FailureDetected,
    HealthChecked,
    JobGaveUp,
    JobStarted,
    JobStopped,
    JobSucceeded,
    MemoryDirRefused,
    MemorySnapshots,
    MemoryTierOff,
    MessagesDropped,
    NodeExcluded,
    ProcessesEnded,
    ProcessesLeft,
    RequeueFailed,
    RestartScheduled,
    ResumeDiverged,
    ResumeUnverified,
    ResumeVerified,
    RolledBack,
    SlowPhase,
    SnapshotsSwept,
    StopRequested,
    StragglerDetected,
    SupervisorError,
    TimeLeftUnknown,
)
from supervisor.rules.observation import Failure

__all__ = ["SAMPLES", "attempt_started", "commit", "failure_event", "job_started"]


def job_started(slurm_job_id: str | None = None, restart_count: int | None = None) -> JobStarted:
    return JobStarted(
        config="job.toml",
        host="n1",
        pid=1,
        slurm_job_id=slurm_job_id,
        restart_count=restart_count,
        restarts_used=0,
    )


def attempt_started(resume: int = 0, slurm_job_id: str | None = None) -> AttemptStarted:
    return AttemptStarted(
        resume_step=resume,
        checkpoint=None if resume == 0 else f"ckpt/{resume - 1}",
        launcher=("torchrun",),
        nnodes=1,
        nproc_per_node=2,
        slurm_job_id=slurm_job_id,
        restart_count=None,
    )


def commit(step: int) -> CheckpointCommitted:
    return CheckpointCommitted(step=step, path=f"c/{step}", seconds=None, bytes=1, source="sdk")


def failure_event(f: Failure) -> FailureDetected:
    """The failure_detected the supervisor logs for ``f``."""
    return FailureDetected(
        kind=str(f.kind),
        ranks=f.ranks,
        exit_codes=f.exit_codes,
        signals=f.signals,
        last_step=f.last_step,
        detail=f.detail,
        diagnostics=None,
        detect_s=0.01,
        hang_timeout_s=None,
        noticed_at=None,
        nodes=f.nodes,
    )


# One instance of every event (fields chosen to exercise every field type).
SAMPLES: list[Event] = [
    JobStarted(
        config="/j.toml", host="n1", pid=7, slurm_job_id="12", restart_count=1, restarts_used=2
    ),
    AttemptStarted(
        resume_step=11,
        checkpoint="/c/step-10",
        launcher=("torchrun", "--nnodes=1"),
        nnodes=1,
        nproc_per_node=2,
        slurm_job_id=None,
        restart_count=None,
    ),
    CheckpointCommitted(step=10, path="/c/step-10", seconds=1.2346, bytes=4096, source="sdk"),
    CheckpointFailed(step=20, rank=1, reason="OSError: [Errno 28] No space left on device"),
    CheckpointSkipped(path="/c/step-20", reason="torn", rank=None),
    CheckpointLoaded(resume_step=11, checkpoint="/c/step-10", world_size=2),
    ResumeVerified(
        resume_step=11, first_step=11, last_step=15, values=10, ranks=2, exact=True, complete=True
    ),
    ResumeDiverged(
        resume_step=11,
        step=11,
        rank=1,
        what="loss",
        before=0.5,
        after=0.75,
        exact=True,
        likely="the state loaded or the first batch",
        hint="pass every stateful object to worker_sdk.resume()",
        policy="warn",
    ),
    ResumeUnverified(resume_step=11, reason="resharded from 4 ranks"),
    ColdStart(ranks=(1,), reason="import-time environment differs: PYTHONHASHSEED"),
    FailureDetected(
        kind="oom",
        ranks=(1, 0),
        exit_codes=(-9,),
        signals=("SIGKILL",),
        last_step=15,
        detail="rank 1 ran out of memory",
        diagnostics="/d",
        detect_s=0.0123,
        hang_timeout_s=None,
        noticed_at="2026-01-01T00:00:00Z",
        nodes=("n2",),
        node_ranks={"n2": (1, 3)},
    ),
    HealthChecked(
        node="n3",
        healthy=False,
        when="failure",
        failed={"command": "exited with status 1; output: ECC errors"},
        skipped={"gpus": "nvidia-smi is not installed on this node"},
        seconds=0.25,
    ),
    NodeExcluded(node="n2", reason="2 failures attributed to it", failures=2),
    AnomalyDetected(kind="loss_spike", step=80, onset=71, rank=1, value=40.5, baseline=2.25),
    RolledBack(
        from_step=80,
        to_step=59,
        resume_step=81,
        skipped_steps=21,
        onset=71,
        discarded=(79,),
        rollbacks_left=2,
        note="rollback 1 of 3",
    ),
    RestartScheduled(backoff_s=1.235, restarts_left=2, charged=True, deterministic=True, note="n"),
    StopRequested(reason="stopped", source="rvsup stop"),
    JobSucceeded(last_step=None),
    JobGaveUp(reason="budget spent"),
    JobStopped(reason="preempted", requeued=False, step=40, note=""),
    ExitStalled(ranks=(1,), waited_s=10.1),
    ExitAborted(rank=0, signal="SIGABRT", last_step=299, stderr_tail="Assertion failed"),
    SlowPhase(
        ranks=(0,),
        where="train.py:90 in main",
        seconds=8.25,
        finished=True,
        detail="rank 0 is working (train.py:90 in main); rank 1 waits for it",
        hint="wrap it in worker_sdk.phase()",
    ),
    StragglerDetected(
        rank=1,
        node="n2",
        slower=3.14159,
        lost_s=0.82345,
        lost_per_step_s=0.051234,
        step_s=0.05432,
        window_s=19.96,
        samples=20,
        exclude_node=True,
    ),
    ProcessesEnded(scope="attempt", mechanism="cgroup v2 (/cg)", ended=9, sigkilled=1, seconds=0.1),
    ProcessesLeft(scope="job", processes=("123 disk-sleep python train.py",)),
    MessagesDropped(counts={"replayed": 2}),
    RequeueFailed(job_id="12", error="no"),
    TimeLeftUnknown(error="squeue"),
    SupervisorError(error="KeyError: 3", traceback="Traceback (most recent call last): ..."),
    AttemptClosed(outcome="supervisor lost", last_seen="2026-01-01T00:00:09.000000Z", last_step=41),
    MemorySnapshots(count=40, blocked_s=0.0123, bytes=4096, interval=1, newest_step=41),
    MemoryTierOff(reason="OSError: [Errno 28] No space left on device"),
    MemoryDirRefused(
        path="/dev/shm/rvsup-1000-" + "0" * 32, reason="has mode 0777: group or others have access"
    ),
    SnapshotsSwept(paths=("/dev/shm/rvsup-1000-" + "1" * 32,)),
]
