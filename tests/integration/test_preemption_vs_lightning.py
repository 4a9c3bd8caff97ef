"""SIGTERM during a fit, one process, the same unchanged `pytorch_lightning` module and callback under
Lightning's Trainer and ours: the same batch is the last, the same hooks run around the stop, with the
same `received_sigterm`, and no epoch-end or fit-end hooks run after it. What differs on purpose: ours
writes the preemption checkpoint first (so `on_save_checkpoint` runs once) and exits with code 75
(`Preempted`) where Lightning raises `SIGTERMException` (exit status 0) and saves nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

pl = pytest.importorskip("pytorch_lightning")

from strategies.preemption import Preempted  # noqa: E402
from tests.helpers.preemption import SignalAtStepSteps  # noqa: E402
from trainer import Trainer  # noqa: E402

NOTICE_STEP = 3
WATCHED = ("on_train_batch_start", "on_train_batch_end", "on_validation_start", "on_train_epoch_end",
           "on_train_end", "on_fit_end", "on_save_checkpoint", "on_exception")


class SelfSignalled(SignalAtStepSteps, pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net, self.notice_at = nn.Linear(4, 1), NOTICE_STEP

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
        return DataLoader(TensorDataset(x, x.sum(1, keepdim=True)), batch_size=8)

    def val_dataloader(self) -> DataLoader:
        return self.train_dataloader()


class Recorder(pl.Callback):
    def __init__(self) -> None:
        self.calls: list[tuple[str, int, bool]] = []

    def __getattribute__(self, name: str) -> Any:
        if name in WATCHED:
            def record(trainer: Any, *args: Any, **kwargs: Any) -> None:
                object.__getattribute__(self, "calls").append((name, trainer.global_step, trainer.received_sigterm))
            return record
        return object.__getattribute__(self, name)


def _run(trainer_class: Any, tmp_path: Path) -> tuple[list[tuple[str, int, bool]], BaseException]:
    recorder = Recorder()
    trainer = trainer_class(accelerator="cpu", devices=1, max_epochs=2, val_check_interval=2, logger=False,
                            enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                            num_sanity_val_steps=0, default_root_dir=tmp_path, callbacks=[recorder])
    torch.manual_seed(0)
    with pytest.raises(SystemExit) as stopped:
        trainer.fit(SelfSignalled())
    return recorder.calls, stopped.value


def test_the_stop_matches_lightnings_own_sigterm_handling(tmp_path: Path) -> None:
    theirs, their_exit = _run(pl.Trainer, tmp_path / "lightning")
    ours, our_exit = _run(Trainer, tmp_path / "ours")
    assert type(their_exit).__name__ == "SIGTERMException" and isinstance(our_exit, Preempted)
    assert our_exit.code == 75 and our_exit.checkpoint_path == str(tmp_path / "ours" / "preempted.ckpt")
    # ours writes its checkpoint at the stop: the one intended difference in the hooks
    assert [call for call in ours if call[0] == "on_save_checkpoint"] == [("on_save_checkpoint", NOTICE_STEP + 1, True)]
    assert [call for call in ours if call[0] != "on_save_checkpoint"] == theirs
    # the notified batch ends and its due validation runs; then the exception, nothing at epoch or fit end
    assert theirs[-3:] == [("on_train_batch_end", NOTICE_STEP + 1, True), ("on_validation_start", NOTICE_STEP + 1, True),
                           ("on_exception", NOTICE_STEP + 1, True)]
