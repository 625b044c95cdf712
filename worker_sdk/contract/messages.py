"""One dataclass per message kind, read from and written to the wire in one place.

:mod:`.protocol` frames and authenticates a message (header, JSON payload of scalars, MAC) and
drops what is malformed; the dataclasses give each kind its fields, grouped by topic
(:mod:`.lifecycle_messages`: a rank's life; :mod:`.checkpoint_messages`: saves, loads and the
coordinated-save handshake; :mod:`.training_messages`: the training checks;
:mod:`.node_messages`: the daemon and the node agents), and this module
is the one registry that reads and writes them all (and the one place to import them from).
:func:`read` turns an authenticated :class:`~.protocol.Message` into its typed message, as
leniently as the supervisor always read payloads (a field of the wrong type reads as absent);
:func:`fields` is the way back, for :func:`encode`. Receivers dispatch on the class
(``match``), never on payload keys.
"""

from __future__ import annotations

import math
from typing import Any, TypeAlias

from . import protocol
from .checkpoint_messages import (
    CheckpointBegin,
    CheckpointCommitted,
    CheckpointExternal,
    CheckpointFailed,
    CheckpointSkipped,
    Continue,
    Loaded,
    SaveAt,
    Snapshots,
    Sync,
    SyncCancel,
    SyncRequest,
)
from .lifecycle_messages import Exiting, Failure, Heartbeat, Hello, Phase, RankExit
from .node_messages import NodeAsk, NodeBeat, NodeLook, node_fields, read_node
from .protocol import FLAG_STOP, Kind, Message
from .training_messages import LossNonFinite, ReplicasDiverged, StepPrints

__all__ = [
    "Body",
    "CheckpointBegin",
    "CheckpointCommitted",
    "CheckpointExternal",
    "CheckpointFailed",
    "CheckpointSkipped",
    "Continue",
    "Exiting",
    "Failure",
    "Heartbeat",
    "Hello",
    "Loaded",
    "LossNonFinite",
    "NodeAsk",
    "NodeBeat",
    "NodeLook",
    "Phase",
    "RankExit",
    "ReplicasDiverged",
    "SaveAt",
    "Snapshots",
    "StepPrints",
    "Sync",
    "SyncCancel",
    "SyncRequest",
    "encode",
    "fields",
    "read",
]


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _number(value: object) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _losses(value: object) -> tuple[float | None, ...]:
    """``STEP_PRINTS``' losses: repr()s joined by commas, empty where there is none; a value
    that is not a finite number reads as none."""
    if not isinstance(value, str) or not value:
        return ()
    out: list[float | None] = []
    for text in value.split(",")[:_MAX_PRINTS]:
        try:
            number = float(text) if text else None
        except ValueError:
            number = None
        out.append(number if number is not None and math.isfinite(number) else None)
    return tuple(out)


_MAX_PRINTS = 1024  # values read from one message at most (a frame holds fewer)

Body: TypeAlias = (
    Hello
    | Heartbeat
    | Sync
    | CheckpointBegin
    | CheckpointCommitted
    | CheckpointExternal
    | CheckpointFailed
    | CheckpointSkipped
    | Loaded
    | Failure
    | Phase
    | Exiting
    | RankExit
    | LossNonFinite
    | ReplicasDiverged
    | Snapshots
    | StepPrints
    | SyncRequest
    | Continue
    | SaveAt
    | SyncCancel
    | NodeBeat
    | NodeAsk
    | NodeLook
)


def read(msg: Message) -> Body:  # noqa: C901 -- one case per kind
    """The typed message an authenticated frame carries."""
    d, step, kind = msg.payload, msg.step, msg.kind
    if kind is Kind.HEARTBEAT:
        return Heartbeat(step, msg.value, _number(d.get("loss")), _number(d.get("comm_wait_s")))
    if kind is Kind.HELLO:
        total = _int(d.get("total_steps"))
        return Hello(
            step,
            None if "host" not in d else str(d["host"]),
            _int(d.get("local_rank")),
            _int(d.get("world_size")),
            total if total is not None and total > 0 else None,
            _str(d.get("stdout")),
            _str(d.get("stderr")),
        )
    if kind is Kind.SYNC:
        return Sync(step)
    if kind is Kind.CKPT_BEGIN:
        return CheckpointBegin(step)
    if kind is Kind.CKPT_COMMITTED:
        return CheckpointCommitted(
            step,
            msg.value,
            str(d.get("path", "")),
            _int(d.get("bytes")),
            _str(d.get("mode")),
            _number(d.get("blocked_s")),
        )
    if kind is Kind.CKPT_EXTERNAL:
        return CheckpointExternal(
            step,
            msg.value,
            str(d.get("path", "")),
            str(d.get("external", "")),
            _int(d.get("bytes")),
        )
    if kind is Kind.CKPT_FAILED:
        return CheckpointFailed(step, str(d.get("reason")))
    if kind is Kind.CKPT_SKIPPED:
        return CheckpointSkipped(str(d.get("path")), str(d.get("reason")))
    if kind is Kind.LOADED:
        path = d.get("path")
        return Loaded(
            step,
            None if path is None else str(path),
            _int(d.get("world_size")),
            _int(d.get("resharded_from")),
            _str(d.get("source")),
        )
    if kind is Kind.FAILURE:
        return Failure(
            step,
            str(d.get("kind", "exception")),
            str(d.get("type", "")),
            str(d.get("message", "")),
        )
    if kind is Kind.PHASE:
        name = d.get("name")
        return Phase(step, None if name is None else str(name), bool(d.get("begin")))
    if kind is Kind.EXITING:
        return Exiting(step, _str(d.get("reason")))
    if kind is Kind.RANK_EXIT:
        code, sig = d.get("code"), d.get("signal")
        well_formed = all(v is None or _int(v) is not None for v in (code, sig))
        return RankExit(
            _int(d.get("pid")) if well_formed else None,
            _int(code),
            _int(sig),
            _str(d.get("host")),
            _int(d.get("last_step")),
        )
    if kind is Kind.LOSS_NONFINITE:
        return LossNonFinite(step, msg.value, _int(d.get("since")))
    if kind is Kind.REPLICAS_DIVERGED:
        text = str(d.get("ranks", ""))
        ranks = tuple(int(r) for r in text.split(",") if r.isdecimal())
        return ReplicasDiverged(step, ranks, _int(d.get("since")))
    if kind is Kind.SNAPSHOTS:
        return Snapshots(
            step,
            msg.value,
            _int(d.get("count")),
            _int(d.get("bytes")),
            _int(d.get("interval")),
            _str(d.get("failed")),
        )
    if kind is Kind.STEP_PRINTS:
        params_step, params = _int(d.get("params_step")), _int(d.get("params"))
        return StepPrints(
            step,
            _losses(d.get("losses")),
            params_step if params is not None else None,
            params if params_step is not None else None,
            d.get("exact") is not False,
        )
    node = read_node(msg)
    if node is not None:
        return node
    stop = bool(msg.flags & FLAG_STOP)
    if kind is Kind.SYNC_REQUEST:
        return SyncRequest(stop)
    if kind is Kind.CONTINUE:
        return Continue()
    if kind is Kind.SAVE_AT:
        return SaveAt(step, stop)
    return SyncCancel()


def fields(body: Body) -> tuple[Kind, int, float, int, dict[str, Any] | None]:  # noqa: C901
    """What goes on the wire for ``body``: kind, step, value, flags, payload."""
    match body:
        case Heartbeat(step, longest, loss, wait):
            beat = {k: v for k, v in (("loss", loss), ("comm_wait_s", wait)) if v is not None}
            return Kind.HEARTBEAT, step, longest, 0, beat or None
        case Hello():
            payload: dict[str, Any] = {
                "host": body.host,
                "local_rank": body.local_rank,
                "world_size": body.world_size,
                "total_steps": body.total_steps,
                "stdout": body.stdout,
                "stderr": body.stderr,
            }
            return Kind.HELLO, body.step, 0.0, 0, payload
        case Sync(step) | CheckpointBegin(step):
            return body.KIND, step, 0.0, 0, None
        case CheckpointCommitted():
            payload = {
                "path": body.path,
                "bytes": body.nbytes,
                "mode": body.mode,
                "blocked_s": body.blocked_s,
            }
            return Kind.CKPT_COMMITTED, body.step, body.seconds, 0, payload
        case CheckpointExternal(step, seconds, path, external, nbytes):
            payload = {"path": path, "external": external, "bytes": nbytes}
            return Kind.CKPT_EXTERNAL, step, seconds, 0, payload
        case CheckpointFailed(step, reason):
            return Kind.CKPT_FAILED, step, 0.0, 0, {"reason": reason}
        case CheckpointSkipped(path, reason):
            return Kind.CKPT_SKIPPED, -1, 0.0, 0, {"path": path, "reason": reason}
        case Loaded(step, path, world_size, resharded_from, source):
            payload = {
                "path": path,
                "world_size": world_size,
                "resharded_from": resharded_from,
                "source": source,
            }
            return Kind.LOADED, step, 0.0, 0, payload
        case Failure(step, kind, type_, message):
            return Kind.FAILURE, step, 0.0, 0, {"kind": kind, "type": type_, "message": message}
        case Phase(step, name, begin):
            return Kind.PHASE, step, 0.0, 0, {"name": name, "begin": begin}
        case Exiting(step, reason):
            return Kind.EXITING, step, 0.0, 0, {"reason": reason}
        case RankExit():
            payload = {
                "pid": body.pid,
                "code": body.code,
                "signal": body.signal,
                "host": body.host,
                "last_step": body.last_step,
            }
            return Kind.RANK_EXIT, -1, 0.0, 0, payload
        case LossNonFinite(step, value, since):
            return Kind.LOSS_NONFINITE, step, value, 0, {"since": since}
        case ReplicasDiverged(step, ranks, since):
            payload = {"ranks": ",".join(map(str, ranks)), "since": since}
            return Kind.REPLICAS_DIVERGED, step, 0.0, 0, payload
        case Snapshots():
            payload = {
                "count": body.count,
                "bytes": body.nbytes,
                "interval": body.interval,
                "failed": body.failed,
            }
            return Kind.SNAPSHOTS, body.newest, body.blocked_s, 0, payload
        case StepPrints(first, losses, params_step, params, exact):
            payload = {
                "losses": ",".join("" if v is None else repr(v) for v in losses),
                "params_step": params_step,
                "params": params,
                "exact": exact,
            }
            return Kind.STEP_PRINTS, first, 0.0, 0, payload
        case SyncRequest(stop):
            return Kind.SYNC_REQUEST, -1, 0.0, FLAG_STOP if stop else 0, None
        case SaveAt(step, stop):
            return Kind.SAVE_AT, step, 0.0, FLAG_STOP if stop else 0, None
        case Continue() | SyncCancel():
            return body.KIND, -1, 0.0, 0, None
        case NodeBeat() | NodeAsk() | NodeLook():
            return node_fields(body)


def encode(key: bytes, body: Body, *, rank: int, attempt: int, pid: int, seq: int) -> bytes:
    """Serialise and authenticate ``body`` from ``rank`` (``-1``: to every rank)."""
    kind, step, value, flags, payload = fields(body)
    return protocol.encode(
        key,
        kind,
        rank=rank,
        attempt=attempt,
        pid=pid,
        seq=seq,
        step=step,
        value=value,
        flags=flags,
        payload=payload,
    )
