"""The integrations' callbacks in one process: without rvsup they do nothing; Lightning's SLURM
auto-requeue is found and turned off with a warning that names why; a Trainer's checkpoint no
marker names is removed before training."""

from __future__ import annotations

import importlib.util
import signal
from pathlib import Path

import pytest

LIGHTNING = pytest.mark.skipif(
    importlib.util.find_spec("lightning") is None or importlib.util.find_spec("torch") is None,
    reason="needs lightning and torch (the integrations extra)",
)
TRANSFORMERS = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None,
    reason="needs transformers and torch (the integrations extra)",
)


@pytest.fixture(autouse=True)
def _no_rvsup(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("RVSUP_ENDPOINT", "RVSUP_CHECKPOINT_DIR"):
        monkeypatch.delenv(name, raising=False)


@LIGHTNING
@pytest.mark.filterwarnings("ignore::UserWarning:lightning.*")
def test_lightnings_slurm_auto_requeue_is_turned_off_with_a_warning_naming_why() -> None:
    """A Trainer given SLURMEnvironment(auto_requeue=True): disable_auto_requeue turns it off,
    warns once (rvsup requeues itself), and then Lightning registers no SIGUSR1 handler."""
    from lightning.fabric.plugins.environments.slurm import SLURMEnvironment
    from lightning.pytorch import Trainer

    from worker_sdk.integrations.lightning import REQUEUE_WARNING, disable_auto_requeue

    environment = SLURMEnvironment(auto_requeue=True)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        plugins=[environment],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    with pytest.warns(RuntimeWarning, match="auto-requeue is turned off") as caught:
        assert disable_auto_requeue(trainer)
    assert [str(w.message) for w in caught] == [REQUEUE_WARNING]
    assert "\n" not in REQUEUE_WARNING
    assert environment.auto_requeue is False
    assert not disable_auto_requeue(trainer)  # off already: nothing to say
    before = signal.getsignal(signal.SIGUSR1)
    trainer._signal_connector.register_signal_handlers()
    try:
        assert signal.getsignal(signal.SIGUSR1) is before
    finally:
        trainer._signal_connector.teardown()


@LIGHTNING
def test_the_lightning_callback_does_nothing_without_rvsup() -> None:
    """No RVSUP_* environment: the callback is disabled and its hooks return at once."""
    from worker_sdk.integrations.lightning import RvsupCallback

    callback = RvsupCallback()
    assert not callback.enabled
    callback.setup(None, None, "fit")  # type: ignore[arg-type]
    callback.on_train_batch_end(None, None, None, None, 0)  # type: ignore[arg-type]


@TRANSFORMERS
def test_the_transformers_callback_does_nothing_without_rvsup() -> None:
    """No RVSUP_* environment: the callback is disabled and its hooks return at once."""
    from worker_sdk.integrations.transformers import RvsupCallback

    callback = RvsupCallback()
    assert not callback.enabled
    callback.on_init_end(None, None, None)  # type: ignore[arg-type]
    callback.on_step_end(None, None, None)  # type: ignore[arg-type]
    callback.on_save(None, None, None)  # type: ignore[arg-type]


@TRANSFORMERS
def test_trainer_folders_no_marker_names_are_removed_before_training(tmp_path: Path) -> None:
    """Resuming from checkpoint-15: checkpoint-20 (a save a kill interrupted: no marker) is
    removed, the older folders and other files stay; on a fresh start every checkpoint-N goes."""
    from worker_sdk.integrations.transformers import _remove_unmarked

    for name in ("checkpoint-10", "checkpoint-15", "checkpoint-20", "runs"):
        (tmp_path / name).mkdir()
    (tmp_path / "checkpoint-20" / "model.safetensors").write_bytes(b"torn")
    _remove_unmarked(tmp_path, str(tmp_path / "checkpoint-15"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-10", "checkpoint-15", "runs"]
    _remove_unmarked(tmp_path, None)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["runs"]
