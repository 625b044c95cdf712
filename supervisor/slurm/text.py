"""Slurm's notations and messages, parsed: pure functions, no commands run.

- :func:`expand_hostlist`: the compact node lists of Slurm's environment ("node[1-3,5]").
- :func:`parse_time_left`: squeue's ``%L``; :func:`parse_job_record`: ``scontrol show job -o``.
- :func:`parse_lost_nodes` (sinfo node states), :func:`parse_node_addresses` and
  :func:`parse_slurmd_port` (where each node's slurmd listens) and :func:`parse_probe_failures`
  (srun's launch failures): the evidence :func:`supervisor.slurm.lost.lost_nodes` reads.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

__all__ = [
    "PROBE_FAILED_NODE",
    "expand_hostlist",
    "parse_job_record",
    "parse_lost_nodes",
    "parse_node_addresses",
    "parse_probe_failures",
    "parse_slurmd_port",
    "parse_time_left",
]

_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def expand_hostlist(nodelist: str) -> tuple[str, ...]:
    """Expand Slurm's compact host list: "node[1-3,5],gpu07" -> node1 node2 node3 node5 gpu07.

    Zero padding is kept ("n[08-10]" -> n08 n09 n10); several bracket groups in one name expand
    left to right ("r[1-2]n[1-2]" -> r1n1 r1n2 r2n1 r2n2). Raises ValueError for malformed text.
    """
    names: list[str] = []
    for item in _split_top_level(nodelist.strip()):
        names.extend(_expand_item(item))
    return tuple(names)


def _split_top_level(text: str) -> list[str]:
    """Split at commas that are not inside brackets."""
    items, depth, start = [], 0, 0
    for position, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
        elif char == "," and depth == 0:
            items.append(text[start:position])
            start = position + 1
        if depth not in (0, 1):
            raise ValueError(f"unbalanced brackets in host list {text!r}")
    if depth:
        raise ValueError(f"unbalanced brackets in host list {text!r}")
    items.append(text[start:])
    if any(not item.strip() for item in items):
        raise ValueError(f"empty name in host list {text!r}")
    return [item.strip() for item in items]


def _expand_item(item: str) -> list[str]:
    opening = item.find("[")
    if opening < 0:
        if "]" in item:
            raise ValueError(f"unbalanced brackets in host name {item!r}")
        return [item]
    closing = item.index("]", opening)
    prefix, ranges, rest = item[:opening], item[opening + 1 : closing], item[closing + 1 :]
    numbers: list[str] = []
    for part in ranges.split(","):
        match = _RANGE.fullmatch(part.strip())
        if match is None:
            raise ValueError(f"bad range {part!r} in host name {item!r}")
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f"descending range {part!r} in host name {item!r}")
        width = len(low) if low.startswith("0") else 0
        numbers.extend(str(n).zfill(width) for n in range(int(low), int(high) + 1))
    tails = _expand_item(rest) if rest else [""]
    return [f"{prefix}{number}{tail}" for number in numbers for tail in tails]


_TIME_LEFT = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?:(\d+)")


def parse_time_left(text: str) -> float | None:
    """Seconds in squeue's ``%L`` text, or None when there is no usable limit.

    squeue prints "M:SS", "H:MM:SS" or "D-HH:MM:SS"; "UNLIMITED" (no limit), "NOT_SET" (no limit
    yet) and "INVALID" (time left below zero or above a year) give None, as does anything else.
    """
    match = _TIME_LEFT.fullmatch(text.strip())
    if match is None:
        return None
    days, first, second, last = match.groups()
    if days is not None and second is None:
        return None  # "1-02:03" is not a format squeue prints
    hours, minutes = (int(first), int(second)) if second is not None else (0, int(first))
    return float(((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + int(last))


_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=")


def parse_job_record(text: str, job_id: str) -> dict[str, str]:
    """The ``Key=Value`` fields of job ``job_id`` in ``scontrol show job -o`` output.

    The output has one line per job (several for an array); the line of ``job_id`` is used, else
    the first. A value may contain spaces (JobName, Command): it runs up to the next `` Key=``.
    """
    lines = text.splitlines()
    wanted = [line for line in lines if line.startswith(f"JobId={job_id} ")]
    line = (wanted or lines or [""])[0]
    fields = list(_FIELD.finditer(line))
    info: dict[str, str] = {}
    for index, field in enumerate(fields):
        end = fields[index + 1].start() if index + 1 < len(fields) else len(line)
        info[field.group(1)] = line[field.end() : end].strip()
    return info


# srun's words for a node it could not use: "Task launch for StepId=7.1 failed on node node2:
# Communication connection failure", "Node failure on node2"
PROBE_FAILED_NODE = re.compile(r"(?:failed on node|Node failure on) ([^\s:,]+)")
# sinfo %T states of a node that cannot run tasks now; a trailing "*" means not responding
_LOST_STATES: Final = frozenset({"down", "fail", "failing", "unknown", "future"})


def parse_lost_nodes(text: str) -> dict[str, str]:
    """Nodes that cannot run tasks in ``sinfo -h -N -o "%N %T"`` output, with the state sinfo
    gives them: down, failed, unknown, or not responding (a state with a trailing ``*``, e.g.
    ``mixed*``), in the order listed."""
    lost: dict[str, str] = {}
    for line in text.splitlines():
        name, _, state = line.strip().partition(" ")
        state = state.strip().lower()
        if name and (state.endswith("*") or state.rstrip("~#!%$@^-") in _LOST_STATES):
            lost.setdefault(name, state)
    return lost


def parse_slurmd_port(config: str) -> int | None:
    """``SlurmdPort`` in ``scontrol show config`` output (None where it is not given)."""
    for line in config.splitlines():
        key, _, value = line.partition("=")
        if key.strip() == "SlurmdPort" and value.strip().isdigit():
            return int(value.strip())
    return None


def parse_node_addresses(text: str, default_port: int) -> dict[str, tuple[str, int]]:
    """Node -> (address, slurmd port) from ``scontrol show node -o`` output (one line per node:
    ``NodeName=... NodeAddr=... [Port=...]``; the port is shown only where it is not the
    cluster's ``default_port``)."""
    out: dict[str, tuple[str, int]] = {}
    for line in text.splitlines():
        fields = dict(
            token.split("=", 1)
            for token in line.split()
            if token.startswith(("NodeName=", "NodeAddr=", "Port="))
        )
        name, addr = fields.get("NodeName"), fields.get("NodeAddr")
        port = fields.get("Port", "")
        if name and addr:
            out[name] = (addr, int(port) if port.isdigit() else default_port)
    return out


def parse_probe_failures(stderr: str, nodes: Sequence[str]) -> list[str]:
    """The nodes of ``nodes`` that srun's ``stderr`` says it could not launch on, in node order."""
    named = set(PROBE_FAILED_NODE.findall(stderr))
    return [node for node in nodes if node in named]
