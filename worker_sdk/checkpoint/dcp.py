"""The sharded part of a checkpoint: torch.distributed.checkpoint (DCP) inside rvsup's commit.

DCP alone is not atomic: it writes its data files under their final names, commits by renaming
``.metadata``, never fsyncs the directory and reuses a directory in place. Here it only ever
writes into the ``dcp/`` subdirectory of a temporary step directory, which rvsup's own protocol
(every rank's files durable, all ranks agree, manifest, one rename) commits or discards; the
``.metadata`` DCP writes is just one more file the manifest lists.

Each rank writes its own shards into ``__<rank>_<i>.distcp`` (``single_file_per_rank``); values
that every rank holds identically (an FSDP2 optimizer's step counters) are written once. Nothing
per-rank goes through DCP: DCP keeps one copy of any key that every rank saves.

torch.distributed.checkpoint is imported here, lazily: a job without sharded state never pays
for it (a third of a second).
"""

from __future__ import annotations

import contextlib
import os
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from worker_sdk.contract import layout

if TYPE_CHECKING:
    from .parallel import Group

__all__ = ["THREADS", "capture", "crc32_file", "load", "names", "seal", "verify", "write"]

THREADS: Final = 1  # DCP writer threads (files) per rank; measured no faster with 2 on CPU
_READ_CHUNK: Final = 8 << 20
_OWN_FILE_RE: Final = re.compile(r"^__(\d+)_(\d+)\.distcp$")
_METADATA: Final = ".metadata"


def _options() -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    # sharded (each rank its own shards), on the device the state lives on: DCP copies to CPU
    # as it writes
    return StateDictOptions(full_state_dict=False, cpu_offload=False)


def capture(groups: Sequence[Group]) -> dict[str, Any]:
    """The DCP state dict of ``groups``: references to every rank's shards (no copy).

    For FSDP1 this is a collective: every rank must call it.
    """
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    options = _options()
    state: dict[str, Any] = {}
    for g in groups:
        if g.optimizers:
            model_sd, optim_sd = get_state_dict(g.module, list(g.optimizers), options=options)
            state[g.model_key] = model_sd
            state[g.optim_key] = optim_sd
        else:
            state[g.model_key] = get_model_state_dict(g.module, options=options)
    return state


def write(state: dict[str, Any], directory: Path, rank: int) -> list[int]:
    """Write this rank's shards of ``state`` into ``directory``, durably; collective.

    Returns ``[crc of .metadata (rank 0; -1 elsewhere), crc of __<rank>_0.distcp, ...]``,
    ``1 + THREADS`` numbers, -1 for a file this rank did not write.
    """
    from torch.distributed.checkpoint.filesystem import FileSystemWriter
    from torch.distributed.checkpoint.state_dict_saver import save

    directory.mkdir(mode=0o700, exist_ok=True)
    _remove_stale(directory, rank)  # left by an earlier try of this step in this attempt
    writer = FileSystemWriter(
        directory, single_file_per_rank=True, sync_files=True, thread_count=THREADS
    )
    save(state, storage_writer=writer)
    sums = [-1] * (1 + THREADS)
    for index, name in _own_files(directory, rank):
        if index >= THREADS:
            raise RuntimeError(f"DCP wrote more files than expected: {directory / name}")
        sums[1 + index] = seal(directory / name)
    if rank == 0:
        sums[0] = seal(directory / _METADATA)
    layout.fsync_dir(directory)
    return sums


def names(rank: int, sums: Sequence[int]) -> list[tuple[str, int]]:
    """The checkpoint-relative names of the files ``sums`` (from :func:`write`) describes."""
    out = []
    if sums[0] >= 0:
        out.append((layout.DCP_METADATA, sums[0]))
    for index, crc in enumerate(sums[1:]):
        if crc >= 0:
            out.append((f"{layout.DCP_DIR}/__{rank}_{index}.distcp", crc))
    return out


def verify(path: Path, checksums: Sequence[tuple[str, int]], rank: int, world_size: int) -> None:
    """Check the CRC-32 of this rank's share of the files (every ``world_size``-th, from
    ``rank``); raise ValueError naming the first bad one. Together the ranks read each once."""
    for i, (name, expected) in enumerate(checksums):
        if i % world_size != rank:
            continue
        try:
            got = crc32_file(path / name)
        except OSError as e:
            raise ValueError(f"cannot read {name}: {e.strerror}") from None
        if got != expected:
            raise ValueError(f"{name}: CRC-32 {got:08x}, {layout.MANIFEST} says {expected:08x}")


def load(groups: Sequence[Group], directory: Path) -> None:
    """Restore ``groups`` from the DCP checkpoint in ``directory``, resharded to this world
    size (DCP reads whichever saved shards overlap this rank's); collective."""
    from torch.distributed.checkpoint.filesystem import FileSystemReader
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict
    from torch.distributed.checkpoint.state_dict_loader import load as dcp_load

    state = capture(groups)  # the layout to fill: this rank's shards, at this world size
    dcp_load(state, storage_reader=FileSystemReader(directory))
    options = _options()
    for g in groups:
        if g.optimizers:
            set_state_dict(
                g.module,
                list(g.optimizers),
                model_state_dict=state[g.model_key],
                optim_state_dict=state[g.optim_key],
                options=options,
            )
        else:
            set_model_state_dict(g.module, state[g.model_key], options=options)


def crc32_file(path: Path, *, fsync: bool = False) -> int:
    """CRC-32 of a file's bytes (read in chunks); with ``fsync``, the file is also synced."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            crc = zlib.crc32(chunk, crc)
        if fsync:
            os.fsync(f.fileno())
    return crc


def seal(path: Path) -> int:
    """Make a file DCP wrote private whatever the umask (0600: a checkpoint file others can
    write is never loaded, one others can read gives the weights away), fsync it; return its
    CRC-32."""
    os.chmod(path, 0o600)
    return crc32_file(path, fsync=True)


def _own_files(directory: Path, rank: int) -> list[tuple[int, str]]:
    found = []
    for name in os.listdir(directory):
        m = _OWN_FILE_RE.match(name)
        if m and int(m.group(1)) == rank:
            found.append((int(m.group(2)), name))
    return sorted(found)


def _remove_stale(directory: Path, rank: int) -> None:
    stale = [name for _, name in _own_files(directory, rank)]
    if rank == 0:
        stale += [_METADATA, _METADATA + ".tmp"]
    for name in stale:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / name)
