"""The messages between the daemon and a node's agent (``supervisor.agent``): the agent is
alive, look at these ranks, what it saw of one. Read and written by :mod:`.messages`; an
agent's messages carry the rank field ``protocol.agent_rank(node_id)``."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

from .protocol import Kind, Message

__all__ = [
    "LOOK_DUMP",
    "LOOK_NATIVE",
    "NodeAsk",
    "NodeBeat",
    "NodeLook",
    "node_fields",
    "read_node",
]

LOOK_DUMP = 1  # NODE_ASK's flag: a hang was declared: collect the ranks' stacks for the record
LOOK_NATIVE = 2  # NODE_ASK's flag, with LOOK_DUMP: native stacks too, where py-spy is installed


@dataclass(frozen=True, slots=True)
class NodeBeat:
    """``node``'s agent is alive (every heartbeat interval), with the heartbeats its node's
    ranks sent it since its last beat: ``beats`` holds one entry per rank, separated by ";",
    each "RANK,PID,STEP,LONGEST_S,AGE_MS,LOSS,COMM_WAIT_S" (the heartbeat's fields, LOSS and
    COMM_WAIT_S empty when it had none; AGE_MS how long the agent held it); and ``steps``, the
    ranks whose step slot (``protocol.step_slot_file``) changed since its last beat, as
    "RANK:STEP" entries separated by "," (each rank's exact last finished step). And its node's
    health: the kernel's OOM kills of the node's processes since the agent started (-1: not
    known), ``oom_host_wide`` empty when they are counted in the node's own memory cgroup, else
    why the host's counter (every process's kills) is read; the memory available (bytes, -1:
    not known)."""

    KIND: ClassVar = Kind.NODE_BEAT
    node: str
    beats: str = ""
    steps: str = ""
    oom_kills: int = -1
    oom_host_wide: str = ""
    memory_available: int = -1


@dataclass(frozen=True, slots=True)
class NodeAsk:
    """Look at ``ranks`` ("RANK:PID,...") over ``window_s``; with ``dump``, collect their
    stacks for a declared hang instead (``native``: native stacks too)."""

    KIND: ClassVar = Kind.NODE_ASK
    request: int
    ranks: str
    window_s: float
    dump: bool = False
    native: bool = False


@dataclass(frozen=True, slots=True)
class NodeLook:
    """What the agent saw of rank ``of`` for ``request`` over ``window_s``: its state letter,
    CPU time used, main thread's wait channel, other threads ("NAME\\tSTATE\\tWCHAN" lines),
    whether its stacks were asked for, whether it was stopped, the stacks it wrote, its
    native stacks (py-spy's, or why there are none) when they were asked for, and the collective
    its flight recorder showed under way ("" none)."""

    KIND: ClassVar = Kind.NODE_LOOK
    request: int
    of: int
    window_s: float
    state: str | None = None
    cpu_s: float | None = None
    wchan: str = ""
    threads: str = ""
    stack_read: bool = False
    stopped: bool = False
    stacks: str = ""
    native: str = ""
    collective: str = ""


_COLLECTIVE_MAX = 200  # characters of a look's collective under way (a name and two numbers)


def _str(value: object, default: str = "") -> str:
    return value if isinstance(value, str) else default


def _count(value: object) -> int:
    """A count of 0 or more; -1 for anything else (not known)."""
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else -1


def read_node(msg: Message) -> NodeBeat | NodeAsk | NodeLook | None:
    """The node message ``msg`` carries; None when it is of another kind."""
    d, kind = msg.payload, msg.kind
    if kind is Kind.NODE_BEAT:
        return NodeBeat(
            _str(d.get("node")),
            _str(d.get("beats")),
            _str(d.get("steps")),
            _count(d.get("oom_kills")),
            _str(d.get("oom_host_wide")),
            _count(d.get("memory_available")),
        )
    if kind is Kind.NODE_ASK:
        dump, native = bool(msg.flags & LOOK_DUMP), bool(msg.flags & LOOK_NATIVE)
        return NodeAsk(msg.step, _str(d.get("ranks")), msg.value, dump, native)
    if kind is not Kind.NODE_LOOK:
        return None
    of, cpu = d.get("of"), d.get("cpu_s")
    return NodeLook(
        msg.step,
        of if isinstance(of, int) and not isinstance(of, bool) else -1,
        msg.value,
        d.get("state") if isinstance(d.get("state"), str) else None,
        float(cpu) if isinstance(cpu, int | float) and not isinstance(cpu, bool) else None,
        _str(d.get("wchan")),
        _str(d.get("threads")),
        d.get("stack_read") is True,
        d.get("stopped") is True,
        _str(d.get("stacks")),
        _str(d.get("native")),
        _str(d.get("collective"))[:_COLLECTIVE_MAX],
    )


def node_fields(
    body: NodeBeat | NodeAsk | NodeLook,
) -> tuple[Kind, int, float, int, dict[str, Any]]:
    """What goes on the wire for ``body``: kind, step, value, flags, payload."""
    match body:
        case NodeBeat():
            return (
                Kind.NODE_BEAT,
                -1,
                0.0,
                0,
                {
                    "node": body.node,
                    "beats": body.beats,
                    "steps": body.steps,
                    "oom_kills": body.oom_kills,
                    "oom_host_wide": body.oom_host_wide,
                    "memory_available": body.memory_available,
                },
            )
        case NodeAsk(request, ranks, window_s, dump, native):
            flags = (LOOK_DUMP if dump else 0) | (LOOK_NATIVE if native else 0)
            return Kind.NODE_ASK, request, window_s, flags, {"ranks": ranks}
        case NodeLook():
            payload = {
                "of": body.of,
                "state": body.state,
                "cpu_s": body.cpu_s,
                "wchan": body.wchan,
                "threads": body.threads,
                "stack_read": body.stack_read,
                "stopped": body.stopped,
                "stacks": body.stacks,
                "native": body.native,
                "collective": body.collective[:_COLLECTIVE_MAX],
            }
            return Kind.NODE_LOOK, body.request, body.window_s, 0, payload
