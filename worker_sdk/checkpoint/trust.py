"""Whether a checkpoint may be read at all: the directory is safe all the way up and is the one
``rvsup start`` checked, every entry and file is this user's and nobody else can write it, every
zip record's CRC holds (torch.load checks none). Used by :mod:`.restore` before anything is
read, and by the saves before anything is written (docs/security.md).

Nothing is loaded from a place another user could have written: not even weights-only, since
weights planted there would be resumed from as the job's own.
"""

from __future__ import annotations

import os
import stat
import zipfile
from pathlib import Path
from typing import IO, Final

from worker_sdk.contract.private_paths import directory_problem, file_problem

__all__ = [
    "directory_problem",
    "entry_problem",
    "first_bad_record",
    "opened_file_problem",
]

_READ_CHUNK: Final = 4 << 20


def entry_problem(path: Path) -> str | None:
    """Why the directory entry ``path`` of a checkpoint (a committed step, its ``dcp/``) must
    not be read, or None: it must be a real directory of this user that nobody else can
    write (never a symbolic link)."""
    try:
        st = os.lstat(path)
    except OSError as e:
        return f"{path} cannot be checked: {e.strerror}"
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} is not a directory"
    if st.st_uid != os.geteuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"{path} is writable by group or others"
    return None


def opened_file_problem(f: IO[bytes]) -> str | None:
    """Why the opened file ``f`` must not be read (checked on its descriptor), or None."""
    problem = file_problem(os.fstat(f.fileno()), os.geteuid())
    return None if problem is None else f"{f.name} {problem}"


def first_bad_record(f: IO[bytes]) -> str | None:
    """Check every zip record's CRC-32 (torch.load does not): the reason, or None if all good."""
    try:
        with zipfile.ZipFile(f) as archive:
            for record in archive.infolist():
                if record.CRC == 0 and record.file_size:
                    continue  # written with torch's CRC computation switched off
                with archive.open(record) as member:
                    while member.read(_READ_CHUNK):
                        pass
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, EOFError, ValueError) as e:
        return f"damaged archive: {e}"
    return None
