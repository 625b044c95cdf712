"""Node health and exclusion, as pure rules: what a node's measurements say, and which nodes
the job stops using.

A health round runs :mod:`supervisor.process.health_probe` once on every node; each prints one
JSON line of what it measured (:class:`Probe`). :func:`judge` compares a probe with what the job
needs (:class:`Needs`): every built-in check fails, passes or is skipped with a reason, and a
``command`` fails on any exit status but 0, on its timeout, or when it could not be started.
:func:`judge_round` adds the nodes that sent no report: unhealthy when some other node did
report (that node's launch failed), skipped everywhere when none did (the round itself could not
run: that says nothing about any node).

A failed check is a node's fault (:func:`node_faults`) unless it failed on every node of a round
of several nodes: then the problem is shared (a full file system, a misconfigured command) and
excluding every node would only stop the job. In a round of one node, a full or read-only
checkpoint directory is taken for shared storage too; its other checks are the node's.

Exclusion (:func:`to_exclude`): a node that failed a health check is excluded at once; a node
with ``exclude_after`` failures attributed to it (``failure_detected.nodes``, counted by
:func:`supervisor.rules.budget.fold`) is excluded then; ``exclude_after = 0`` excludes nothing.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "CommandResult",
    "Needs",
    "Probe",
    "Verdict",
    "judge",
    "judge_round",
    "node_faults",
    "parse_probe",
    "to_exclude",
]

_GIB = 1 << 30


@dataclass(frozen=True, slots=True)
class CommandResult:
    """How the configured ``command`` ended on a node."""

    exit_code: int | None
    """Its exit status; negative: killed by that signal; None: it did not end by itself."""
    timed_out: bool = False
    output: str = ""
    """The end of its stdout and stderr together."""
    error: str = ""
    """Why it could not be started (not found, not executable); "" when it ran."""


@dataclass(frozen=True, slots=True)
class Probe:
    """What one node measured (the probe's JSON line; a None is "could not be measured")."""

    node: str
    checkpoint_error: str = ""
    """Why the checkpoint directory is not writable; "" when a test file could be written."""
    checkpoint_free: int | None = None
    shm_free: int | None = None
    memory_available: int | None = None
    gpus: int | None = None
    """GPUs ``nvidia-smi -L`` listed; None when it could not be asked (``gpus_skipped``)."""
    gpus_skipped: str = ""
    command: CommandResult | None = None
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class Needs:
    """What every node must offer; None: that check is skipped (``why`` says why)."""

    checkpoint_free: int = 0
    shm_free: int | None = None
    memory_free: int = 0
    gpus: int | None = None
    why: Mapping[str, str] = field(default_factory=dict)
    """A skipped check's reason, by check name."""


@dataclass(frozen=True, slots=True)
class Verdict:
    """One node's result: its failed checks and its skipped ones, each with why."""

    node: str
    failed: Mapping[str, str]
    skipped: Mapping[str, str]
    seconds: float = 0.0

    @property
    def healthy(self) -> bool:
        return not self.failed


def parse_probe(line: str) -> Probe | None:
    """A probe's JSON line as a :class:`Probe`; None for a line that is not one."""
    try:
        data = json.loads(line)
    except ValueError:
        return None
    if not isinstance(data, dict) or not isinstance(data.get("node"), str) or not data["node"]:
        return None
    command = data.get("command")
    result = None
    if isinstance(command, dict):
        code = command.get("exit_code")
        result = CommandResult(
            exit_code=code if isinstance(code, int) and not isinstance(code, bool) else None,
            timed_out=command.get("timed_out") is True,
            output=_text(command.get("output")),
            error=_text(command.get("error")),
        )
    seconds = data.get("seconds")
    return Probe(
        node=data["node"],
        checkpoint_error=_text(data.get("checkpoint_error")),
        checkpoint_free=_count(data.get("checkpoint_free")),
        shm_free=_count(data.get("shm_free")),
        memory_available=_count(data.get("memory_available")),
        gpus=_count(data.get("gpus")),
        gpus_skipped=_text(data.get("gpus_skipped")),
        command=result,
        seconds=float(seconds) if isinstance(seconds, int | float) else 0.0,
    )


def judge(probe: Probe, needs: Needs) -> Verdict:
    """Which of ``probe``'s checks failed and which were skipped (module docstring)."""
    failed: dict[str, str] = {}
    skipped: dict[str, str] = dict(needs.why)
    if probe.checkpoint_error:
        failed["checkpoint_dir"] = f"not writable: {probe.checkpoint_error}"
    elif _short(probe.checkpoint_free, needs.checkpoint_free):
        failed["checkpoint_dir"] = _too_little("free", probe.checkpoint_free, needs.checkpoint_free)
    if needs.shm_free is not None:
        if probe.shm_free is None:
            skipped["shm"] = "/dev/shm could not be measured"
        elif _short(probe.shm_free, needs.shm_free):
            failed["shm"] = _too_little("free in /dev/shm", probe.shm_free, needs.shm_free)
    if probe.memory_available is None:
        skipped["memory"] = "MemAvailable could not be read"
    elif _short(probe.memory_available, needs.memory_free):
        failed["memory"] = _too_little("available", probe.memory_available, needs.memory_free)
    if needs.gpus is not None:
        if probe.gpus is None:
            skipped["gpus"] = probe.gpus_skipped or "the GPUs could not be counted"
        elif probe.gpus < needs.gpus:
            said = f" ({probe.gpus_skipped})" if probe.gpus_skipped else ""
            failed["gpus"] = (
                f"{probe.gpus} GPUs listed by nvidia-smi, the job needs {needs.gpus}{said}"
            )
    if probe.command is not None:
        problem = _command_problem(probe.command)
        if problem:
            failed["command"] = problem
    return Verdict(probe.node, failed, skipped, probe.seconds)


def judge_round(
    nodes: Sequence[str], probes: Sequence[Probe], needs: Needs, trouble: str = ""
) -> list[Verdict]:
    """Every node's verdict, in ``nodes`` order; ``trouble`` is what the round's launcher said
    (srun's stderr), quoted for a node that sent no report."""
    by_node = {probe.node: probe for probe in probes}
    said = f": {trouble.strip()[-300:]}" if trouble.strip() else ""
    verdicts = []
    for node in nodes:
        probe = by_node.get(node)
        if probe is not None:
            verdicts.append(judge(probe, needs))
        elif by_node:
            verdicts.append(Verdict(node, {"report": f"the node sent no report{said}"}, {}))
        else:
            verdicts.append(Verdict(node, {}, {"all": f"the checks could not run{said}"}))
    return verdicts


def node_faults(verdicts: Sequence[Verdict]) -> dict[str, str]:
    """The nodes whose failed checks are their own fault, each with why (module docstring)."""
    failing: dict[str, int] = {}
    for verdict in verdicts:
        for check in verdict.failed:
            failing[check] = failing.get(check, 0) + 1
    shared = {check for check, count in failing.items() if count == len(verdicts) > 1}
    if len(verdicts) == 1:
        shared.add("checkpoint_dir")
    out = {}
    for verdict in verdicts:
        own = {check: why for check, why in verdict.failed.items() if check not in shared}
        if own:
            out[verdict.node] = "; ".join(f"{check}: {why}" for check, why in own.items())
    return out


def to_exclude(
    unhealthy: Mapping[str, str],
    failures: Mapping[str, int],
    excluded: Collection[str],
    exclude_after: int,
) -> list[tuple[str, str, int]]:
    """``(node, reason, failures)`` for each node to exclude now, unhealthy ones first, each
    once and none already ``excluded``; none when ``exclude_after`` is 0 (module docstring)."""
    if exclude_after == 0:
        return []
    out: dict[str, tuple[str, str, int]] = {}
    for node, why in unhealthy.items():
        if node not in excluded:
            out[node] = (node, f"failed its health check: {why}", failures.get(node, 0))
    for node, count in failures.items():
        if node not in excluded and node not in out and count >= exclude_after:
            noun = "failure" if count == 1 else "failures"
            out[node] = (node, f"{count} {noun} attributed to it", count)
    return list(out.values())


def _command_problem(result: CommandResult) -> str:
    output = f"; output: {result.output.strip()[-500:]}" if result.output.strip() else ""
    if result.error:
        return f"could not run: {result.error}"
    if result.timed_out:
        return f"did not finish within its timeout and was killed{output}"
    if result.exit_code is None:
        return f"did not report how it ended{output}"
    if result.exit_code < 0:
        return f"killed by signal {-result.exit_code}{output}"
    if result.exit_code != 0:
        return f"exited with status {result.exit_code}{output}"
    return ""


def _short(have: int | None, need: int) -> bool:
    return need > 0 and have is not None and have < need


def _too_little(what: str, have: int | None, need: int) -> str:
    return f"{_gib(have or 0)} {what}, {_gib(need)} needed"


def _gib(count: int) -> str:
    return f"{count / _GIB:.2f} GiB"


def _text(value: Any) -> str:
    return value if isinstance(value, str) else ""


def _count(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None
