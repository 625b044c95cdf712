"""What rvsup may trust on a node it shares: directories it made, and paths nobody else can redirect.

Two rules, as OpenSSH's ``StrictModes`` and PostgreSQL's data directory check apply them:

- **A private directory** is a real directory (opened with ``O_NOFOLLOW | O_DIRECTORY`` and checked
  with ``fstat`` on that descriptor: no symbolic link, no swap between the check and the use of
  the descriptor), owned by this user, with no permission bits for group or others. rvsup makes
  the directories it keeps under a shared place (``/dev/shm``, ``/tmp``) itself, exclusively
  (:func:`make_private_dir`), and uses one that already exists only when it passes this check.
- **A safe path** is one whose every component, from ``/`` down, is owned by root or this user and
  is writable by nobody else: whoever can write a directory can rename what is in it and put
  something of theirs in its place. Two exceptions: a sticky directory (``/tmp``, ``/dev/shm``),
  where nobody renames another user's entries, when the component under it is root's or this
  user's; and a directory writable by its group when that group is this user's own (no other
  member, no other user's primary group: Debian's default ``umask 002`` makes such directories).

:func:`chain_problem` is the pure rule, tested from tables; :func:`path_problem` applies it to the
real path of a directory. Standard library only: the supervisor checks paths at ``rvsup start``
and the ranks check them again before every load and save.
"""

from __future__ import annotations

import contextlib
import errno
import grp
import os
import pwd
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Final

__all__ = [
    "Entry",
    "UntrustedPathError",
    "chain_problem",
    "dir_identity",
    "directory_problem",
    "file_problem",
    "make_private_dir",
    "path_problem",
    "private_problem",
    "verify_private_dir",
]

_OPEN_DIR: Final = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_WRITABLE_BY_OTHERS: Final = stat.S_IWGRP | stat.S_IWOTH


class UntrustedPathError(PermissionError):
    """A path rvsup must not use: its message names the path and says why. A PermissionError:
    what fails on it (a save, a snapshot) fails as on a directory it may not write."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One component of a path, as ``lstat`` saw it."""

    path: str
    uid: int
    gid: int
    mode: int


GroupIsPrivate = Callable[[int, int], bool]
"""``(gid, uid)``: whether the group ``gid`` is the user ``uid``'s alone."""


def private_problem(st: os.stat_result, uid: int) -> str | None:
    """Why a directory with this ``stat`` is not private to ``uid``, or None."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & 0o077:
        return f"has mode {stat.S_IMODE(st.st_mode):04o}: group or others have access (0700 needed)"
    return None


def file_problem(st: os.stat_result, uid: int) -> str | None:
    """Why a file of a checkpoint with this ``stat`` must not be read, or None: it must be a
    regular file of this user that nobody else can write."""
    if not stat.S_ISREG(st.st_mode):
        return "is not a regular file"
    if st.st_uid != uid:
        return f"is owned by uid {st.st_uid}, not by this user (uid {uid})"
    if st.st_mode & _WRITABLE_BY_OTHERS:
        return "is writable by group or others"
    return None


def verify_private_dir(path: Path) -> None:
    """Raise :class:`UntrustedPathError` unless ``path`` is a private directory of this user
    (checked through a descriptor opened without following a symbolic link)."""
    try:
        fd = os.open(path, _OPEN_DIR)
    except OSError as e:
        raise UntrustedPathError(f"{path} {_open_reason(path, e)}") from None
    try:
        problem = private_problem(os.fstat(fd), os.geteuid())
    finally:
        os.close(fd)
    if problem is not None:
        raise UntrustedPathError(f"{path} {problem}")


def make_private_dir(path: Path) -> bool:
    """Make ``path`` a private directory (mode 0700), exclusively: True when made now, False when
    it existed and is private already. Raises :class:`UntrustedPathError` when it exists and is
    not (never used then), OSError when it cannot be made (a missing parent, a full tmpfs)."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        verify_private_dir(path)
        return False
    try:
        fd = os.open(path, _OPEN_DIR)
    except OSError as e:  # replaced between the mkdir and the open
        raise UntrustedPathError(f"{path} {_open_reason(path, e)}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.geteuid() or not stat.S_ISDIR(st.st_mode):
            raise UntrustedPathError(f"{path} {private_problem(st, os.geteuid())}")
        if stat.S_IMODE(st.st_mode) != 0o700:
            os.fchmod(fd, 0o700)  # a umask such as 0277 took bits this user needs
    finally:
        os.close(fd)
    return True


def dir_identity(path: Path) -> str:
    """``"<device>:<inode>"`` of the directory ``path`` names (a directory swapped for another
    has another identity)."""
    st = os.stat(path)
    return f"{st.st_dev}:{st.st_ino}"


def chain_problem(
    entries: Sequence[Entry],
    uid: int,
    *,
    shared_leaf: bool = False,
    group_is_private: GroupIsPrivate | None = None,
) -> str | None:
    """Why the path whose components (from ``/``, the last being the path itself) are
    ``entries`` is not safe for ``uid``, or None. ``shared_leaf``: the last component may itself
    be a sticky directory others write (a base such as ``/dev/shm`` under which rvsup makes
    private directories of its own)."""
    private = group_is_private or _group_is_private
    for i, entry in enumerate(entries):
        last = i == len(entries) - 1
        if stat.S_ISLNK(entry.mode):
            return f"{entry.path} is a symbolic link that changed while the path was checked"
        if entry.uid not in (0, uid):
            return (
                f"{entry.path} is owned by uid {entry.uid}, neither this user (uid {uid}) nor "
                "root: its owner can replace what is below it"
            )
        writable = entry.mode & _WRITABLE_BY_OTHERS
        if writable == stat.S_IWGRP and entry.uid == uid and private(entry.gid, uid):
            continue  # writable by the user's own group only
        if not writable:
            continue
        sticky = bool(entry.mode & stat.S_ISVTX)
        if sticky and last and shared_leaf:
            continue
        if sticky and not last and entries[i + 1].uid in (0, uid):
            continue
        if sticky and not last:
            return (
                f"{entries[i + 1].path} is owned by uid {entries[i + 1].uid}, in the shared "
                f"directory {entry.path}: its owner can replace what is below it"
            )
        return (
            f"{entry.path} is writable by {'others' if entry.mode & stat.S_IWOTH else 'its group'} "
            f"(mode {stat.S_IMODE(entry.mode):04o}): anyone who can write it can rename what is "
            "below it and put something of theirs in its place; chmod go-w it, or use a "
            "directory of your own"
        )
    return None


def path_problem(path: Path, *, shared_leaf: bool = False) -> str | None:
    """Why the directory ``path`` is not safe for this user (:func:`chain_problem` on every
    component of its real path), or None. Of a path that does not exist yet, what exists is
    checked, and the first missing component counts as this user's private directory (what
    ``rvsup start`` makes)."""
    real = Path(os.path.realpath(path))
    parts = [Path(real.anchor), *(Path(*real.parts[: i + 1]) for i in range(1, len(real.parts)))]
    entries = []
    for part in parts:
        try:
            st = os.lstat(part)
        except (FileNotFoundError, NotADirectoryError):
            break
        except OSError as e:
            return f"{part} cannot be checked: {e.strerror}"
        entries.append(Entry(str(part), st.st_uid, st.st_gid, st.st_mode))
    uid = os.geteuid()
    if len(entries) < len(parts):  # the first missing component: rvsup makes it, private
        entries.append(Entry(str(parts[len(entries)]), uid, os.getegid(), stat.S_IFDIR | 0o700))
    return chain_problem(entries, uid, shared_leaf=shared_leaf)


def directory_problem(directory: Path, identity: str | None) -> str | None:
    """Why nothing may be loaded from or saved into the checkpoint directory ``directory``, or
    None: an ancestor another user can write or replace, the directory writable by others, or
    another directory than the one ``rvsup start`` checked (``identity``, "device:inode"; None:
    not known) put in its place since."""
    problem = path_problem(directory)
    if problem is not None:
        return problem
    expected = identity
    if expected:
        try:
            found = dir_identity(directory)
        except OSError as e:
            return f"{directory} cannot be checked: {e.strerror}"
        if found != expected:
            return (
                f"{directory} is not the directory rvsup start checked (device:inode {found}, "
                f"was {expected}): it was replaced since"
            )
    return None


def _open_reason(path: Path, e: OSError) -> str:
    if e.errno in (errno.ELOOP, errno.ENOTDIR) and os.path.islink(path):
        return "is a symbolic link"
    if e.errno == errno.ENOTDIR:
        return "is not a directory"
    if e.errno == errno.ENOENT:
        return "does not exist"
    return f"cannot be opened: {e.strerror}"


@cache
def _group_is_private(gid: int, uid: int) -> bool:
    """Whether ``gid`` is ``uid``'s own group: no member but the user, nobody else's primary
    group (as Debian's OpenSSH allows group-writable home directories of user private groups)."""
    try:
        name = pwd.getpwuid(uid).pw_name
        group = grp.getgrgid(gid)
    except KeyError:
        return False
    if any(member != name for member in group.gr_mem):
        return False
    with contextlib.suppress(OSError):
        return not any(u.pw_gid == gid and u.pw_uid != uid for u in pwd.getpwall())
    return False
