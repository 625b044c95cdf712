"""The wire contract between the supervisor and the ranks.

Shared by both sides: the supervisor may import this module, the SDK never imports the
supervisor. Nothing here imports torch.

A message is one ZeroMQ frame::

    header (struct ``HEADER``) | payload (UTF-8 JSON object, often empty) | MAC (32 bytes)

A payload's values are scalars: strings, numbers (integers of at most 64 bits), booleans,
null; nothing a receiver could recurse into.

The MAC is keyed BLAKE2b-256 (BLAKE2's built-in MAC mode, RFC 7693) over header and payload,
keyed with the per-job secret: as strong as HMAC-SHA256 here and about five times cheaper
(~1.5 µs against ~8 µs per message on this Python), which matters on the rank's heartbeat path
and for a supervisor authenticating thousands of ranks a second. Receivers drop
(and count) anything that is too long, too short, badly tagged, wrongly authenticated, from
another attempt, or replayed (a sequence number not above the last one from that sender).
Nothing received is ever unpickled.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
import json
import os
import signal
import struct
from dataclasses import dataclass, field
from typing import Any, Final

# ---------------------------------------------------------------- stack dumps
DUMP_SIGNAL: Final = signal.SIGUSR2
"""The signal on which a rank writes every thread's stack (faulthandler, armed by resume())."""


def stacks_file(rank: int) -> str:
    """``rank-00001.stacks``: where rank ``rank`` writes its stacks in the diagnostics folder."""
    return f"rank-{rank:05d}.stacks"


FLIGHT_RECORDER_ENV: Final = ("TORCH_FR_BUFFER_SIZE", "TORCH_NCCL_TRACE_BUFFER_SIZE")
"""c10d's flight-recorder sizes (entries), the current name first; above 0 it records."""
FLIGHT_RECORDER_ENTRIES: Final = 2000
"""The size rvsup gives the ranks when the job sets neither variable (0 there turns it off)."""


def flight_fifo_file(rank: int) -> str:
    """``rank-00001.flight.fifo``: a FIFO in the diagnostics folder; a byte written to it makes
    rank ``rank`` dump torch's flight recorder (see worker_sdk.runtime.flight)."""
    return f"rank-{rank:05d}.flight.fifo"


def flight_file(rank: int) -> str:
    """``rank-00001.flight.json``: rank ``rank``'s flight-recorder dump (torch's JSON)."""
    return f"rank-{rank:05d}.flight.json"


def step_slot_file(rank: int) -> str:
    """``rank-00001.step``: in the diagnostics folder, 8 bytes (signed, little-endian) that rank
    ``rank`` overwrites with its last finished step after every step (through a shared mapping:
    no syscall); -1 before the first. Whoever is on the rank's node reads it exactly."""
    return f"rank-{rank:05d}.step"


def read_step_slot(path: str | os.PathLike[str]) -> int | None:
    """The step in a step slot file, or None if it is missing or short."""
    try:
        with open(path, "rb") as f:
            data = f.read(8)
    except OSError:
        return None
    return int.from_bytes(data, "little", signed=True) if len(data) == 8 else None


# ---------------------------------------------------------------- environment variables
def node_name(slurmd_nodename: str | None, hostname: str) -> str:
    """The name this node is known by in failures and exclusions: the name Slurm gives it
    (``SLURMD_NODENAME``, set in every Slurm task's environment; what ``srun --exclude`` and
    ``ExcNodeList`` take) where set, else the host name up to its first dot (an FQDN's short
    name; an IP address stays whole)."""
    if slurmd_nodename and slurmd_nodename.strip():
        return slurmd_nodename.strip()
    host = hostname.strip()
    if not host or host.replace(".", "").isdigit() or ":" in host:
        return host
    return host.split(".", 1)[0] or host


ENV_ENDPOINT: Final = "RVSUP_ENDPOINT"  # ZeroMQ endpoint the ranks connect to
# on several nodes, set by the node wrapper for the node's agent: the path of the IPC socket it
# binds for the node's ranks (their RVSUP_ENDPOINT), in a directory the wrapper made for it
ENV_AGENT_SOCKET: Final = "RVSUP_AGENT_SOCKET"
# the node wrapper's cgroups (v2, and the v1 memory group where v2 has no memory controller),
# rvsup-node-PID: the node's processes are in them, its agent counts their OOM kills there
NODE_GROUP_PREFIX: Final = "rvsup-node-"
ENV_SECRET_FILE: Final = "RVSUP_SECRET_FILE"  # 0600 file holding the per-job secret
ENV_JOB: Final = "RVSUP_JOB"  # job name
ENV_ATTEMPT: Final = "RVSUP_ATTEMPT"  # attempt number, 1-based, across allocations
ENV_RUN_DIR: Final = "RVSUP_RUN_DIR"
ENV_CHECKPOINT_DIR: Final = "RVSUP_CHECKPOINT_DIR"  # also read standalone (no supervisor)
# "<device>:<inode>" of checkpoint_dir when `rvsup start` checked it: a directory put in its
# place since is refused at load and save (docs/security.md)
ENV_CHECKPOINT_DIR_ID: Final = "RVSUP_CHECKPOINT_DIR_ID"
ENV_CKPT_EVERY_STEPS: Final = "RVSUP_CKPT_EVERY_STEPS"  # 0: never by step count
ENV_CKPT_EVERY_S: Final = "RVSUP_CKPT_EVERY_S"  # standalone only; the supervisor drives time
ENV_KEEP_LAST: Final = "RVSUP_KEEP_LAST"
ENV_CKPT_ASYNC: Final = "RVSUP_CKPT_ASYNC"  # "1": asynchronous saves (background writer)
ENV_HEARTBEAT_INTERVAL: Final = "RVSUP_HEARTBEAT_INTERVAL"  # seconds, float
ENV_DIAGNOSTICS_DIR: Final = "RVSUP_DIAGNOSTICS_DIR"  # where stack dumps of this attempt go
ENV_DUMP_SIGNAL: Final = "RVSUP_DUMP_SIGNAL"  # signal number that makes a rank dump stacks
ENV_LAST_FAILURE: Final = "RVSUP_LAST_FAILURE"  # kind of the failure that ended the last attempt
ENV_OOM_COUNT: Final = "RVSUP_OOM_COUNT"  # OOM failures so far in this job
ENV_RESTART_COUNT: Final = "RVSUP_RESTART_COUNT"  # restarts charged so far in this job
ENV_REPORT_EXIT: Final = "RVSUP_REPORT_EXIT"  # "1": the bootstrap reports how the rank ended
# after a rollback (an anomaly of the training): load no checkpoint of this step or later
ENV_RESUME_BEFORE: Final = "RVSUP_RESUME_BEFORE"
ENV_RESUME_AT: Final = "RVSUP_RESUME_AT"  # start no earlier than this step (the skip)
# set by resume() for the script: steps between the loaded checkpoint and the start it returned
ENV_SKIPPED_STEPS: Final = "RVSUP_SKIPPED_STEPS"
# the memory tier (docs/memory-tier.md): this node's snapshot directory of the job (absent: off),
# the interval ("auto" or a number of steps), and the snapshot step the supervisor chose to
# resume from (absent: none newer than the storage checkpoints)
ENV_MEMORY_DIR: Final = "RVSUP_MEMORY_DIR"
ENV_MEMORY_EVERY: Final = "RVSUP_MEMORY_EVERY"
ENV_MEMORY_RESUME: Final = "RVSUP_MEMORY_RESUME"
# set in a rank forked from the zygote whose snapshot writer was forked beside it: "FD PID"
# by fork_writer in worker_sdk/spawn/zygote_child.py
ENV_FORKED_WRITER: Final = "RVSUP_FORKED_WRITER"
ENV_VERIFY_EVERY: Final = "RVSUP_VERIFY_EVERY"  # compare the DDP replicas every N steps; 0: never


class UsageError(RuntimeError):
    """The script called the SDK in a way it refuses; the message says what to change.

    Under rvsup a rank that dies of it exits with
    :data:`worker_sdk.contract.protocol.EXIT_USAGE`, and the job gives up at once instead of
    restarting a script that would fail the same way. Public as ``worker_sdk.UsageError``;
    defined here, beside its exit code, and printed under that public name in a traceback
    (the supervisor finds the message by it: supervisor.rules.failures.USAGE_MARKER).
    """


UsageError.__module__ = "worker_sdk"

# ---------------------------------------------------------------- reserved rank exit codes
EXIT_OOM: Final = 86  # the SDK's exception hook saw torch.OutOfMemoryError
EXIT_USAGE: Final = 87  # the script called the SDK in a way it refuses (worker_sdk.UsageError)
EXIT_SYNC_TIMEOUT: Final = 88  # a coordinated save never got the supervisor's answer

# ---------------------------------------------------------------- limits
MAX_MESSAGE_BYTES: Final = 16 * 1024
PRINT_RANKS: Final = 64  # the ranks below this send STEP_PRINTS (the resume check's sample)
PRINT_WINDOW: Final = 16  # STEP_PRINTS: steps fingerprinted after each resume and save
MAC_BYTES: Final = 32
SECRET_BYTES: Final = 32
MAGIC: Final = b"RV2"  # RV1 was HMAC-SHA256
# magic, type, flags, rank, attempt, pid, seq, step, value
HEADER: Final = struct.Struct("<3sBBxxxiIIQqd")
FLAG_STOP: Final = 1  # SAVE_AT / SYNC_REQUEST: exit after the save


class Kind(enum.IntEnum):
    """Message types. Values below 20 travel rank -> supervisor, the rest the other way."""

    HELLO = 1  # payload: host, local_rank, world_size, total_steps, stdout, stderr (file paths)
    # step: last finished step; value: longest step (s) since the last heartbeat;
    # payload: loss (float, finite), when the script passes one to step(); comm_wait_s (float,
    # under DDP: what the newest sampled step waited in the gradient all-reduce after its own
    # backward, for stragglers; absent when no step was sampled since the last heartbeat)
    HEARTBEAT = 2
    SYNC = 3  # step: last finished step; the rank waits for CONTINUE or SAVE_AT
    CKPT_COMMITTED = 4  # step; value: seconds; payload: path, bytes, mode, blocked_s (rank 0)
    CKPT_SKIPPED = 5  # payload: path, reason (a torn or corrupt checkpoint passed over)
    FAILURE = 6  # step; payload: kind ("oom" | "exception"), type, message
    PHASE = 7  # payload: name, begin (bool)
    EXITING = 8  # step; payload: reason; the rank leaves cleanly after a requested stop
    CKPT_BEGIN = 9  # step: a save started; hang detection allows for it
    # step: resume step; payload: path (or null on a fresh start), world_size (ranks that wrote
    # it, or null), resharded_from (that number when it differs from this job's, else null),
    # source ("memory" | "storage", null on a fresh start)
    LOADED = 10
    RANK_EXIT = 11  # from the rank's waiting parent; payload: pid, code, signal, host, last_step
    # step: the save that failed; payload: reason. A background write failed, or a synchronous
    # one on storage (ENOSPC, EIO): nothing of it is committed, the previous checkpoint stays,
    # training goes on
    CKPT_FAILED = 12
    # step: where a loss that is not finite was seen; value: it; payload: since (the first step
    # it may come from: the step itself for a float loss, the step after the previous heartbeat
    # for a tensor read there). Sent at once, not at the next heartbeat
    LOSS_NONFINITE = 13
    # from rank 0: step: where the replicas' parameter fingerprints differed; payload: ranks
    # (comma-separated, those that differ from the majority: all when there is none), since
    # (the step after the last check that agreed)
    REPLICAS_DIVERGED = 14
    # from rank 0: step; value: seconds; payload: path (rvsup's marker), external (the
    # framework's own checkpoint), bytes. Every rank reported that checkpoint durable
    # (worker_sdk.checkpointed) and rvsup's marker of it is committed: "bring your own checkpoint"
    CKPT_EXTERNAL = 15
    # from rank 0, at most once a second: the memory tier's snapshots so far in this attempt;
    # step: the newest complete one (-1: none); value: step() blocked by them (s); payload:
    # count, bytes (of the newest), interval (steps), failed (why the tier is off, or null)
    SNAPSHOTS = 16
    # the fingerprints of steps after a resume or a save, for the resume check (sent at
    # heartbeats, saves and the end; only by ranks below PRINT_RANKS); step: the first step of
    # losses; payload: losses (the steps' losses from step on, as repr()s joined by commas, ""
    # where step() was given none), params_step and params (a sampled checksum of the
    # registered modules' parameters at that step: the int64 bits of a float64, or null),
    # exact (bool: the values repeat bit for bit in a run that repeats the computation)
    STEP_PRINTS = 17
    # from a node agent (rank: agent_rank(node id)), every heartbeat interval; payload: node (its
    # name), beats (its ranks' heartbeats since its last beat: node_messages.NodeBeat)
    NODE_BEAT = 18
    # from a node agent, one per rank it was asked to look at: step: the request's number;
    # value: the window's length (s); payload: "of" (the rank) and the look's fields, as
    # supervisor.agent.wire writes them
    NODE_LOOK = 19
    SYNC_REQUEST = 20  # flags: FLAG_STOP; the rank enters sync mode at its next heartbeat
    CONTINUE = 21  # answer to SYNC: go on with the next step
    SAVE_AT = 22  # answer to SYNC: step S; save after finishing step S (FLAG_STOP: then exit)
    SYNC_CANCEL = 23  # answer to SYNC when no coordinated save is pending: leave sync mode
    # to a node agent: look at these ranks of your node; step: the request's number; value: the
    # window (s); flags: LOOK_DUMP, LOOK_NATIVE; payload: ranks ("RANK:PID,...")
    NODE_ASK = 24


def agent_rank(node_id: int) -> int:
    """The rank field of node ``node_id``'s agent's messages: negative, never a rank's."""
    return -1 - node_id


class ExitingReason(str, enum.Enum):
    """The ``reason`` of an EXITING message."""

    STOP = "stop requested"
    """The supervisor asked for a stop and the stop's checkpoint is committed."""
    END = "exit"
    """The training script ended (the interpreter is exiting)."""


_KINDS: Final = {int(k): k for k in Kind}  # a dict lookup: Kind(n) costs a microsecond


@dataclass(frozen=True, slots=True)
class Message:
    """One decoded, authenticated message."""

    kind: Kind
    rank: int
    attempt: int
    pid: int
    seq: int
    step: int = -1
    value: float = 0.0
    flags: int = 0
    payload: dict[str, Any] = field(default_factory=dict)


class BadMessageError(ValueError):
    """Raised by :func:`decode` with the reason a frame was dropped."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


def encode(
    key: bytes,
    kind: Kind,
    *,
    rank: int,
    attempt: int,
    pid: int,
    seq: int,
    step: int = -1,
    value: float = 0.0,
    flags: int = 0,
    payload: dict[str, Any] | None = None,
) -> bytes:
    """Serialise and authenticate one message."""
    body = HEADER.pack(MAGIC, int(kind), flags, rank, attempt, pid, seq, step, value)
    if payload:
        body += json.dumps(payload, separators=(",", ":")).encode()
    return body + mac(key, body)


def decode(key: bytes, frame: bytes) -> Message:
    """Check and decode one frame; raise :class:`BadMessageError` saying why it is dropped."""
    if len(frame) > MAX_MESSAGE_BYTES:
        raise BadMessageError("oversized")
    if len(frame) < HEADER.size + MAC_BYTES:
        raise BadMessageError("truncated")
    body, tag = frame[:-MAC_BYTES], frame[-MAC_BYTES:]
    if not hmac.compare_digest(tag, mac(key, body)):
        raise BadMessageError("unauthenticated")
    magic, kind, flags, rank, attempt, pid, seq, step, value = HEADER.unpack_from(body)
    if magic != MAGIC:
        raise BadMessageError("bad magic")
    k = _KINDS.get(kind)
    if k is None:
        raise BadMessageError("unknown kind")
    payload: dict[str, Any] = {}
    if len(body) > HEADER.size:
        try:
            loaded = json.loads(body[HEADER.size :])
        except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
            raise BadMessageError("bad payload") from None
        if not isinstance(loaded, dict) or not all(map(_is_scalar, loaded.values())):
            raise BadMessageError("bad payload")
        payload = loaded
    return Message(k, rank, attempt, pid, seq, step, value, flags, payload)


def _is_scalar(value: object) -> bool:
    """A payload value: a string, float, boolean, null or an integer of at most 64 bits."""
    if isinstance(value, int) and not isinstance(value, bool):
        return -(2**63) <= value < 2**64
    return value is None or isinstance(value, str | float | bool)


def mac(key: bytes, body: bytes) -> bytes:
    """The message authentication code of ``body`` under the per-job ``key``."""
    return hashlib.blake2b(body, key=key, digest_size=MAC_BYTES).digest()


def new_secret() -> bytes:
    return os.urandom(SECRET_BYTES)


def write_secret(path: str, secret: bytes) -> None:
    """Write the secret to a new 0600 file (replacing an old one atomically)."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, secret.hex().encode())
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_secret(path: str) -> bytes:
    """Read the secret; refuse a file that others can read or write."""
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        if st.st_mode & 0o077:
            raise PermissionError(f"{path}: secret file must not be accessible to others")
        data = os.read(fd, 4 * SECRET_BYTES)
    finally:
        os.close(fd)
    return bytes.fromhex(data.decode().strip())
