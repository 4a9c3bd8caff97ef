"""Single-process fault handling: non-finite gradients, unreadable checkpoints, restarts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer
from trainer.callbacks import Callback, DivergenceGuard, ModelCheckpoint


class NaNAtStep(TinyRegressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step == 3 else loss


def _trainer(tmp_path: Path, **kwargs: Any) -> Trainer:
    defaults = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, default_root_dir=tmp_path, max_epochs=1)
    return Trainer(**{**defaults, **kwargs})


def test_nonfinite_gradients_raise_naming_step_and_rank(tmp_path: Path) -> None:
    with pytest.raises(FloatingPointError, match=r"step 3, epoch 0: .*non-finite on rank\(s\) \[0\]"):
        _trainer(tmp_path).fit(NaNAtStep(), datamodule=RegressionData())


def test_nonfinite_gradients_can_be_skipped(tmp_path: Path) -> None:
    model = NaNAtStep()
    with pytest.warns(UserWarning, match="step 3: non-finite gradients, optimizer step skipped"):
        _trainer(tmp_path, on_nonfinite="skip", max_steps=6).fit(model, datamodule=RegressionData())
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters())


class NaNInOneGradient(TinyRegressor):
    """Step 2's gradient of the first parameter gets a NaN after the reduction: written into the
    gradient itself (with our DDP, a slice of a flat bucket) or put there as a new tensor."""

    def __init__(self, replace: bool) -> None:
        super().__init__()
        self.replace = replace

    def on_after_backward(self) -> None:
        if self.global_step != 2:
            return
        param = next(self.parameters())
        if self.replace:
            param.grad = torch.full_like(param, float("nan"))
        else:
            param.grad.view(-1)[-1] = float("nan")


@pytest.mark.parametrize("replace", [False, True], ids=["written-in-place", "replaced"])
@pytest.mark.parametrize("strategy", ["ddp", "auto"])
def test_a_single_nonfinite_gradient_is_found(tmp_path: Path, strategy: str, replace: bool) -> None:
    """Our DDP checks its flat buckets instead of each gradient when they hold exactly the gradients;
    a NaN in one element, or a gradient the user replaced (no longer in a bucket), is still found."""
    with pytest.raises(FloatingPointError, match=r"step 2, epoch 0: .*every rank's loss was finite"):
        _trainer(tmp_path, strategy=strategy, devices=1).fit(NaNInOneGradient(replace), datamodule=RegressionData())


class BucketsHoldTheGradients(Callback):
    """Right before each optimizer step (after the non-finite check): do the strategy's flat buffers stand
    for the optimizer's gradients?"""

    def __init__(self) -> None:
        self.answers: list[bool] = []

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Any) -> None:
        grads = [p.grad for group in optimizer.param_groups for p in group["params"] if p.grad is not None]
        self.answers.append(trainer.strategy.gradient_buffers(grads) is not None)


@pytest.mark.parametrize(("strategy", "expected"), [("ddp", True), ("auto", False)])
def test_the_check_reads_the_buckets_under_our_ddp(tmp_path: Path, strategy: str, expected: bool) -> None:
    spy = BucketsHoldTheGradients()
    _trainer(tmp_path, strategy=strategy, devices=1, callbacks=[spy]).fit(TinyRegressor(), datamodule=RegressionData())
    assert spy.answers and set(spy.answers) == {expected}


def test_divergence_guard_passes_on_one_process(tmp_path: Path) -> None:
    guard = DivergenceGuard(every_n_steps=2)
    _trainer(tmp_path, callbacks=[guard]).fit(TinyRegressor(), datamodule=RegressionData())
    assert guard.checks == 4  # steps 2, 4, 6, 8
    with pytest.raises(ValueError, match="every_n_steps"):
        DivergenceGuard(every_n_steps=0)


def test_last_skips_an_unreadable_checkpoint(tmp_path: Path) -> None:
    checkpoints = tmp_path / "ckpts"
    trainer = _trainer(tmp_path, callbacks=[ModelCheckpoint(dirpath=checkpoints, save_top_k=-1)],
                       enable_checkpointing=True)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    broken = checkpoints / "newer.ckpt"
    broken.write_bytes(b"not a checkpoint")
    os.utime(broken, (1e10, 1e10))  # newest by far
    resumed = _trainer(tmp_path, callbacks=[ModelCheckpoint(dirpath=checkpoints)], enable_checkpointing=True,
                       max_epochs=2)
    with pytest.warns(UserWarning, match="skipping unreadable .*newer.ckpt"):
        resumed.fit(TinyRegressor(), datamodule=RegressionData(), ckpt_path="last")
    assert resumed.global_step == 16  # continued from the end of epoch 0 (8 steps), not from scratch


def test_restarted_group_resumes_from_last_by_itself(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    checkpoints = tmp_path / "ckpts"
    _trainer(tmp_path, callbacks=[ModelCheckpoint(dirpath=checkpoints)], enable_checkpointing=True).fit(
        TinyRegressor(), datamodule=RegressionData())
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    trainer = _trainer(tmp_path, callbacks=[ModelCheckpoint(dirpath=checkpoints)], enable_checkpointing=True,
                       max_epochs=2)
    trainer.fit(TinyRegressor(), datamodule=RegressionData())
    assert trainer.global_step == 16
