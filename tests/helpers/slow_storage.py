"""Slow storage for real: a FUSE file system whose every write to its server takes ``delay`` s.

It speaks the kernel's FUSE protocol on ``/dev/fuse`` itself (no libfuse), with the page cache in
writeback mode, as network file systems run: ``write()`` returns at once, and ``close()`` or
``fsync()`` waits, in uninterruptible sleep (state ``D``), until the server has taken the data:
the shape of a rank flushing its checkpoint to a slow NFS or Lustre server. The server runs in
a process of its own (``python -m tests.helpers.slow_storage MOUNTPOINT DELAY``, which prints
``ready`` once mounted and unmounts on SIGTERM); :func:`mounted` starts and ends one, and
:func:`slow_storage` around a test, skipping it with the reason where FUSE cannot be mounted (no
root, no ``/dev/fuse``).
Files hold their data in the server's memory; one directory level, enough for a checkpoint file.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import signal
import stat
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

__all__ = ["UnavailableError", "mounted", "slow_storage"]

_IN = struct.Struct("<IIQQIIIHH")  # fuse_in_header: len, opcode, unique, nodeid, uid, gid, pid
_OUT = struct.Struct("<IiQ")  # fuse_out_header: len, error, unique
_ATTR = struct.Struct("<QQQQQQIIIIIIIIII")  # fuse_attr
_INIT_IN = struct.Struct("<IIII")  # major, minor, max_readahead, flags
_INIT_OUT = struct.Struct("<IIIIHHIIHHII24x")  # ... max_write, time_gran, max_pages, ...
_CREATE_IN = struct.Struct("<IIII")  # flags, mode, umask, open_flags
_WRITE_IN = struct.Struct("<QQIIQII")  # fh, offset, size, write_flags, lock_owner, flags, pad
_READ_IN = struct.Struct("<QQIIQII")
_SETATTR_IN = struct.Struct("<IIQQQQQQIIIIIIII")  # valid, pad, fh, size, ...
_STATFS_OUT = struct.Struct("<QQQQQIIII24x")
_WRITEBACK_CACHE, _BIG_WRITES = 1 << 16, 1 << 5
_FATTR_SIZE = 1 << 3
_MAX_WRITE = 1 << 20
_ROOT = 1
# opcodes
LOOKUP, FORGET, GETATTR, SETATTR, UNLINK, OPEN, READ, WRITE, STATFS, RELEASE = (
    1, 2, 3, 4, 10, 14, 15, 16, 17, 18,
)  # fmt: skip
READDIR = 28
FLUSH, INIT, OPENDIR, RELEASEDIR, CREATE, INTERRUPT, DESTROY, BATCH_FORGET = (
    25, 26, 27, 29, 35, 36, 38, 42,
)  # fmt: skip


class _Server:
    """One mounted file system: a root directory of in-memory files."""

    def __init__(self, fd: int, delay_s: float) -> None:
        self.fd = fd
        self.delay_s = delay_s
        self.names: dict[str, int] = {}  # name -> inode
        self.data: dict[int, bytearray] = {}  # inode -> contents
        self.next_ino = 2

    def serve(self) -> None:
        """Answer requests until the kernel ends the connection (unmount)."""
        while True:
            try:
                request = os.read(self.fd, _MAX_WRITE + 4096)
            except OSError as e:
                if e.errno in (errno.EINTR, errno.ENOENT):  # interrupted, or a request withdrawn
                    continue
                return  # ENODEV: unmounted
            _, opcode, unique, node, *_ = _IN.unpack_from(request)
            if opcode in (FORGET, BATCH_FORGET, INTERRUPT):
                continue  # answered by no reply
            try:
                body = self.answer(opcode, node, request[_IN.size :])
                error = 0
            except OSError as e:
                body, error = b"", -(e.errno or errno.EIO)
            with contextlib.suppress(OSError):  # the asker was killed meanwhile
                os.write(self.fd, _OUT.pack(_OUT.size + len(body), error, unique) + body)
            if opcode == DESTROY:
                return

    def answer(self, opcode: int, node: int, body: bytes) -> bytes:
        if opcode == INIT:
            _, _, readahead, _ = _INIT_IN.unpack_from(body)
            flags = _WRITEBACK_CACHE | _BIG_WRITES
            return _INIT_OUT.pack(7, 31, readahead, flags, 16, 12, _MAX_WRITE, 1, 256, 0, 0, 0)
        if opcode == LOOKUP:
            ino = self.names.get(_name(body))
            if ino is None:
                raise OSError(errno.ENOENT, "no such file")
            return self._entry(ino)
        if opcode == GETATTR:
            return self._attr_out(node)
        if opcode == SETATTR:
            valid, _, _, size, *_ = _SETATTR_IN.unpack_from(body)
            if valid & _FATTR_SIZE and node in self.data:
                contents = self.data[node]
                del contents[size:]
                contents.extend(bytes(size - len(contents)))
            return self._attr_out(node)
        if opcode == CREATE:
            ino = self.next_ino
            self.next_ino += 1
            self.names[_name(body[_CREATE_IN.size :])] = ino
            self.data[ino] = bytearray()
            return self._entry(ino) + struct.pack("<QII", ino, 0, 0)
        if opcode in (OPEN, OPENDIR):
            return struct.pack("<QII", node, 0, 0)
        if opcode == WRITE:
            _, offset, size, *_ = _WRITE_IN.unpack_from(body)
            time.sleep(self.delay_s)  # the slow server
            contents = self.data[node]
            contents[offset : offset + size] = body[_WRITE_IN.size : _WRITE_IN.size + size]
            return struct.pack("<II", size, 0)
        if opcode == READ:
            _, offset, size, *_ = _READ_IN.unpack_from(body)
            return bytes(self.data[node][offset : offset + size])
        if opcode == READDIR:
            _, offset, size, *_ = _READ_IN.unpack_from(body)
            return self._entries(offset, size)
        if opcode == UNLINK:
            ino = self.names.pop(_name(body), None)
            if ino is None:
                raise OSError(errno.ENOENT, "no such file")
            self.data.pop(ino, None)
            return b""
        if opcode in (RELEASE, RELEASEDIR, FLUSH, DESTROY):
            return b""
        if opcode == STATFS:
            return _STATFS_OUT.pack(1 << 20, 1 << 19, 1 << 19, 1000, 900, 4096, 255, 4096, 0)
        raise OSError(errno.ENOSYS, "not supported")

    def _entries(self, offset: int, size: int) -> bytes:
        """The directory's entries from number ``offset`` on, as many as fit in ``size``."""
        out = b""
        names = sorted(self.names.items())
        for number, (name, ino) in enumerate(names[offset:], start=offset + 1):
            raw = name.encode()
            entry = struct.pack("<QQII", ino, number, len(raw), stat.S_IFREG >> 12) + raw
            entry += bytes(-len(entry) % 8)
            if len(out) + len(entry) > size:
                break
            out += entry
        return out

    def _attr(self, ino: int) -> bytes:
        now = int(time.time())
        if ino == _ROOT:
            mode, size, nlink = stat.S_IFDIR | 0o755, 0, 2
        elif ino in self.data:
            mode, size, nlink = stat.S_IFREG | 0o644, len(self.data[ino]), 1
        else:
            raise OSError(errno.ENOENT, "no such inode")
        blocks = (size + 511) // 512
        return _ATTR.pack(ino, size, blocks, now, now, now, 0, 0, 0, mode, nlink, 0, 0, 0, 4096, 0)

    def _attr_out(self, ino: int) -> bytes:
        return struct.pack("<QII", 1, 0, 0) + self._attr(ino)

    def _entry(self, ino: int) -> bytes:
        return struct.pack("<QQQQII", ino, 0, 1, 1, 0, 0) + self._attr(ino)


def _name(body: bytes) -> str:
    return body.split(b"\0", 1)[0].decode()


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        code = ctypes.get_errno()
        raise OSError(code, f"{name}: {os.strerror(code)}")


def _serve(mountpoint: Path, delay_s: float) -> None:
    """Mount, say ``ready``, and serve until unmounted (SIGTERM unmounts)."""
    fd = os.open("/dev/fuse", os.O_RDWR)
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other"
    flags = 0x2 | 0x4  # MS_NOSUID | MS_NODEV
    _libc_call(
        "mount", b"rvsup-slow", bytes(mountpoint), b"fuse.rvsup-slow", flags, options.encode()
    )

    def unmount(signum: int, frame: object) -> None:
        _libc_call("umount2", bytes(mountpoint), 2)  # MNT_DETACH: the kernel ends the connection

    signal.signal(signal.SIGTERM, unmount)
    print("ready", flush=True)
    _Server(fd, delay_s).serve()


class UnavailableError(Exception):
    """Slow storage cannot be mounted here (the reason)."""


@contextlib.contextmanager
def mounted(mountpoint: Path, delay_s: float) -> Iterator[Path]:
    """A slow file system on the new directory ``mountpoint`` whose every write to its server
    takes ``delay_s`` (see the module docstring; the directory is made if need be), unmounted
    at the end; :class:`UnavailableError`
    where FUSE cannot be mounted."""
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        raise UnavailableError("slow storage is a FUSE file system: it needs root and /dev/fuse")
    mountpoint.mkdir(parents=True, exist_ok=True)
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.helpers.slow_storage", str(mountpoint), str(delay_s)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    try:
        assert server.stdout is not None and server.stderr is not None
        if server.stdout.readline() != "ready\n":
            server.wait()
            said = server.stderr.read().strip().splitlines()
            raise UnavailableError(f"cannot mount a FUSE file system: {said[-1] if said else '?'}")
        yield mountpoint
    finally:
        if server.poll() is None:
            server.terminate()
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
        subprocess.run(["umount", "-l", str(mountpoint)], capture_output=True, check=False)
        for stream in (server.stdout, server.stderr):
            if stream is not None:
                stream.close()


@contextlib.contextmanager
def slow_storage(mountpoint: Path, delay_s: float) -> Iterator[Path]:
    """:func:`mounted` for a test, skipped with the reason where it cannot be."""
    with contextlib.ExitStack() as stack:
        try:
            path = stack.enter_context(mounted(mountpoint, delay_s))
        except UnavailableError as e:
            pytest.skip(str(e))
        yield path


if __name__ == "__main__":
    _serve(Path(sys.argv[1]), float(sys.argv[2]))
