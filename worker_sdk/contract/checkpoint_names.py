"""The names in a checkpoint directory: committed and temporary checkpoint directories, the
files inside one, the marker and the pruning protection (:mod:`.layout` draws the whole
layout; :mod:`.manifest` reads a checkpoint's manifest with these names)."""

from __future__ import annotations

import re
from typing import Final

__all__ = [
    "ARENA_DCP",
    "ARENA_LOCAL",
    "COMMITTED_RE",
    "DCP_DIR",
    "DCP_METADATA",
    "FORMAT",
    "FORMATS",
    "MANIFEST",
    "MARKER",
    "PROTECT",
    "SAVE_MODES",
    "SHARED",
    "STATE_DCP",
    "STATE_RANK",
    "STATE_SHARED",
    "TEMP_RE",
    "committed_name",
    "is_rvsup_entry",
    "rank_file",
    "temp_name",
]

COMMITTED_RE: Final[re.Pattern[str]] = re.compile(r"^step-(\d{10})$")
TEMP_RE: Final[re.Pattern[str]] = re.compile(r"^\.tmp-step-(\d{10})-(.+)$")
MARKER: Final = ".rvsup"
PROTECT: Final = ".rvsup-protect"
MANIFEST: Final = "MANIFEST.json"
SHARED: Final = "shared.pt"
DCP_DIR: Final = "dcp"
DCP_METADATA: Final = "dcp/.metadata"
FORMAT: Final = 2  # what this release writes
FORMATS: Final = frozenset({1, 2})  # what it loads
SAVE_MODES: Final = ("sync", "async", "external")  # a manifest's "mode"
# "external": a marker of the framework's own checkpoint (bring your own checkpoint): the rank
# files hold only RNG states and the path the script reported; the manifest's "external" names it
STATE_SHARED: Final = "shared"  # an object's state lives in shared.pt
STATE_DCP: Final = "dcp"  # an object's state lives in dcp/ (torch.distributed.checkpoint)
STATE_RANK: Final = "rank"  # each rank's own state of the object lives in its rank file
# the staging arenas of an asynchronous save or a snapshot (a rank's, shared with its writer):
ARENA_LOCAL: Final = "local"  # shared.pt's state (rank 0's: saved once for all) and the rank file's
ARENA_DCP: Final = "dcp"  # the sharded state written to dcp/

_MAX_STEP: Final = 10**10 - 1


def _check_step(step: int) -> None:
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= _MAX_STEP:
        raise ValueError(f"step must be an int in [0, {_MAX_STEP}], got {step!r}")


def committed_name(step: int) -> str:
    """``step-0000000123`` for step 123."""
    _check_step(step)
    return f"step-{step:010d}"


def temp_name(step: int, attempt_tag: str) -> str:
    """``.tmp-step-0000000123-<attempt_tag>``: where a checkpoint of ``step`` is written."""
    _check_step(step)
    if not attempt_tag or "/" in attempt_tag or "\0" in attempt_tag or "\n" in attempt_tag:
        raise ValueError(f"bad attempt tag {attempt_tag!r}")
    return f".tmp-step-{step:010d}-{attempt_tag}"


def rank_file(rank: int) -> str:
    """``rank-00000.pt``: the per-rank part of a checkpoint."""
    if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank <= 99999:
        raise ValueError(f"rank must be an int in [0, 99999], got {rank!r}")
    return f"rank-{rank:05d}.pt"


def is_rvsup_entry(name: str) -> bool:
    """True for names this layout owns: committed and temporary checkpoints, the marker, the
    pruning protection (and its partial file, left by a supervisor killed while writing it)."""
    if name in (MARKER, PROTECT, PROTECT + ".partial"):
        return True
    return bool(COMMITTED_RE.match(name)) or bool(TEMP_RE.match(name))
