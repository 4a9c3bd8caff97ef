"""The training step reads no tensor value on the host (#18): on a GPU each such read makes the host
wait for the device. With the default Trainer (on_nonfinite="error", telemetry, a progress bar, a
logger) and a module that logs with prog_bar=True every step, values are read only on the steps
that write to the loggers (log_every_n_steps), never on the others. A TorchFunctionMode sees every
read: `.item()`, `bool()`, `float()`, `int()`, `.tolist()`, `.numpy()`, `.cpu()`."""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils.data import DataLoader, TensorDataset

from trainer import LightningModule, Trainer
from trainer.callbacks import Callback

_HOST_READS = {torch.Tensor.item, torch.Tensor.__bool__, torch.Tensor.__float__, torch.Tensor.__int__,
               torch.Tensor.__index__, torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu}
EVERY = 10


class _CountReads(TorchFunctionMode):
    def __init__(self) -> None:
        super().__init__()
        self.step: int | None = None  # the batch being counted, None between batches
        self.reads: Counter[int] = Counter()

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        if self.step is not None and func in _HOST_READS:
            self.reads[self.step] += 1
        return func(*args, **(kwargs or {}))


class _Arm(Callback):
    """Counts from the start of batch 2 to the start of the last batch (the epoch's end reads); what
    happens after a batch's hooks (writing to the loggers) counts for that batch."""

    def __init__(self, mode: _CountReads, batches: int) -> None:
        self.mode, self.batches = mode, batches

    def on_train_batch_start(self, trainer: Any, pl_module: Any, batch: Any, batch_idx: int) -> None:
        self.mode.step = batch_idx if 2 <= batch_idx < self.batches - 1 else None


class _Logs(LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(8, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = nn.functional.mse_loss(self.layer(batch[0]), batch[1])
        self.log("train_loss", loss, prog_bar=True)
        self.log("scaled", loss * 2, on_step=True, on_epoch=True)
        return loss

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.01)


@pytest.mark.parametrize("on_nonfinite", ["error", "ignore"])
def test_steps_read_values_only_when_they_write_to_the_loggers(tmp_path: Path, on_nonfinite: str) -> None:
    batches = 40
    mode = _CountReads()
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=str(tmp_path),
                      log_every_n_steps=EVERY, on_nonfinite=on_nonfinite, callbacks=[_Arm(mode, batches)])
    data = TensorDataset(torch.randn(batches * 4, 8), torch.randn(batches * 4, 1))
    with mode:
        trainer.fit(_Logs(), DataLoader(data, batch_size=4))
    logging_steps = {step for step in range(2, batches - 1) if (step + 1) % EVERY == 0}
    assert set(mode.reads) <= logging_steps, dict(mode.reads)
    assert logging_steps <= set(mode.reads)  # the counter does see the reads that happen
    assert float(trainer.callback_metrics["train_loss"]) > 0 and "scaled_epoch" in trainer.callback_metrics


def test_nonfinite_gradients_are_still_found_and_named_when_read_later(tmp_path: Path) -> None:
    class NaNAtStep(_Logs):
        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            loss = super().training_step(batch, batch_idx)
            return loss * float("nan") if batch_idx in (13, 15) else loss

    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, default_root_dir=str(tmp_path), logger=False,
                      enable_progress_bar=False, log_every_n_steps=EVERY)
    data = TensorDataset(torch.randn(80, 8), torch.randn(80, 1))
    with pytest.raises(FloatingPointError, match=r"step 13, epoch 0: .*non-finite on rank\(s\) \[0\]"):
        trainer.fit(NaNAtStep(), DataLoader(data, batch_size=4))  # found at step 19, where values are read
    assert trainer.global_step == 20 and not list(tmp_path.rglob("*.ckpt"))  # raised at step 19's logging
