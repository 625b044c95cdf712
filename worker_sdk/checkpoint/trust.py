"""Whether a checkpoint's files may be read: every zip record's CRC (torch.load checks none), the
reason a weights-only load refused a file, and whether unpickling files is safe (only files and
directories this user owns and nobody else can write). Used by :mod:`.restore`."""

from __future__ import annotations

import os
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Final

__all__ = ["first_bad_record", "untrusted_paths", "untrusted_reason", "weights_only_reason"]

_READ_CHUNK: Final = 4 << 20


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


def weights_only_reason(message: str) -> str:
    """The line of a weights-only load's error that says what it refused."""
    for line in message.splitlines():
        if "WeightsUnpickler error" in line:
            return line.strip()
    return message.splitlines()[0] if message else "weights-only load failed"


def untrusted_reason(directories: Sequence[Path], f: IO[bytes]) -> str | None:
    """Why unpickling these files would be unsafe (others own or can write them), or None."""
    checks = [(str(d), os.stat(d)) for d in directories] + [(f.name, os.fstat(f.fileno()))]
    return _first_untrusted(checks)


def untrusted_paths(paths: Sequence[Path]) -> str | None:
    """Like :func:`untrusted_reason`, for paths (directories and files) not opened yet."""
    try:
        checks = [(str(p), os.stat(p)) for p in paths]
    except OSError as e:
        return f"{e.filename} cannot be checked: {e.strerror}"
    return _first_untrusted(checks)


def _first_untrusted(checks: Sequence[tuple[str, os.stat_result]]) -> str | None:
    uid = os.geteuid()
    for label, st in checks:
        if st.st_uid != uid:
            return f"{label} is owned by uid {st.st_uid}, not by this user (uid {uid})"
        if st.st_mode & 0o022:
            return f"{label} is writable by group or others"
    return None
