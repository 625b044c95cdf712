"""The ``.written-<rank>`` marker a save's writer leaves for the committing writer: JSON, with a MAC.

A marker says that a rank's part of a save is durable, and where its DCP items are in its file
(and, from rank 0 on the other nodes of a job, DCP's global metadata). It crosses the save's
temporary directory, and the network to the other nodes' writers. It is never unpickled: the
body is JSON (DCP's values through :mod:`.dcp_json`), and reading it checks, before anything
else, an HMAC-SHA256 under the job's secret over the save it belongs to (its temporary
directory's name, the rank) and the body; a marker of another save, another rank or another
hand is refused. Without rvsup (no job secret) the body is JSON all the same, with no MAC: the
directory it lies in is this user's private directory (:mod:`worker_sdk.checkpoint.trust`).

Layout: ``b"rvsup-marker-1\\n" + hex(mac) + b"\\n" + json``.
"""

from __future__ import annotations

import hmac
import json
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from torch.distributed.checkpoint.filesystem import _StorageInfo
    from torch.distributed.checkpoint.metadata import MetadataIndex

__all__ = ["MAX_BYTES", "Part", "job_key", "read", "write"]

_MAGIC: Final = b"rvsup-marker-1"
MAX_BYTES: Final = 256 << 20  # DCP's metadata of a large sharded model is megabytes, not more


@dataclass(frozen=True, slots=True)
class Part:
    """What one rank's marker says: where its DCP items are, its DCP file's CRC-32 (-1: none),
    and DCP's global metadata in :func:`.dcp_json.encode_metadata`'s form (rank 0's, for the
    other nodes; None elsewhere)."""

    where: list[tuple[MetadataIndex, _StorageInfo]]
    crc: int
    metadata: dict[str, Any] | None


def write(key: bytes, tmp_name: str, rank: int, part: Part) -> bytes:
    """The marker of ``rank``'s part of the save in the temporary directory ``tmp_name``."""
    where: list[Any] = []
    if part.where:  # DCP (and its import) only for sharded state
        from .dcp_json import encode_where

        where = encode_where(part.where)
    body = json.dumps(
        {
            "rank": rank,
            "tmp": tmp_name,
            "where": where,
            "crc": part.crc,
            "metadata": part.metadata,
        },
        separators=(",", ":"),
    ).encode()
    return b"\n".join((_MAGIC, _mac(key, tmp_name, rank, body).encode(), body))


def read(key: bytes, tmp_name: str, rank: int, data: bytes) -> Part:
    """The part a marker says, checked: raises ValueError (saying why) for anything that is not
    ``rank``'s marker of this save, written with ``key``."""
    if len(data) > MAX_BYTES:
        raise ValueError(f"a marker of {len(data)} bytes (at most {MAX_BYTES})")
    magic, mac, body = [*data.split(b"\n", 2), b"", b""][:3]
    if magic != _MAGIC:
        raise ValueError("not an rvsup marker")
    if not hmac.compare_digest(mac, _mac(key, tmp_name, rank, body).encode()):
        raise ValueError(f"the marker of rank {rank} fails its MAC (not this save's, or forged)")
    try:
        fields = json.loads(body)
    except (ValueError, RecursionError) as e:
        raise ValueError(f"the marker of rank {rank} is not JSON: {e}") from None
    if not isinstance(fields, dict) or set(fields) != {"rank", "tmp", "where", "crc", "metadata"}:
        raise ValueError(f"the marker of rank {rank} does not hold a part")
    if fields["rank"] != rank or fields["tmp"] != tmp_name:
        raise ValueError(f"the marker of rank {rank} names another save or rank")
    crc, metadata = fields["crc"], fields["metadata"]
    if isinstance(crc, bool) or not isinstance(crc, int) or not -1 <= crc < 2**32:
        raise ValueError(f"the marker of rank {rank} holds a bad CRC {crc!r}")
    if metadata is not None and not isinstance(metadata, dict):
        raise ValueError(f"the marker of rank {rank} holds bad metadata")
    if fields["where"] == []:
        return Part([], crc, metadata)
    from .dcp_json import decode_where

    return Part(decode_where(fields["where"]), crc, metadata)


def job_key() -> bytes:
    """The job's secret (under rvsup: ``RVSUP_SECRET_FILE``), which markers are signed with;
    b"" without rvsup."""
    from worker_sdk.contract.protocol import ENV_SECRET_FILE, read_secret

    path = os.environ.get(ENV_SECRET_FILE)
    if not path:
        return b""
    try:
        return read_secret(path)
    except (OSError, ValueError):
        return b""


def _mac(key: bytes, tmp_name: str, rank: int, body: bytes) -> str:
    if not key:
        return "-"  # no job secret (run without rvsup): the private directory is the guard
    digest = hmac.new(key, digestmod="sha256")
    for frame in (_MAGIC, tmp_name.encode(), str(rank).encode(), body):
        digest.update(len(frame).to_bytes(8, "little"))
        digest.update(frame)
    return digest.hexdigest()
