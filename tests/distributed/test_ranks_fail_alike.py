"""Every rank raising the same exception at the same point gives the caller rank 0's own exception (#37).

A check every rank makes at one point (the non-finite check, a user's assertion on synced values) fails on
all ranks within moments; whichever rank is first, the caller should see the exception its own code raised,
as under Lightning's launcher, not a WorkerFailedError about rank 1 or an interruption of rank 0's last
moment (strategies/stage_watch.py gives rank 0 a short grace for that).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies.worker_failure import WorkerFailedError
from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer

pytestmark = pytest.mark.timeout(180)


class SameCheckFails(TinyRegressor):
    """At step 2 both ranks fail the same check; rank 0 a moment after rank 1 (`lag_s`)."""

    def __init__(self, lag_s: float) -> None:
        super().__init__()
        self.lag_s = lag_s

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == 2:
            if self.global_rank == 0:
                time.sleep(self.lag_s)
            raise ValueError("the synced batch statistics are out of range at step 2")
        return super().training_step(batch, batch_idx)


class OnlyRankOneFails(TinyRegressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        if self.global_step == 2 and self.global_rank == 1:
            raise ValueError("rank 1's own trouble")
        return super().training_step(batch, batch_idx)


def _fit(tmp_path: Path, model: TinyRegressor) -> None:
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path)
    trainer.fit(model, datamodule=RegressionData(batch_size=8))


def test_rank_zero_failing_the_same_check_a_moment_later_raises_its_own_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="out of range at step 2"):
        _fit(tmp_path, SameCheckFails(lag_s=0.2))


def test_a_failure_of_rank_one_alone_is_still_the_workers(tmp_path: Path) -> None:
    with pytest.raises(WorkerFailedError, match="rank 1's own trouble"):  # rank 0 waits in the all-reduce
        _fit(tmp_path, OnlyRankOneFails())
