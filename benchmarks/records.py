"""Reading what happened in a trial, the same way for every tool (pure functions and parsers).

The workload's per-rank JSON lines (:mod:`benchmarks.workload`) give fault, resume and step times;
the tools' own logs give when each tool noticed a failure: rvsup's ``failure_detected`` events
(``noticed_at``), torchrun's and ft_launcher's log lines about a failed or stopped worker group, and
the retry loop's own line after each torchrun exit.
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True, slots=True)
class Record:
    """One line of a rank's record file."""

    t: float
    rank: int
    pid: int
    step: int
    event: str


def parse_records(lines: Iterable[str]) -> list[Record]:
    """Records from JSON lines, skipping torn or foreign lines, sorted by time."""
    out = []
    for line in lines:
        try:
            d = json.loads(line)
            out.append(
                Record(
                    float(d["t"]), int(d["rank"]), int(d["pid"]), int(d["step"]), str(d["event"])
                )
            )
        except (ValueError, KeyError, TypeError):
            continue
    return sorted(out, key=lambda r: r.t)


def load_records(record_dir: Path) -> list[Record]:
    lines: list[str] = []
    for path in sorted(record_dir.glob("rank-*.jsonl")):
        lines += path.read_text(errors="replace").splitlines()
    return parse_records(lines)


def first_event(records: Sequence[Record], event: str, after: float = 0.0) -> Record | None:
    return next((r for r in records if r.event == event and r.t >= after), None)


def all_ranks_stepped(records: Sequence[Record], world: int, after: float = 0.0) -> float | None:
    """When every rank had finished a step after ``after``, by processes started after it.

    Processes that already existed at ``after`` do not count: this is "the first resumed step on
    all ranks" (after a fault) or "the first step on all ranks" (after a launch, ``after`` = 0).
    """
    old = {r.pid for r in records if r.t <= after}
    first: dict[int, float] = {}
    for r in records:
        if r.event == "step" and r.t > after and r.pid not in old and r.rank not in first:
            first[r.rank] = r.t
    if len(first) < world:
        return None
    return max(first.values())


def resume_step(records: Sequence[Record], after: float) -> int | None:
    """The step the first process started after ``after`` ran first (its ``start`` record)."""
    old = {r.pid for r in records if r.t <= after}
    start = next((r for r in records if r.event == "start" and r.pid not in old), None)
    return None if start is None else start.step


def group_step_before(records: Sequence[Record], t: float, world: int) -> int | None:
    """The last step every rank had finished by ``t`` (min over ranks), or None."""
    last: dict[int, int] = {}
    for r in records:
        if r.event == "step" and r.t <= t:
            last[r.rank] = max(last.get(r.rank, -1), r.step)
    if len(last) < world:
        return None
    return min(last.values())


def lost_steps(done_before: int | None, resumed_at: int | None) -> int | None:
    """Finished steps that must be run again: ``done_before - (resumed_at - 1)``, at least 0."""
    if done_before is None or resumed_at is None:
        return None
    return max(0, done_before - resumed_at + 1)


def completed(records: Sequence[Record], world: int, total: int) -> bool:
    """Every rank finished the last step."""
    return {r.rank for r in records if r.event == "step" and r.step == total - 1} >= set(
        range(world)
    )


def useful_step_seconds(records: Sequence[Record], rank: int = 0) -> float:
    """Time spent on steps that were never redone: for each step index its last execution's
    duration (from the previous step or start record of the same process)."""
    last_of_step: dict[int, float] = {}
    prev: dict[int, float] = {}
    for r in records:
        if r.rank != rank:
            continue
        if r.event == "start":
            prev[r.pid] = r.t
        elif r.event == "step" and r.pid in prev:
            last_of_step[r.step] = r.t - prev[r.pid]
            prev[r.pid] = r.t
    return sum(last_of_step.values())


def step_durations(records: Sequence[Record], rank: int = 0) -> list[float]:
    """Durations of consecutive steps of one process (no restarts or saves in between)."""
    out: list[float] = []
    prev: dict[int, tuple[int, float]] = {}
    for r in records:
        if r.rank == rank and r.event == "step":
            before = prev.get(r.pid)
            if before is not None and before[0] == r.step - 1:
                out.append(r.t - before[1])
            prev[r.pid] = (r.step, r.t)
    return out


def first_at_or_after(times: Iterable[float], t: float, slack: float = 0.0) -> float | None:
    """The earliest of ``times`` not before ``t - slack``."""
    later = [x for x in times if x >= t - slack]
    return min(later) if later else None


# ---------------------------------------------------------------- when each tool noticed
def rvsup_noticed(events_lines: Iterable[str]) -> list[float]:
    """``noticed_at`` of every ``failure_detected`` event (wall-clock seconds)."""
    found = _history_events(events_lines, "failure_detected")
    return [iso_to_unix(str(d["noticed_at"])) for d in found if d.get("noticed_at")]


def rvsup_restart_delays(events_lines: Iterable[str]) -> list[float]:
    """The delay of every charged restart (``restart_scheduled.backoff_s``), in order: what the
    daemon drew."""
    found = _history_events(events_lines, "restart_scheduled")
    return [float(d["backoff_s"]) for d in found if d.get("charged")]


def _history_events(lines: Iterable[str], name: str) -> list[dict[str, Any]]:
    """The events called ``name`` in the lines of an events.jsonl (a line that is not a JSON
    object is skipped)."""
    out = []
    for line in lines:
        try:
            d = json.loads(line)
        except ValueError:
            continue
        if isinstance(d, dict) and d.get("event") == name:
            out.append(d)
    return out


def iso_to_unix(text: str) -> float:
    return datetime.datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


_TORCH_LINE = re.compile(r"^[IWEF](\d{2})(\d{2}) (\d{2}):(\d{2}):(\d{2})\.(\d+) +\d+ (.*)$")
# nvidia-resiliency-ext 0.4.1 writes "[YYYY-MM-DD hh:mm:ss,ms] ...", 0.7.0 the same without brackets
_FT_LINE = re.compile(r"^\[?(\d{4})-(\d{2})-(\d{2}) (\d{2}):(\d{2}):(\d{2}),(\d{3})\]? (.*)$")
# what an elastic agent logs when it sees a failed worker or starts stopping the group
_NOTICE = ("failed (exitcode", "closing signal", "UNHEALTHY", "Did not get", "FT timeout elapsed")


def torch_log_noticed(lines: Iterable[str], year: int) -> list[float]:
    """Times of torchrun agent lines (glog style, local time) that show a noticed failure."""
    out = []
    for line in lines:
        m = _TORCH_LINE.match(line)
        if m and any(k in m.group(7) for k in _NOTICE):
            mon, day, hh, mm, ss, frac = (m.group(i) for i in range(1, 7))
            out.append(_local(year, int(mon), int(day), int(hh), int(mm), int(ss), frac))
    return out


def ft_log_noticed(lines: Iterable[str]) -> list[float]:
    """Times of ft_launcher and rank-monitor lines (``[YYYY-MM-DD hh:mm:ss,ms]``, or without the
    brackets as 0.7.0 writes them; local time) that show a noticed failure (a failed worker, a
    missed heartbeat)."""
    out = []
    for line in lines:
        m = _FT_LINE.match(line)
        if m and any(k in m.group(8) for k in _NOTICE):
            y, mon, day, hh, mm, ss, ms = (int(m.group(i)) for i in range(1, 8))
            out.append(_local(y, mon, day, hh, mm, ss, f"{ms:03d}"))
    return out


def loop_noticed(lines: Iterable[str]) -> list[float]:
    """The retry loop's ``torchrun-exit <rc> <unix time>`` lines with a non-zero rc."""
    out = []
    for line in lines:
        parts = line.split()
        if len(parts) == 3 and parts[0] == "torchrun-exit" and parts[1] != "0":
            try:
                out.append(float(parts[2]))
            except ValueError:
                continue
    return out


def _local(y: int, mon: int, day: int, hh: int, mm: int, ss: int, frac: str) -> float:
    whole = time.mktime((y, mon, day, hh, mm, ss, 0, 0, -1))
    return whole + float(f"0.{frac}")


# ---------------------------------------------------------------- live recovery (figure 12)
def rejoined(records: Sequence[Record], world: int, after: float) -> float | None:
    """When every rank was stepping again at a common step after ``after`` (a fault): the
    earliest, over step indices, of the time by which every rank had finished that step after
    ``after``. A tool that restarts every rank resumes all of them at one step; a rank that
    rejoins a running job (torchft) finishes the job's current step beside the others."""
    first: dict[int, dict[int, float]] = {}  # step -> rank -> its first finish after ``after``
    for r in records:
        if r.event == "step" and r.t > after:
            first.setdefault(r.step, {}).setdefault(r.rank, r.t)
    done = [max(by_rank.values()) for by_rank in first.values() if len(by_rank) >= world]
    return min(done) if done else None


def steps_computed_twice(records: Sequence[Record], rank: int) -> int:
    """Finished steps of ``rank`` whose index it had finished before (by any of its processes)."""
    seen: set[int] = set()
    twice = 0
    for r in records:
        if r.rank == rank and r.event == "step":
            twice += r.step in seen
            seen.add(r.step)
    return twice


def discarded_steps(records: Sequence[Record], rank: int) -> int:
    """Steps ``rank`` computed and did not commit (torchft's ``discarded`` records)."""
    return sum(1 for r in records if r.rank == rank and r.event == "discarded")


def progress_stall(
    records: Sequence[Record], rank: int, after: float, until: float
) -> float | None:
    """The longest time ``rank`` went without progress around a fault at ``after``, up to
    ``until`` (the recovery): the longest interval between two consecutive progress records (a
    step finished whose index is higher than any the rank had finished) that ends after
    ``after`` and starts before ``until``. Redone steps are not progress."""
    times: list[float] = []
    best = -1
    for r in records:
        if r.rank == rank and r.event == "step" and r.step > best:
            best = r.step
            times.append(r.t)
    gaps = [b - a for a, b in itertools.pairwise(times) if b > after and a < until]
    return max(gaps) if gaps else None


def steps_without(records: Sequence[Record], rank: int) -> int:
    """Steps some other rank finished without ``rank``'s batch: steps ``rank`` never finished
    (torchft goes on with the replica groups it has) and steps it finished with its batch
    ``unused`` (a torchft group's gradient counts as zeros in the step in which it heals)."""
    by_rank: dict[int, set[int]] = {}
    unused: set[int] = set()
    for r in records:
        if r.event == "step":
            by_rank.setdefault(r.rank, set()).add(r.step)
        elif r.event == "unused" and r.rank == rank:
            unused.add(r.step)
    others: set[int] = set()
    for other, steps in by_rank.items():
        if other != rank:
            others |= steps
    return len((others - by_rank.get(rank, set())) | (others & unused))
