"""Background checkpoint writes (async_checkpoint=True) in real fits: what each file holds is exactly the state
at its step, a failing write raises on the training side, and the switch reaches every entry point."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies import DDPStrategy, SingleDeviceStrategy
from strategies.checkpoint_io import CheckpointError
from tests.helpers.checkpoint_writers import (FingerprintAtSave, SlowCheckpointIO, direct_writes_work_in, fingerprint,
                                             record_direct_writes)
from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer
from trainer.callbacks import Callback, ModelCheckpoint

pytestmark = pytest.mark.timeout(180)


def _trainer(tmp_path: Path, strategy: Any, devices: int, callbacks: list[Any], **kwargs: Any) -> Trainer:
    return Trainer(accelerator="cpu", devices=devices, strategy=strategy, logger=False, enable_progress_bar=False,
                   enable_model_summary=False, default_root_dir=tmp_path, callbacks=callbacks, **kwargs)


class RegressorWithLargeState(TinyRegressor):
    """A checkpoint above the size written around the page cache (strategies/direct_write.py): a 40 MB
    buffer that every step changes."""

    def __init__(self) -> None:
        super().__init__(optimizer="adam")
        self.seen: torch.Tensor
        self.register_buffer("seen", torch.zeros(10 * 1024 * 1024))

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        self.seen[batch_idx::7919].add_(1.0)
        return super().training_step(batch, batch_idx)


@pytest.mark.parametrize("devices,model_class", [(2, TinyRegressor), (2, RegressorWithLargeState)])
def test_every_background_checkpoint_is_the_state_of_its_step(tmp_path: Path, devices: int,
                                                              model_class: type[TinyRegressor],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """Saving every step while training goes on, through a writer slower than a step: each file equals, tensor
    by tensor (weights, Adam state, RNG, loop counters, callback states), the checkpoint dict at its save;
    small checkpoints are written through the page cache, the large one around it."""
    recorder = FingerprintAtSave()
    checkpoints = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=1, save_top_k=-1,
                                  filename="{step}")
    strategy = DDPStrategy(async_checkpoint=True, checkpoint_io=SlowCheckpointIO(0.15))
    trainer = _trainer(tmp_path, strategy, devices, [recorder, checkpoints], max_epochs=3)
    model = TinyRegressor(optimizer="adam") if model_class is TinyRegressor else model_class()
    direct = record_direct_writes(monkeypatch)  # rank 0 writes, in this process
    trainer.fit(model, datamodule=RegressionData(batch_size=4, shuffle=True))
    files = sorted((tmp_path / "ckpt").glob("*.ckpt"))
    steps = trainer.global_step
    assert steps == 3 * 64 // (4 * devices) and len(files) == steps == len(recorder.by_step)
    for path in files:
        written = torch.load(path, weights_only=True)
        [at_save] = recorder.by_step[written["global_step"]]
        assert fingerprint(written) == at_save, path.name
    stats = trainer.strategy.checkpoint_stats
    assert stats.saves == stats.committed == steps
    large = model_class is RegressorWithLargeState and direct_writes_work_in(tmp_path)
    assert len(direct) == (steps if large else 0)
    assert stats.waits > 0  # a write slower than a step: the next save waited, and it was counted


@pytest.mark.conformance
def test_resume_from_a_background_checkpoint_trains_on_exactly(tmp_path: Path) -> None:
    """The last background checkpoint of a fit resumes to the same weights as a fit that never stopped."""
    def fit(max_steps: int, ckpt_path: str | None, root: Path) -> TinyRegressor:
        torch.manual_seed(0)
        model = TinyRegressor(optimizer="adam")
        checkpoints = ModelCheckpoint(dirpath=root, every_n_train_steps=2, save_top_k=1)
        strategy = DDPStrategy(async_checkpoint=True, checkpoint_io=SlowCheckpointIO(0.05))
        _trainer(root, strategy, 2, [checkpoints], max_steps=max_steps).fit(
            model, datamodule=RegressionData(batch_size=4, shuffle=True), ckpt_path=ckpt_path)
        return model

    straight = fit(12, None, tmp_path / "straight")
    fit(6, None, tmp_path / "stopped")
    [last] = list((tmp_path / "stopped").glob("*.ckpt"))  # top-1 rotation left one file, complete
    resumed = fit(12, str(last), tmp_path / "resumed")
    for a, b in zip(straight.parameters(), resumed.parameters()):
        assert torch.equal(a, b)


class _LockDirectoryAfterFirstSave(Callback):
    """Rank 0, at step 2 before its save, once step 1's checkpoint is on disk: the directory becomes unwritable
    (a real refusal by the file system: `chattr +i` as root, whom permission bits do not stop; read-only bits
    otherwise)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.locked = False

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.is_global_zero and not self.locked and trainer.global_step == 2:
            trainer.strategy.finish_checkpoints()
            _lock(self.directory)
            self.locked = True


def _lock(directory: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "+i", str(directory)], check=True)
    else:
        directory.chmod(0o500)


def _unlock(directory: Path) -> None:
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(directory)], check=False)
    directory.chmod(0o700)


@pytest.mark.parametrize("devices", [1, pytest.param(2, marks=pytest.mark.conformance)])
def test_an_unwritable_directory_fails_the_fit_naming_the_file_and_keeps_the_previous(tmp_path: Path,
                                                                                      devices: int) -> None:
    directory = tmp_path / "ckpt"
    directory.mkdir()
    checkpoints = ModelCheckpoint(dirpath=directory, every_n_train_steps=1, save_top_k=1, filename="{step}")
    strategy = DDPStrategy(async_checkpoint=True) if devices > 1 else SingleDeviceStrategy(async_checkpoint=True)
    # The lock runs before ModelCheckpoint (which is always last): step 2's save is the first to fail.
    trainer = _trainer(tmp_path, strategy, devices, [_LockDirectoryAfterFirstSave(directory), checkpoints],
                       max_steps=6)
    try:
        with pytest.raises(Exception) as raised:
            trainer.fit(TinyRegressor(optimizer="adam"), datamodule=RegressionData(batch_size=4))
    finally:
        _unlock(directory)
    message = str(raised.value)
    assert "step=2.ckpt" in message and ("Operation not permitted" in message or "Permission denied" in message)
    assert "background" in message
    assert sorted(os.listdir(directory)) == ["step=1.ckpt"]  # the previous one, whole; no temporary file
    assert torch.load(directory / "step=1.ckpt", weights_only=True)["global_step"] == 1


def test_trainer_save_checkpoint_returns_with_the_file_complete_unless_asked(tmp_path: Path) -> None:
    class SaveByHand(Callback):
        def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
            if trainer.global_step == 2:
                trainer.save_checkpoint(tmp_path / "by_hand.ckpt")  # async_checkpoint=True does not change this
                self.complete = (tmp_path / "by_hand.ckpt").is_file()
                trainer.save_checkpoint(tmp_path / "background.ckpt", background=True)
                self.background_pending = not (tmp_path / "background.ckpt").exists()

    by_hand = SaveByHand()
    strategy = SingleDeviceStrategy(async_checkpoint=True, checkpoint_io=SlowCheckpointIO(0.3))
    trainer = _trainer(tmp_path, strategy, 1, [by_hand], max_steps=3, enable_checkpointing=False)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    assert by_hand.complete and by_hand.background_pending
    assert torch.load(tmp_path / "background.ckpt", weights_only=True)["global_step"] == 2  # finished by fit end


@pytest.mark.parametrize("package", ["lightning.pytorch", "pytorch_lightning"])
def test_lightnings_async_checkpoint_io_plugin_turns_the_switch_on(package: str) -> None:
    plugins = pytest.importorskip(f"{package}.plugins")
    trainer = Trainer(accelerator="cpu", strategy="ddp", devices=2, plugins=[plugins.AsyncCheckpointIO()])
    assert trainer.strategy.async_checkpoint is True
    assert Trainer(accelerator="cpu").strategy.async_checkpoint is False  # the default: off (docs/checkpoints.md)
    with pytest.raises(ValueError, match=r"AsyncCheckpointIO\(checkpoint_io=.*DDPStrategy\(checkpoint_io"):
        Trainer(plugins=[plugins.AsyncCheckpointIO(_ForeignIO(plugins))])
    Trainer(plugins=plugins.AsyncCheckpointIO(plugins.TorchCheckpointIO()))  # Lightning's own writer: ours replaces it
    with pytest.raises(ValueError, match=r"Trainer\(plugins=.*only AsyncCheckpointIO"):
        Trainer(plugins=[plugins.TorchCheckpointIO()])


def _ForeignIO(plugins: Any) -> Any:
    class ForeignIO(plugins.TorchCheckpointIO):  # a user's own: its module is not Lightning's
        pass

    return ForeignIO()


def test_the_hydra_key_reaches_the_strategy() -> None:
    from hydra import compose, initialize_config_dir

    from trainer.cli import command as cli

    with initialize_config_dir(config_dir=cli.config_dir(), version_base="1.3"):
        for choice, extra in (("ddp", []), ("single", ["trainer.devices=1"])):
            cfg = compose(config_name="config", overrides=[f"strategy={choice}", "strategy.async_checkpoint=true",
                                                           *extra, "paths.output_dir=/tmp/unused"])
            assert cli.construct("strategy", cfg.strategy).async_checkpoint is True
            default = compose(config_name="config", overrides=[f"strategy={choice}", *extra,
                                                               "paths.output_dir=/tmp/unused"])
            assert cli.construct("strategy", default.strategy).async_checkpoint is False


def test_lightning_ddp_strategy_writes_in_the_background_inside_lightnings_trainer(tmp_path: Path) -> None:
    """Our plug-in in Lightning's own Trainer: each file equals the checkpoint dict at its save although the
    writer (Lightning's TorchCheckpointIO, slowed down) runs after later steps, and top-k rotation left one."""
    lp = pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.plugins import TorchCheckpointIO as LightningTorchIO

    from strategies.lightning.unified import LightningDDPStrategy
    from tests.helpers.lightning_unified import UnifiedRegressor

    class SlowLightningIO(LightningTorchIO):
        def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any = None) -> None:
            import time

            time.sleep(0.1)
            super().save_checkpoint(checkpoint, path, storage_options)

    class Recorder(lp.Callback):
        def __init__(self) -> None:
            self.by_step: dict[int, Any] = {}

        def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
            self.by_step[trainer.global_step] = fingerprint(checkpoint)

    lp.seed_everything(0, verbose=False)
    recorder = Recorder()
    strategy = LightningDDPStrategy(async_checkpoint=True, checkpoint_io=SlowLightningIO())
    every = lp.callbacks.ModelCheckpoint(dirpath=tmp_path / "all", every_n_train_steps=1, save_top_k=-1,
                                         filename="{step}")
    trainer = lp.Trainer(accelerator="cpu", devices=1, strategy=strategy, max_steps=5, logger=False,
                         enable_progress_bar=False, enable_model_summary=False, default_root_dir=tmp_path,
                         callbacks=[recorder, every])
    try:
        trainer.fit(UnifiedRegressor())
    finally:
        if torch.distributed.is_initialized():  # Lightning keeps its group of one after fit
            torch.distributed.destroy_process_group()
    files = sorted((tmp_path / "all").glob("*.ckpt"))
    assert len(files) == 5 == len(recorder.by_step)
    for path in files:
        written = torch.load(path, weights_only=False)
        assert fingerprint(written) == recorder.by_step[written["global_step"]], path.name
    assert trainer.strategy.checkpoint_io.stats.waits > 0  # a write slower than a step: counted
