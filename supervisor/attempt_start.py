"""What the next attempt starts from: the RVSUP_* environment of its ranks, where it resumes
(a memory snapshot on this node or the newest storage checkpoint), its launch plan, and the
history's ``attempt_started`` line. The :class:`~supervisor.supervisor.Supervisor` asks for it
before each attempt (:func:`prepare`), logs the line and runs the attempt; nothing here changes
the job's state.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from supervisor.config.model import JobConfig
from supervisor.process.launch_plan import LaunchPlan, rank_environment
from supervisor.process.tree import ProcessTree
from supervisor.ranks.checkpoints import CommitTracker
from supervisor.ranks.snapshots import MemoryTier
from supervisor.record import rundir
from supervisor.record.schema import AttemptStarted, ColdStart
from supervisor.rules.budget import Budget
from supervisor.rules.resume_source import ResumeChoice
from worker_sdk.contract import protocol as p

__all__ = ["AttemptStart", "LaunchSource", "SlurmIds", "prepare"]


@dataclass(frozen=True, slots=True)
class SlurmIds:
    """The allocation the daemon runs in, as the history records it."""

    job_id: str | None = None
    restart_count: int | None = None


class LaunchSource(Protocol):
    """Plans and process trees of attempts (:class:`supervisor.process.plan.Launches`)."""

    @property
    def multi_node(self) -> bool: ...
    def plan(self, attempt: int, rank_env: Mapping[str, str]) -> LaunchPlan: ...
    def tree(self, plan: LaunchPlan) -> ProcessTree: ...
    def warm_up(self, plan: LaunchPlan) -> None: ...
    def cold_starts(self) -> list[ColdStart]: ...
    def lose(self, nodes: Iterable[str]) -> tuple[int, int] | None: ...
    def usable_nodes(self) -> tuple[str, ...] | None: ...


@dataclass(frozen=True, slots=True)
class AttemptStart:
    """Attempt ``n``'s plan, the step it resumes at and its ``attempt_started`` line."""

    plan: LaunchPlan
    resume_step: int
    started: AttemptStarted


def prepare(
    cfg: JobConfig,
    n: int,
    *,
    endpoint: str,
    secret_file: Path,
    budget: Budget,
    tracker: CommitTracker,
    memory: MemoryTier,
    launches: LaunchSource,
    slurm_ids: SlurmIds,
) -> AttemptStart:
    """Plan attempt ``n`` from the budget (the last failure, a rollback's skip), the newest
    checkpoint and the memory tier's snapshots."""
    rank_env = rank_environment(
        cfg,
        attempt=n,
        endpoint=endpoint,
        secret_file=secret_file,
        diagnostics_dir=rundir.diagnostics_dir(cfg.job.run_dir, n),
        last_failure=budget.last_failure,
        oom_count=budget.oom_count,
        restarts_used=budget.restarts_used,
        resume_at=budget.skip_to,
        resume_before=budget.resume_before,
        checkpoint_dir_id=tracker.identity,
    )
    tracker.refresh()  # the ranks load the newest on disk: the history must say the same
    newest = tracker.newest_step
    before = budget.resume_before
    choice = memory.choose(newest, nnodes=1, resume_before=before)
    rank_env.update(memory.environment(choice))
    plan = launches.plan(n, rank_env)
    if plan.nnodes > 1:  # every node its own copy: this node's says (docs/memory-tier.md)
        joining = memory.joining(plan.alloc.nodes if plan.alloc is not None else ())
        choice = memory.choose(newest, nnodes=plan.nnodes, resume_before=before, joining=joining)
        plan = _memory_told(plan, memory, choice)
    elif memory.usable() and memory.gather_here():  # one node now, after several
        choice = memory.choose(newest, nnodes=1, resume_before=before)
        plan = _memory_told(plan, memory, choice)
    saved_by = tracker.newest_world_size
    world_size = plan.nnodes * plan.nproc_per_node
    resume_step = max(choice.resume_step, budget.skip_to or 0)
    if choice.source in ("memory", "replica"):
        assert choice.step is not None
        path = memory.path_of(choice.step, plan.nnodes)
        loaded_from: str | None = str(path)
        saved_by = memory.world_size_of(path) or world_size
    else:
        loaded_from = None if newest is None else str(tracker.path_of(newest))
    started = AttemptStarted(
        resume_step=resume_step,
        checkpoint=loaded_from,
        launcher=plan.argv,
        nnodes=plan.nnodes,
        nproc_per_node=plan.nproc_per_node,
        slurm_job_id=slurm_ids.job_id,
        restart_count=slurm_ids.restart_count,
        resharded_from=saved_by if saved_by not in (None, world_size) else None,
        source=choice.source,
    )
    return AttemptStart(plan, resume_step, started)


def _memory_told(plan: LaunchPlan, memory: MemoryTier, choice: ResumeChoice) -> LaunchPlan:
    """``plan`` with the ranks told ``choice`` (made once the plan's nodes were known)."""
    env = {k: v for k, v in plan.env.items() if k != p.ENV_MEMORY_RESUME}
    return dataclasses.replace(plan, env={**env, **memory.environment(choice)})
