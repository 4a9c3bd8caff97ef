"""A preemption notice (SIGTERM, SIGUSR1) to one rank, every rank or the launching process: every
rank stops after the same step, one checkpoint is written, the launch exits with code 75, and the
next fit in the same directory resumes from it and ends bit-identical to an uninterrupted run."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from strategies import DDPStrategy
from strategies.preemption import PREEMPTED_EXIT_CODE, Preempted
from tests.helpers.models import DropoutRegressor, RegressionData
from tests.helpers.preemption import NoticeAtStep
from trainer import Trainer, seed_everything

pytestmark = pytest.mark.timeout(240)
EPOCHS = 3  # 64 samples, 2 ranks x 8 per batch: 4 steps per epoch, 12 in all


def _fit(model: Any, root: Path, **strategy_kwargs: Any) -> Trainer:
    trainer = Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(**strategy_kwargs), max_epochs=EPOCHS,
                      logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=root)
    trainer.fit(model, datamodule=RegressionData(batch_size=8, shuffle=True))
    return trainer


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> dict[str, torch.Tensor]:
    seed_everything(11)
    model = DropoutRegressor()
    _fit(model, tmp_path_factory.mktemp("uninterrupted"))
    return {key: value.clone() for key, value in model.state_dict().items()}


def _preempt_then_resume(root: Path, step: int, to: str, signal_name: str = "SIGTERM") -> tuple[Preempted, Any]:
    seed_everything(11)
    with pytest.raises(Preempted) as stopped:
        _fit(NoticeAtStep(step, to, signal_name, launcher_pid=os.getpid()), root)
    checkpoint = torch.load(root / "preempted.ckpt", weights_only=True)
    seed_everything(11)
    resumed = NoticeAtStep(step, to, signal_name, launcher_pid=os.getpid())
    trainer = _fit(resumed, root)
    assert trainer.global_step == 4 * EPOCHS
    assert not (root / "preempted.ckpt").exists(), "a completed fit removes the checkpoint it resumed from"
    return stopped.value, (checkpoint, resumed)


@pytest.mark.parametrize(("step", "to", "signal_name"), [
    (5, "rank1", "SIGTERM"),     # mid-epoch, one rank
    (5, "all", "SIGUSR1"),       # every rank, SLURM's signal
    (6, "launcher", "SIGTERM"),  # the launching process only (Kubernetes signals the main process)
    (2, "rank0", "SIGTERM"),     # the agreed step is an epoch's last batch: stops between epochs
])
def test_notice_checkpoints_and_resumes_bit_exactly(tmp_path: Path, uninterrupted: dict[str, torch.Tensor],
                                                    step: int, to: str, signal_name: str) -> None:
    notice, (checkpoint, resumed) = _preempt_then_resume(tmp_path, step, to, signal_name)
    assert notice.code == PREEMPTED_EXIT_CODE and notice.signal_name == signal_name
    ours = checkpoint["loops"]["ddp_trainer"]
    assert ours["preemption"]["signal"] == signal_name
    stopped_after = checkpoint["global_step"]
    assert step + 1 <= stopped_after <= step + 2, "at most the step in flight and one more run before the stop"
    if step == 2:
        assert ours["batch_in_epoch"] == 0 and checkpoint["epoch"] == 1, "stopped between epochs"
    for key, value in uninterrupted.items():
        assert torch.equal(value, resumed.state_dict()[key]), key
