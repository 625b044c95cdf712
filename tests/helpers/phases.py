"""The suite's two phases (registered by tests/conftest.py; docs/development.md).

``tests/run.sh`` runs the suite twice over: ``--phase shared`` selects every test that can share
the machine with another one, run on several processes by pytest-xdist (``-n N --dist
loadgroup``); ``--phase serial`` selects the tests marked ``serial`` (a wall-clock bound), run
one at a time. A test marked ``kills_daemon`` (a daemon killed, or what a killed one left looked
at) runs in the first phase where each pytest process is in a cgroup of its own
(tests/helpers/cgroup_scope.py: an ``rvsup start`` ends what is left in the groups of dead
daemons beside its own, and there those are only its own process's), and in the serial phase
where it is not. Without ``--phase`` every test is selected; under xdist a serial test is then
skipped, saying how to run it, rather than run beside another; ``--phase serial`` refuses ``-n``.

The Slurm tests share one test cluster, which only one process of the machine may run at a
time. Under ``--dist loadgroup`` the controller's scheduler is this module's: every test is a
unit of work of its own but the Slurm tests, which are one unit, given whole to one worker (the
largest unit first), to run one after the other beside the other workers' tests. (xdist's own
``xdist_group`` marker is lost under pytest 9: its workers rename ``item._nodeid``, which pytest
9 no longer reads.) Under any other ``--dist`` the Slurm tests are skipped, saying why.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.helpers.cgroup_scope import in_own_group

SHARED, SERIAL = "shared", "serial"
KILLS_DAEMON = "kills_daemon"
SLURM_UNIT = "tests/slurm/"  # the nodeids of the Slurm tests start so, and name their unit


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=(SHARED, SERIAL),
        default=None,
        help="shared: only the tests that can run beside others (for -n 3 --dist loadgroup); "
        "serial: only the tests marked serial; default: all",
    )


def is_serial(item: pytest.Item) -> bool:
    """Whether ``item`` must run alone on the machine (see the module)."""
    if item.get_closest_marker(SERIAL) is not None:
        return True
    return item.get_closest_marker(KILLS_DAEMON) is not None and not in_own_group()


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("phase") == SERIAL and config.getoption("numprocesses", None):
        raise pytest.UsageError("--phase serial runs its tests one at a time: leave out -n")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the phase's tests (the rest are reported as deselected); under xdist, skip the
    serial ones without a phase, and the Slurm ones but under ``--dist loadgroup``."""
    phase = config.getoption("phase")
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: another runs beside it
        _as_worker(items, skip_serial=phase is None, grouped=config.getoption("loadgroup"))
    if phase is None:
        return
    keep = [item for item in items if is_serial(item) == (phase == SERIAL)]
    if len(keep) < len(items):
        kept = set(keep)
        config.hook.pytest_deselected(items=[item for item in items if item not in kept])
        items[:] = keep


def _as_worker(items: list[pytest.Item], *, skip_serial: bool, grouped: bool) -> None:
    alone = pytest.mark.skip(reason="serial: runs alone (python -m pytest --phase serial)")
    apart = pytest.mark.skip(reason="the Slurm test cluster: one worker only (--dist loadgroup)")
    for item in items:
        if skip_serial and is_serial(item):
            item.add_marker(alone)
        elif item.get_closest_marker("slurm") is not None and not grouped:
            item.add_marker(apart)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """(xdist controller, ``--dist loadgroup``) Every test its own unit, the Slurm tests one."""
    if config.getoption("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SlurmTogether(LoadScopeScheduling):  # type: ignore[misc]  # xdist has no type hints
        def _split_scope(self, nodeid: str) -> str:
            return SLURM_UNIT if nodeid.startswith(SLURM_UNIT) else nodeid

    return SlurmTogether(config, log)
