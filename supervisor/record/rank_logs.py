"""Which files hold each rank's output: ``<run_dir>/logs/attempt-N/ranks.json``.

torchrun writes every rank's stdout and stderr under the attempt's log folder, in a folder named
by the rank's *local* rank inside one folder per node's torchrun (``<run-id>_<random>/attempt_0/
<local_rank>/stdout.log``). Only on one node is the local rank the rank. Each rank says which
files its standard streams are (the SDK's hello); the daemon records them here, so that ``rvsup
logs`` names every rank rightly on any number of nodes, after the daemon has ended too.
"""

from __future__ import annotations

import contextlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from supervisor.record.rundir import logs_dir

__all__ = ["INDEX_FILE", "RankLogs", "attempts", "find", "note"]

INDEX_FILE: Final = "ranks.json"


@dataclass(frozen=True, slots=True)
class RankLogs:
    """One rank's output files of one attempt (a file that was never written may be absent)."""

    rank: int
    stdout: Path
    stderr: Path


def note(run_dir: Path, attempt: int, rank: int, stdout: str, stderr: str) -> None:
    """Record that ``rank``'s output of ``attempt`` is in these files (rewrites the small index
    through a temporary file, so that a reader never sees half of it)."""
    folder = logs_dir(run_dir, attempt)
    folder.mkdir(parents=True, exist_ok=True)
    index = _read_index(folder)
    index[str(rank)] = [stdout, stderr]
    tmp = folder / f".{INDEX_FILE}.{os.getpid()}"
    tmp.write_text(json.dumps(index, sort_keys=True))
    tmp.replace(folder / INDEX_FILE)


def note_hello(
    run_dir: Path, attempt: int, rank: int, stdout: str | None, stderr: str | None
) -> None:
    """:func:`note` the files a rank's hello names, when it names both by absolute path; never
    fails (the logs are a convenience)."""
    if stdout is not None and stderr is not None and stdout[:1] == stderr[:1] == "/":
        with contextlib.suppress(OSError):
            note(run_dir, attempt, rank, stdout, stderr)


def attempts(run_dir: Path) -> list[int]:
    """The attempts that have a log folder, ascending."""
    found = []
    for path in (run_dir / "logs").glob("attempt-*"):
        with contextlib.suppress(ValueError):
            found.append(int(path.name.removeprefix("attempt-")))
    return sorted(found)


def find(run_dir: Path, attempt: int) -> list[RankLogs]:
    """Every rank's output files of ``attempt``, by rank: from the index the ranks' hellos
    wrote; a rank that never said hello (it died first) by its folder, where the folder's
    local rank can only be that rank (one node's torchrun in the attempt)."""
    folder = logs_dir(run_dir, attempt)
    found: dict[int, RankLogs] = {}
    for key, paths in _read_index(folder).items():
        with contextlib.suppress(ValueError, TypeError):
            found[int(key)] = RankLogs(int(key), Path(paths[0]), Path(paths[1]))
    nodes = [p for p in folder.iterdir() if p.is_dir()] if folder.is_dir() else []
    if len(nodes) == 1:
        named = {(r.stdout.parent, r.stderr.parent) for r in found.values()}
        for local in sorted(nodes[0].glob("attempt_*/*")):
            if not local.name.isdigit() or (local, local) in named:
                continue
            found.setdefault(int(local.name), RankLogs(int(local.name), *_streams(local)))
    return [found[r] for r in sorted(found)]


def _streams(local: Path) -> tuple[Path, Path]:
    return local / "stdout.log", local / "stderr.log"


def _read_index(folder: Path) -> dict[str, list[str]]:
    try:
        index = json.loads((folder / INDEX_FILE).read_text())
    except (OSError, ValueError):
        return {}
    return index if isinstance(index, dict) else {}
