"""What rvsup trusts on a shared node (worker_sdk/contract/private_paths.py): the path rule from a
table (owners, modes, sticky directories, the user's own group, links), and the private
directories on a real file system (made exclusively, refused when another's, open or a link)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from worker_sdk.contract.private_paths import (
    Entry,
    UntrustedPathError,
    chain_problem,
    make_private_dir,
    path_problem,
    verify_private_dir,
)

ME, ROOT, OTHER = 1000, 0, 1001
DIR, LINK = stat.S_IFDIR, stat.S_IFLNK


def _own_group(gid: int, uid: int) -> bool:
    """In the table, group 1000 is the user's own (no other member), 100 is shared."""
    return gid == 1000


def _chain(*parts: tuple[int, int, int]) -> list[Entry]:
    """Entries /a, /a/b, ... from (uid, gid, mode) tuples, starting at /."""
    names = ["/", *(f"/{'/'.join('abcdefgh'[: i + 1])}" for i in range(len(parts) - 1))]
    return [
        Entry(name, uid, gid, mode) for name, (uid, gid, mode) in zip(names, parts, strict=True)
    ]


_ROOT_DIR = (ROOT, 0, DIR | 0o755)
_CASES: dict[str, tuple[list[Entry], bool, str | None]] = {
    "all root's and the user's, closed": (
        _chain(_ROOT_DIR, _ROOT_DIR, (ME, 100, DIR | 0o700)),
        False,
        None,
    ),
    "the leaf readable by all": (_chain(_ROOT_DIR, (ME, 100, DIR | 0o755)), False, None),
    "an ancestor of another user": (
        _chain(_ROOT_DIR, (OTHER, 100, DIR | 0o755), (ME, 100, DIR | 0o700)),
        False,
        "/a is owned by uid 1001, neither this user (uid 1000) nor root",
    ),
    "an ancestor every user writes, not sticky": (
        _chain(_ROOT_DIR, (ROOT, 0, DIR | 0o777), (ME, 100, DIR | 0o700)),
        False,
        "/a is writable by others (mode 0777)",
    ),
    "the leaf every user writes": (
        _chain(_ROOT_DIR, (ME, 100, DIR | 0o777)),
        False,
        "/a is writable by others (mode 0777)",
    ),
    "an ancestor its (shared) group writes": (
        _chain(_ROOT_DIR, (ROOT, 100, DIR | 0o775), (ME, 100, DIR | 0o700)),
        False,
        "/a is writable by its group (mode 0775)",
    ),
    "an ancestor of the user's, written by a shared group": (
        _chain(_ROOT_DIR, (ME, 100, DIR | 0o775), (ME, 100, DIR | 0o700)),
        False,
        "/a is writable by its group",
    ),
    "an ancestor of the user's, written by the user's own group (umask 002)": (
        _chain(_ROOT_DIR, (ME, 1000, DIR | 0o775), (ME, 1000, DIR | 0o700)),
        False,
        None,
    ),
    "the user's own group, but root's directory": (
        _chain(_ROOT_DIR, (ROOT, 1000, DIR | 0o775), (ME, 100, DIR | 0o700)),
        False,
        "/a is writable by its group",
    ),
    "sticky /tmp, the user's folder in it": (
        _chain(_ROOT_DIR, (ROOT, 0, DIR | 0o1777), (ME, 100, DIR | 0o700)),
        False,
        None,
    ),
    "sticky /tmp, root's folder in it": (
        _chain(_ROOT_DIR, (ROOT, 0, DIR | 0o1777), (ROOT, 0, DIR | 0o755), (ME, 100, DIR | 0o700)),
        False,
        None,
    ),
    "sticky /tmp, another user's folder in it": (
        _chain(
            _ROOT_DIR, (ROOT, 0, DIR | 0o1777), (OTHER, 100, DIR | 0o755), (ME, 100, DIR | 0o700)
        ),
        False,
        "/a/b is owned by uid 1001, in the shared directory /a",
    ),
    "sticky /dev/shm as the shared leaf": (
        _chain(_ROOT_DIR, _ROOT_DIR, (ROOT, 0, DIR | 0o1777)),
        True,
        None,
    ),
    "sticky /dev/shm as a leaf that must be private": (
        _chain(_ROOT_DIR, _ROOT_DIR, (ROOT, 0, DIR | 0o1777)),
        False,
        "/a/b is writable by others (mode 1777)",
    ),
    "a shared leaf that is not sticky": (
        _chain(_ROOT_DIR, (ROOT, 0, DIR | 0o777)),
        True,
        "/a is writable by others (mode 0777)",
    ),
    "a link swapped in while checked": (
        _chain(_ROOT_DIR, (ME, 100, LINK | 0o777), (ME, 100, DIR | 0o700)),
        False,
        "/a is a symbolic link that changed while the path was checked",
    ),
    "root's own path, for root": (_chain(_ROOT_DIR, (ROOT, 0, DIR | 0o700)), False, None),
}


@pytest.mark.parametrize(("entries", "shared_leaf", "expected"), _CASES.values(), ids=list(_CASES))
def test_the_path_rule(entries: list[Entry], shared_leaf: bool, expected: str | None) -> None:
    """Each component owned by root or the user and written by nobody else, but for a sticky
    directory over a component of root's or the user's, and the user's own group."""
    uid = ROOT if entries[-1].uid == ROOT else ME
    got = chain_problem(entries, uid, shared_leaf=shared_leaf, group_is_private=_own_group)
    if expected is None:
        assert got is None
    else:
        assert got is not None
        assert got.startswith(expected), got


def test_a_real_path_is_checked_up_to_its_root(tmp_path: Path) -> None:
    """A folder under one every user writes is refused, naming that ancestor; under a sticky
    one it is accepted; a link to a refused place is judged by where it leads; a path not
    made yet is judged by what exists (its first missing part will be the user's own)."""
    open_dir = tmp_path / "open"
    open_dir.mkdir()
    open_dir.chmod(0o777)
    (open_dir / "ckpt").mkdir(mode=0o700)
    assert path_problem(open_dir / "ckpt") == (
        f"{open_dir} is writable by others (mode 0777): anyone who can write it can rename what "
        "is below it and put something of theirs in its place; chmod go-w it, or use a directory "
        "of your own"
    )
    sticky = tmp_path / "sticky"
    sticky.mkdir()
    sticky.chmod(0o1777)
    assert path_problem(sticky / "mine") is None  # not made yet: it will be this user's
    (sticky / "mine").mkdir(mode=0o700)
    assert path_problem(sticky / "mine") is None
    assert path_problem(sticky, shared_leaf=True) is None
    (tmp_path / "link").symlink_to(open_dir / "ckpt")
    assert str(open_dir) in str(path_problem(tmp_path / "link"))


def test_a_private_directory_is_made_exclusively(tmp_path: Path) -> None:
    """Made 0700 (whatever the umask), then accepted again as made; one that another process
    left open, or a link to one, is refused; a regular file is no directory."""
    mine = tmp_path / "mine"
    old = os.umask(0o277)
    try:
        assert make_private_dir(mine) is True
    finally:
        os.umask(old)
    assert stat.S_IMODE(mine.stat().st_mode) == 0o700
    assert make_private_dir(mine) is False
    verify_private_dir(mine)
    opened = tmp_path / "opened"
    opened.mkdir()
    opened.chmod(0o777)
    with pytest.raises(UntrustedPathError, match="has mode 0777"):
        make_private_dir(opened)
    (tmp_path / "link").symlink_to(mine)
    with pytest.raises(UntrustedPathError, match="is a symbolic link"):
        verify_private_dir(tmp_path / "link")
    (tmp_path / "file").write_text("x")
    with pytest.raises(UntrustedPathError, match="is not a directory"):
        make_private_dir(tmp_path / "file")
    assert isinstance(UntrustedPathError("x"), PermissionError)


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_another_users_directory_is_never_private(tmp_path: Path) -> None:
    """A 0700 directory of another user, where ours was to be made: refused, naming its owner."""
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 54321, 54321)
    with pytest.raises(UntrustedPathError, match="owned by uid 54321"):
        make_private_dir(theirs)
