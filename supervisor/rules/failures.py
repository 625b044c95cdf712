"""Failure classification: what ended an attempt, as one pure function.

The supervisor collects an :class:`Observation` (rank exits, the SDK's failure reports, the
launcher's status, silent ranks, the stop it asked for, ...) and :func:`classify` turns it
into one :class:`Failure`; both types live in :mod:`.observation`.
Nothing here reads a clock or a file.

Precedence, highest first (the first rule that matches wins):

1. ``stop_reason`` set -> ``preempted`` / ``timelimit`` / ``stopped``: the supervisor asked
   the ranks to stop, so whatever exits follow are the stop, not a failure.
2. ``lost_nodes`` non-empty -> ``node_failure``: the ranks on a lost node die with it, and
   the rest of the group fails as a consequence.
3. Out of memory -> ``oom``: a rank reported ``kind == "oom"``, a rank (or the launcher)
   exited with :data:`worker_sdk.contract.protocol.EXIT_OOM`, the cgroup counted new host OOM kills,
   or the ranks' stderr mentions ``OutOfMemoryError`` / ``CUDA out of memory``.
4. ``anomaly`` set -> ``nonfinite_loss`` / ``loss_spike`` / ``replicas_diverged``: the
   supervisor ended the attempt for what a rank reported (:mod:`.anomalies`), so the kills
   that follow are not a crash; ``resume_diverged`` set -> ``resume_diverged`` likewise (a
   resume that was not exact, under ``checkpoint.resume_check = "fail"``).
5. ``silent_ranks`` non-empty -> ``hang``: live ranks without progress past the hang
   timeout; the ranks that are furthest behind (lowest last step) come first.
6. Otherwise -> ``crash``: the first rank exit that is non-zero or by a signal is the
   culprit (a rank that exited 0 while others failed is not); with no failing rank exit
   at all, the launcher's status is what we know ("launcher exited with code 1").

What an exit status means (the POSIX shell's ``128 + N`` included) and how it reads in the
detail is in :mod:`.exit_status`.
"""

from __future__ import annotations

import dataclasses
import signal
from collections.abc import Collection, Iterable, Sequence
from typing import Final, TypeVar

from supervisor.rules import anomalies, attribution
from supervisor.rules.exit_status import (
    codes_and_signals,
    ending_text,
    is_failure,
    launcher_text,
    rank_text,
    signal_of,
)
from supervisor.rules.observation import (
    Failure,
    FailureKind,
    Observation,
    RankExit,
    RankReport,
    Signature,
    StopReason,
    signature,
)
from worker_sdk.contract.protocol import EXIT_OOM, EXIT_USAGE

__all__ = [
    "OOM_MARKERS",
    "USAGE_MARKER",
    "aborted_after_end",
    "classify",
    "deterministic_signature",
    "scripts_finished",
]

OOM_MARKERS: Final = ("OutOfMemoryError", "CUDA out of memory")
"""Substrings of a rank's stderr that mean it ran out of memory (fallback evidence)."""

USAGE_MARKER: Final = "worker_sdk.UsageError: "
"""How the line of a rank's stderr that says what the SDK refused begins."""

_T = TypeVar("_T")
_DETAIL_MESSAGE_CHARS: Final = 160
_USAGE_MESSAGE_CHARS: Final = 400  # it says what to change: keep all of it


def deterministic_signature(f: Failure) -> Signature:
    """The failure's :func:`~supervisor.rules.observation.signature`: equal for two failures that
    look like the same bug (its rank is the one :func:`deterministic_text` names)."""
    return signature(f.kind, f.ranks, f.last_step)


def classify(obs: Observation) -> Failure:
    """Classify what ended an attempt; see the module docstring for the precedence. Its
    ``nodes`` are those :func:`supervisor.rules.attribution.nodes_of` attributes it to."""
    failure = _classify(obs)
    nodes = attribution.nodes_of(failure, obs)
    return dataclasses.replace(failure, nodes=nodes, node_ranks=attribution.ranks_on(nodes, obs))


def _classify(obs: Observation) -> Failure:
    last_step = _overall_last_step(obs)
    if obs.stop_reason is not None:
        return _stop(obs, last_step)
    if obs.lost_nodes:
        return _node_failure(obs, last_step)
    oom = _oom(obs, last_step)
    if oom is not None:
        return oom
    if obs.anomaly is not None:  # the supervisor ended the attempt for it: its kills follow
        a = obs.anomaly
        return Failure(a.kind, (a.rank, *a.others), (), (), last_step, anomalies.describe(a))
    if (d := obs.resume_diverged) is not None:
        return Failure(FailureKind.RESUME_DIVERGED, (d.rank,), (), (), d.step, d.detail)
    if obs.silent_ranks:
        return _hang(obs, last_step)
    return _crash(obs, last_step)


def aborted_after_end(exits: Iterable[RankExit], ended: Collection[int]) -> tuple[RankExit, ...]:
    """The exits by a signal of ranks that had said their script ended (the SDK's last words,
    sent from ``atexit``): aborts in interpreter teardown, after the training was done."""
    return tuple(e for e in exits if e.rank in ended and signal_of(e) is not None)


def scripts_finished(
    world_size: int,
    ended: Collection[int],
    exits: Iterable[RankExit],
    reports: Sequence[RankReport],
) -> bool:
    """Whether an attempt counts as finished although a process ended badly.

    The rule: every rank said its script ended, no rank reported a failure, and every failing
    exit is a rank's abort after its script ended (:func:`aborted_after_end`). No final
    checkpoint is needed: a finished job is not resumed. A non-zero exit *code* after the end is
    the script's own verdict (``sys.exit(1)`` after a failed evaluation) and stays a failure.
    """
    if reports or len(set(ended)) < world_size:
        return False
    exits = tuple(exits)
    aborted = set(aborted_after_end(exits, ended))
    return all(e in aborted for e in exits if is_failure(e))


# ---------------------------------------------------------------- one rule each


def _stop(obs: Observation, last_step: int | None) -> Failure:
    reason = obs.stop_reason or StopReason.STOPPED
    return Failure(reason.kind, (), (), (), last_step, f"{reason.text}{_at_step(last_step)}")


def _node_failure(obs: Observation, last_step: int | None) -> Failure:
    lost = set(obs.lost_nodes)
    on_lost = [e for e in obs.exits if e.node in lost]
    ranks = list(_stable(_unique(e.rank for e in on_lost if e.rank is not None)))
    codes, sigs = codes_and_signals(on_lost)
    nodes = tuple(obs.lost_nodes)
    label = "node" if len(nodes) == 1 else "nodes"
    detail = f"{label} {', '.join(nodes)} lost"
    if ranks:
        detail += f" ({_ranks_text(ranks)})"
    detail += _at_step(last_step)
    how = [f"{node}: {said}" for node, said in obs.lost_nodes.items() if said]
    if how:
        detail += f" ({'; '.join(how)})"
    return Failure(FailureKind.NODE_FAILURE, _stable(ranks), codes, sigs, last_step, detail, nodes)


def _node_kills(obs: Observation) -> dict[str, tuple[int, str]]:
    """The other nodes' OOM kills to take: a host-wide count only for a node where a rank died
    of SIGKILL (it counts every process of that host)."""
    sigkilled = {
        obs.rank_nodes.get(e.rank)
        for e in obs.exits
        if e.rank is not None and signal_of(e) == signal.SIGKILL
    }
    return {
        node: (kills, why)
        for node, (kills, why) in obs.node_oom_kills.items()
        if kills > 0 and (not why or node in sigkilled)
    }


def _kills_text(obs: Observation, nodes: dict[str, tuple[int, str]]) -> str:
    """Who the OOM killer killed, the daemon's count first, then each other node's."""
    said = []
    if obs.oom_kills > 0:
        count, processes = obs.oom_kills, "process" if obs.oom_kills == 1 else "processes"
        if obs.oom_kills_host_wide:
            said.append(f"the host OOM killer killed {count} {processes}")
        else:
            said.append(f"the OOM killer killed {count} of the job's processes")
    for node, (count, why) in nodes.items():
        processes = "process" if count == 1 else "processes"
        if why:
            said.append(f"the host OOM killer of {node} killed {count} {processes}")
        else:
            said.append(f"the OOM killer killed {count} of the job's processes on {node}")
    return "; ".join(said)


def _oom(obs: Observation, last_step: int | None) -> Failure | None:
    oom_reports = [r for r in obs.reports if r.kind == "oom"]
    oom_exits = [e for e in obs.exits if e.exit_code == EXIT_OOM]
    nodes = _node_kills(obs)
    host_killed = [
        e
        for e in obs.exits
        if signal_of(e) == signal.SIGKILL
        and (obs.oom_kills > 0 or (e.rank is not None and obs.rank_nodes.get(e.rank) in nodes))
    ]
    in_stderr = any(marker in obs.stderr_tail for marker in OOM_MARKERS)
    launcher_oom = obs.launcher_exit == EXIT_OOM
    killed = obs.oom_kills > 0 or bool(nodes)
    if not (oom_reports or oom_exits or killed or in_stderr or launcher_oom):
        return None
    ranks = _unique(
        [r.rank for r in oom_reports]
        + [e.rank for e in oom_exits + host_killed if e.rank is not None]
    )
    implicated = _unique_exits(oom_exits + host_killed)
    codes, sigs = codes_and_signals(implicated)
    if oom_reports:
        first = oom_reports[0]
        where = _report_step(obs, first)
        detail = f"rank {first.rank} ran out of memory{_at_step(where)} ({_summary(first)})"
    elif oom_exits:
        first_exit = oom_exits[0]
        where = _step_of(obs, first_exit.rank, fallback=None)
        detail = (
            f"{rank_text(first_exit)} exited with code {EXIT_OOM} (out of memory){_at_step(where)}"
        )
    elif killed:
        detail = _kills_text(obs, nodes)
        if host_killed:
            detail += f" ({rank_text(host_killed[0])} killed by SIGKILL)"
        detail += _at_step(last_step)
        if obs.oom_kills > 0 and obs.oom_kills_host_wide:
            detail += f"; counted host-wide ({obs.oom_kills_host_wide})"
        for node, (_, why) in nodes.items():
            if why:
                detail += f"; counted host-wide on {node} ({why})"
    elif in_stderr:
        detail = f"out of memory reported in the ranks' stderr{_at_step(last_step)}"
    else:
        detail = f"launcher exited with code {EXIT_OOM} (out of memory){_at_step(last_step)}"
    return Failure(FailureKind.OOM, _stable(ranks), codes, sigs, last_step, detail)


def _hang(obs: Observation, last_step: int | None) -> Failure:
    ranks = sorted(set(obs.silent_ranks), key=lambda r: (obs.last_steps.get(r, -1), r))
    if obs.hang_culprits:
        waited = f" for {obs.hang_timeout_s:g}s" if obs.hang_timeout_s is not None else ""
        ranks = [*obs.hang_culprits, *(r for r in ranks if r not in obs.hang_culprits)]
        detail = f"{_ranks_text(ranks)} made no progress{waited}; {obs.hang_evidence}"
        return Failure(FailureKind.HANG, tuple(ranks), (), (), last_step, detail)
    behind = ranks[0]
    step = obs.last_steps.get(behind)
    waited = f" for {obs.hang_timeout_s:g}s" if obs.hang_timeout_s is not None else ""
    detail = f"{_ranks_text(ranks)} made no progress{waited}"
    where = f"at step {step}" if step is not None and step >= 0 else "before its first step"
    if len(ranks) == 1:
        detail += f" {where}"
    else:
        detail += f"; rank {behind} is furthest behind, {where}"
    return Failure(FailureKind.HANG, tuple(ranks), (), (), last_step, detail)


def _crash(obs: Observation, last_step: int | None) -> Failure:
    failing = [e for e in obs.exits if is_failure(e)]
    ranks = _unique(e.rank for e in failing if e.rank is not None)
    codes, sigs = codes_and_signals(failing)
    exceptions = {r.rank: r for r in obs.reports if r.kind != "oom"}
    unread = _unread_first(obs.exits)
    if failing and unread is not None and unread.rank is not None:
        # its parent reaped it before rvsup read its status: the first to end, it is the likelier
        # culprit than the peers whose failures followed
        ranks = _unique([unread.rank, *ranks])
        report = exceptions.get(unread.rank)
        if report is not None:
            how = f"raised{_at_step(_report_step(obs, report))} ({_summary(report)})"
        else:
            where = _step_of(obs, unread.rank, fallback=None)
            how = f"ended first, its exit status unknown (reaped before rvsup read it){_at_step(where)}"
        detail = (
            f"{rank_text(unread)} {how}; then {rank_text(failing[0])} {ending_text(failing[0])}"
        )
    elif failing:
        culprit = failing[0]
        report = exceptions.get(culprit.rank) if culprit.rank is not None else None
        where = _step_of(obs, culprit.rank, fallback=None)
        if report is not None:
            where = _report_step(obs, report)
        detail = f"{rank_text(culprit)} {ending_text(culprit)}{_at_step(where)}"
        if report is not None:
            detail += f" ({_summary(report)})"
        elif culprit.exit_code == EXIT_USAGE:
            detail += _usage_message(obs.stderr_tail)
    elif exceptions:
        report = next(iter(exceptions.values()))
        ranks = _unique([report.rank, *exceptions])
        where = _report_step(obs, report)
        detail = f"rank {report.rank} raised{_at_step(where)} ({_summary(report)})"
    else:
        detail = launcher_text(obs.launcher_exit) + _at_step(last_step)
    return Failure(FailureKind.CRASH, _stable(ranks), codes, sigs, last_step, detail)


# ---------------------------------------------------------------- helpers


def _overall_last_step(obs: Observation) -> int | None:
    """The highest step a rank finished: a rank's own failure report names the step it was
    running, so the one before it was finished."""
    steps = [s for s in obs.last_steps.values() if s >= 0]
    steps += [r.step - 1 for r in obs.reports if r.step >= 1]
    return max(steps) if steps else None


def _unread_first(exits: Sequence[RankExit]) -> RankExit | None:
    """The first exit seen, if it came before any failing one and its status could not be read."""
    for e in exits:
        if is_failure(e):
            return None
        if e.exit_code is None and e.rank is not None:
            return e
    return None


def _step_of(obs: Observation, rank: int | None, fallback: int | None) -> int | None:
    step = obs.last_steps.get(rank) if rank is not None else None
    return step if step is not None else fallback


def _report_step(obs: Observation, report: RankReport) -> int | None:
    """Where a rank failed by its own report (the step it was running: exact) or else by its
    last heartbeat (which may be several steps old)."""
    return report.step if report.step >= 0 else _step_of(obs, report.rank, fallback=None)


def _at_step(step: int | None) -> str:
    return f" at step {step}" if step is not None and step >= 0 else ""


def _summary(report: RankReport) -> str:
    message = " ".join(report.message.split())
    if len(message) > _DETAIL_MESSAGE_CHARS:
        message = message[: _DETAIL_MESSAGE_CHARS - 3] + "..."
    return f"{report.type}: {message}" if message else report.type


def _usage_message(stderr_tail: str) -> str:
    """``": <what the SDK said>"`` from the ranks' stderr, or nothing when it is not there."""
    for line in reversed(stderr_tail.splitlines()):
        if line.startswith(USAGE_MARKER):
            message = " ".join(line[len(USAGE_MARKER) :].split())
            if len(message) > _USAGE_MESSAGE_CHARS:
                message = message[: _USAGE_MESSAGE_CHARS - 3] + "..."
            return f": {message}"
    return ""


def _ranks_text(ranks: list[int]) -> str:
    label = "rank" if len(ranks) == 1 else "ranks"
    return f"{label} {', '.join(str(r) for r in ranks)}"


def _unique(items: Iterable[_T]) -> list[_T]:
    """The items without repeats, in first-seen order."""
    return list(dict.fromkeys(items))


def _stable(ranks: list[int]) -> tuple[int, ...]:
    """The first rank, then the others ascending: the order of collateral exits varies."""
    return tuple(ranks[:1]) + tuple(sorted(ranks[1:]))


def _unique_exits(exits: list[RankExit]) -> list[RankExit]:
    seen: dict[int, RankExit] = {}
    for e in exits:
        seen.setdefault(e.pid, e)
    return list(seen.values())
