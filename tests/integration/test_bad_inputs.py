"""Bad inputs not covered elsewhere: each gives one clear message, fails fast, loses nothing.

The full catalogue, with the test covering each entry, is docs/bad-inputs.md.
"""

from __future__ import annotations

import subprocess
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from strategies import DDPStrategy
from strategies.checkpoint_io import CheckpointError
from strategies.sampler import distribute_dataloader
from tests.helpers.models import DropoutRegressor, RegressionData, TinyRegressor
from tests.helpers.spawn import free_port
from trainer import Trainer

ROOT = Path(__file__).resolve().parents[2]


def _trainer(tmp_path: Path, **kwargs: Any) -> Trainer:
    defaults = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=tmp_path, max_epochs=1)
    return Trainer(**{**defaults, **kwargs})


def test_checkpoint_of_another_model_names_the_keys(tmp_path: Path) -> None:
    trainer = _trainer(tmp_path)
    trainer.fit(DropoutRegressor(), datamodule=RegressionData())
    trainer.save_checkpoint(tmp_path / "other.ckpt")
    with pytest.raises(CheckpointError, match=r"other.ckpt' does not fit TinyRegressor .*unexpected: hidden.0.bias"):
        _trainer(tmp_path).fit(TinyRegressor(), datamodule=RegressionData(), ckpt_path=str(tmp_path / "other.ckpt"))


def test_missing_checkpoint_fails_before_any_worker(tmp_path: Path) -> None:
    started = time.monotonic()
    with pytest.raises(CheckpointError, match="ckpt_path='nope.ckpt' does not exist"):
        _trainer(tmp_path, devices=2, strategy="ddp").fit(TinyRegressor(), datamodule=RegressionData(),
                                                          ckpt_path="nope.ckpt")
    assert time.monotonic() - started < 2  # no process was started


def test_dataset_smaller_than_the_world() -> None:
    loader = DataLoader(TensorDataset(torch.ones(1, 2)), batch_size=1)
    with pytest.raises(ValueError, match=r"1 sample\(s\) but there are 2 processes"):
        distribute_dataloader(loader, num_replicas=2, rank=0)


def test_val_check_interval_longer_than_the_epoch(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="val_check_interval=100 batches exceeds the 8 training batches"):
        _trainer(tmp_path, val_check_interval=100).fit(TinyRegressor(), datamodule=RegressionData())


def test_training_step_returning_garbage(tmp_path: Path) -> None:
    class Garbage(TinyRegressor):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            return "loss"

    with pytest.raises(TypeError, match="training_step returned a str; expected a loss tensor"):
        _trainer(tmp_path).fit(Garbage(), datamodule=RegressionData())


@pytest.mark.timeout(60)
def test_unreachable_master_address_fails_in_seconds(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    port = free_port()  # nothing listens there: 127.0.0.1 only, never another host
    for key, value in dict(RANK="1", LOCAL_RANK="1", WORLD_SIZE="2", LOCAL_WORLD_SIZE="2", GROUP_RANK="0",
                           MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), TORCHELASTIC_RUN_ID="test").items():
        monkeypatch.setenv(key, value)
    started = time.monotonic()
    with pytest.raises(RuntimeError, match=rf"\[rank: 1\] could not initialise the process group .*MASTER_PORT={port}"):
        _trainer(tmp_path, devices=2, strategy=DDPStrategy(timeout=timedelta(seconds=2), accelerator="cpu")).fit(
            TinyRegressor(), datamodule=RegressionData())
    assert time.monotonic() - started < 20
    assert not torch.distributed.is_initialized()


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("overrides", "message"), [
    (["ckpt_path=/no/such.ckpt"], "ckpt_path='/no/such.ckpt' does not exist"),
    (["data.batch_size=0"], "batch_size=0 must be >= 1"),
    (["trainer.accelerator=cuda"], "no CUDA device is visible") if not torch.cuda.is_available() else
    (["trainer.devices=999", "trainer.accelerator=cuda"], "devices"),
])
def test_cli_bad_inputs_are_one_line_exit_2(overrides: list[str], message: str, tmp_path: Path) -> None:
    result = subprocess.run([sys.executable, "-m", "trainer", *overrides, f"hydra.run.dir={tmp_path}/run"],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr
    assert not (tmp_path / "run" / "checkpoints").exists()  # no worker ran, nothing was written
