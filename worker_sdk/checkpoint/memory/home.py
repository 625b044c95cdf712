"""The memory tier's directory on a node: checked private before any snapshot goes there, and
cleared of a failed try's files.

On the supervisor's node the directory is the one the supervisor made (``RVSUP_MEMORY_DIR``,
:mod:`supervisor.ranks.snapshot_home`): used only while it is still this user's private
directory. A job on several nodes keeps a copy of every snapshot on each node, in a folder named
for the host inside that directory; on the other nodes the ranks make both. A directory that is
missing (on another node, or a script run without rvsup that names one) is made here,
exclusively, by whichever local rank comes first; one that exists is used only once it passes
the same check (:mod:`worker_sdk.contract.private_paths`). Nothing in a directory that fails is
ever read.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from worker_sdk.contract.layout import TEMP_RE, node_folder
from worker_sdk.contract.private_paths import UntrustedPathError, make_private_dir

__all__ = ["private_folder", "remove_attempt_temps"]


def private_folder(directory: Path, *, several_nodes: bool) -> tuple[Path, str | None]:
    """Where this rank's snapshots go, and why that place must not be used (None: it may):
    on one node ``directory`` itself; on several, this node's folder in it; made here when
    missing."""
    folder = node_folder(directory) if several_nodes else directory
    try:
        make_private_dir(directory)
        if several_nodes:
            make_private_dir(folder)
    except UntrustedPathError as e:
        return folder, f"the snapshot directory is refused: {e}"
    except OSError as e:
        return folder, f"cannot make the snapshot directory {e.filename}: {e.strerror}"
    return folder, None


def remove_attempt_temps(directory: Path, attempt_tag: str) -> None:
    """Remove this attempt's temporary snapshot directories (when none is being written: a
    failed try's files would hold the room the tier waits for)."""
    try:
        names = os.listdir(directory)
    except OSError:
        return
    for name in names:
        m = TEMP_RE.match(name)
        if m and m.group(2) == attempt_tag:
            shutil.rmtree(directory / name, ignore_errors=True)
