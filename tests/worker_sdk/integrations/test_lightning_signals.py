"""The Lightning callback puts back only the signal handlers Lightning set for ``fit``: rvsup's
stack dumps on SIGUSR2, registered in between (``resume()``), survive; Lightning's own
teardown would have set SIGUSR2 back to its default, and the signal asking a hung rank for its
stacks killed it (found by the chaos campaign's Lightning shape)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.harness import REPO, rvsup_env

pytest.importorskip("lightning")

SCRIPT = """
import faulthandler, os, signal, sys
from types import SimpleNamespace
from lightning.pytorch.trainer.connectors.signal_connector import _SignalConnector
from worker_sdk.integrations.lightning import put_back_signals

trainer = SimpleNamespace(_accelerator_connector=SimpleNamespace(cluster_environment=None))
connector = _SignalConnector(trainer)
before = signal.getsignal(signal.SIGTERM)
connector.register_signal_handlers()  # fit begins
assert signal.getsignal(signal.SIGTERM) is not before
dump = open(sys.argv[1], "w")
faulthandler.register(signal.SIGUSR2, file=dump, all_threads=True)  # resume(): stack dumps
put_back_signals(connector)  # on_train_start
assert signal.getsignal(signal.SIGTERM) is before
os.kill(os.getpid(), signal.SIGUSR2)
print("alive", flush=True)
"""


def test_stack_dumps_survive_the_signal_handlers_put_back(tmp_path: Path) -> None:
    """After the handlers are put back, SIGTERM's is the one from before ``fit``; SIGUSR2
    then writes the stacks and the process goes on (with Lightning's ``teardown()`` in
    ``put_back_signals``' place, it is killed by SIGUSR2 and writes nothing)."""
    dump = tmp_path / "stacks"
    res = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(dump)],
        cwd=REPO,
        env=rvsup_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert res.returncode == 0 and "alive" in res.stdout, (res.returncode, res.stderr[-3000:])
    assert "most recent call first" in dump.read_text()
