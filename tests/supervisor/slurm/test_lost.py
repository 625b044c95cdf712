"""How a lost node is established without a cluster: Slurm's node records and configuration
parsed, and real TCP connections to a slurmd's address (a listening socket, a closed port)."""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator

import pytest

from supervisor.slurm import lost
from supervisor.slurm import text as slurm_text

SHOW_NODE = (
    "NodeName=node1 Arch=x86_64 CoresPerSocket=1 CPUAlloc=2 CPUTot=4 NodeAddr=10.200.0.11 "
    "NodeHostName=node1 Version=22.05.8 OS=Linux 6.18.44 #1 SMP RealMemory=1 State=MIXED\n"
    "NodeName=node2 Arch=x86_64 NodeAddr=127.0.0.1 NodeHostName=node2 Port=6820 "
    "OS=Linux 6.18.44 State=DOWN*+NOT_RESPONDING\n"
    "NodeName=node3 Arch=x86_64 State=IDLE\n"  # no address: left to the probe step
)


def test_node_addresses_and_ports() -> None:
    """Each node's slurmd address; its own port where scontrol shows one, else the cluster's."""
    assert slurm_text.parse_node_addresses(SHOW_NODE, 6818) == {
        "node1": ("10.200.0.11", 6818),
        "node2": ("127.0.0.1", 6820),
    }


@pytest.mark.parametrize(
    ("config", "port"),
    [
        ("SlurmctldPort           = 6817\nSlurmdPort              = 6818\n", 6818),
        ("SlurmdPort = 7000", 7000),
        ("SlurmdTimeout = 300 sec\n", None),
    ],
)
def test_slurmd_port(config: str, port: int | None) -> None:
    """Each row: scontrol show config -> SlurmdPort (None where it is not said)."""
    assert slurm_text.parse_slurmd_port(config) == port


@pytest.fixture
def listening() -> Iterator[int]:
    """A port on which something accepts connections (a live slurmd's stand-in)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        yield server.getsockname()[1]


@pytest.fixture
def closed() -> int:
    """A port nothing listens on (a node whose slurmd died)."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        return int(server.getsockname()[1])


def test_a_dead_slurmd_is_found_at_once_and_a_live_one_is_not(listening: int, closed: int) -> None:
    """Real connections, all at once: the node whose port refuses is lost, and says so; the
    node that accepts is not; the answer takes milliseconds, not the bound."""
    t0 = time.monotonic()
    found = lost.slurmd_unreachable(
        {"alive": ("127.0.0.1", listening), "dead": ("127.0.0.1", closed)}, 2.0
    )
    took = time.monotonic() - t0
    assert found == {
        "dead": f"slurmd at 127.0.0.1:{closed} refused the connection (no slurmd listens)"
    }
    assert took < 1.0, took


def test_an_address_that_does_not_resolve_is_a_lost_node() -> None:
    """A node whose address cannot be resolved is lost, with the resolver's word."""
    found = lost.slurmd_unreachable({"gone": ("no-such-host.invalid", 6818)}, 0.5)
    assert list(found) == ["gone"] and "does not resolve" in found["gone"]


def test_no_nodes_no_connections() -> None:
    """Nothing to probe: nothing lost, at once."""
    assert lost.slurmd_unreachable({}, 5.0) == {}


def test_a_slurmd_that_does_not_answer_is_lost_at_the_bound() -> None:
    """A listener whose queue is full drops new connections unanswered, as a machine that is
    gone does: the node is lost once the bound (0.5 s here) has passed, and no later."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(0)
        port = server.getsockname()[1]
        held = [socket.socket() for _ in range(3)]  # fill its queue
        try:
            for sock in held:
                sock.setblocking(False)
                sock.connect_ex(("127.0.0.1", port))
            t0 = time.monotonic()
            found = lost.slurmd_unreachable({"gone": ("127.0.0.1", port)}, 0.5)
            took = time.monotonic() - t0
        finally:
            for sock in held:
                sock.close()
    assert found == {"gone": f"slurmd at 127.0.0.1:{port} did not answer within 0.5 s"}
    assert 0.5 <= took < 1.5, took
