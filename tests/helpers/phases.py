"""The suite's two phases (registered by tests/conftest.py; docs/development.md).

``tests/run.sh`` runs the suite twice over: ``--phase shared`` selects every test that can share
the machine with another one, run on two processes by pytest-xdist (``-n 2 --dist loadgroup``);
``--phase serial`` selects the tests marked ``serial`` (a wall-clock bound, or a daemon killed or
what a killed one left: any ``rvsup start`` ends what is left in the groups of dead daemons),
run one at a time. Without ``--phase`` every test is selected; under xdist a serial test is then
skipped, saying how to run it, rather than run beside another; ``--phase serial`` refuses ``-n``.

The Slurm tests share one test cluster, which only one process of the machine may run at a
time: under xdist they are one group (``xdist_group``), which ``--dist loadgroup`` gives to one
worker, to run one after the other beside the other worker's tests; under any other ``--dist``
they are skipped, saying why.
"""

from __future__ import annotations

import pytest

SHARED, SERIAL = "shared", "serial"
SLURM_GROUP = "slurm-testbed"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--phase",
        choices=(SHARED, SERIAL),
        default=None,
        help="shared: only the tests that can run beside others (for -n 2 --dist loadgroup); "
        "serial: only the tests marked serial; default: all",
    )


def is_serial(item: pytest.Item) -> bool:
    """Whether ``item`` must run alone on the machine (see the module)."""
    return item.get_closest_marker(SERIAL) is not None


def pytest_configure(config: pytest.Config) -> None:
    if config.getoption("phase") == SERIAL and config.getoption("numprocesses", None):
        raise pytest.UsageError("--phase serial runs its tests one at a time: leave out -n")


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Keep the phase's tests (the rest are reported as deselected); under xdist, put the Slurm
    tests in one group, and skip the serial ones without a phase."""
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
        elif item.get_closest_marker("slurm") is not None:
            item.add_marker(pytest.mark.xdist_group(SLURM_GROUP) if grouped else apart)
