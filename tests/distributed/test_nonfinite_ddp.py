"""The non-finite check on 2 real processes, where the shared-memory transport gives its verdict (#37).

Averaging in place, every rank looks at the share it summed and the ranks' counts meet in shared memory, so
the check reads no gradient at all (trainer.nonfinite.total_norm is never called on the caller's rank 0).
It must still name the first bad step and the rank whose loss went bad, and still see a gradient written
after the reduction (the verdict no longer covers it, so the check reads it). "Not finite" is one bit for the
whole pass: it must not condemn an optimizer whose own gradients were finite (a NaN outside it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

import trainer.nonfinite as nonfinite
from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer

pytestmark = pytest.mark.timeout(180)


class NaNLossOnRankZero(TinyRegressor):
    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss = super().training_step(batch, batch_idx)
        return loss * float("nan") if self.global_step == 3 and self.global_rank == 0 else loss


class NaNWrittenAfterTheReduction(TinyRegressor):
    """At step 2 every rank writes a NaN into the averaged weight gradient itself, in place."""

    def on_after_backward(self) -> None:
        if self.global_step == 2:
            self.layer.weight.grad.view(-1)[0] = float("nan")


class NaNOutsideTheOptimizer(TinyRegressor):
    """An extra parameter the optimizer does not hold; its gradient (only its) is NaN at step 2."""

    def __init__(self) -> None:
        super().__init__()
        self.aux = nn.Parameter(torch.zeros(1))
        self.aux.register_hook(lambda grad: grad * float("nan") if self.global_step == 2 else grad)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x) + self.aux

    def configure_optimizers(self) -> Any:
        return torch.optim.SGD(self.layer.parameters(), lr=self.hparams.lr)


class NaNWrittenThroughData(TinyRegressor):
    """At step 2 every rank writes a NaN into the averaged weight gradient through `.data` (old-style code: a
    tensor on the same memory with a version counter of its own)."""

    def on_after_backward(self) -> None:
        if self.global_step == 2:
            self.layer.weight.grad.data.view(-1)[0] = float("nan")


@pytest.fixture
def norms_read(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many times rank 0 (this process) read gradients to check them."""
    calls: list[int] = []
    original = nonfinite.total_norm

    def counting(grads: list[torch.Tensor]) -> torch.Tensor:
        calls.append(len(grads))
        return original(grads)

    monkeypatch.setattr(nonfinite, "total_norm", counting)
    return calls


def _fit(tmp_path: Path, model: TinyRegressor, **kwargs: Any) -> Trainer:
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, **kwargs)
    trainer.fit(model, datamodule=RegressionData(batch_size=8))
    return trainer


def test_the_transport_verdict_names_the_step_and_rank_without_reading_gradients(
        tmp_path: Path, norms_read: list[int]) -> None:
    with pytest.raises(FloatingPointError, match=r"step 3, epoch 0: .*non-finite on rank\(s\) \[0\]"):
        _fit(tmp_path, NaNLossOnRankZero())
    assert norms_read == []


def test_a_clean_fit_reads_no_gradient_to_check_them(tmp_path: Path, norms_read: list[int]) -> None:
    trainer = _fit(tmp_path, TinyRegressor())
    assert trainer.global_step == 4 and norms_read == []


def test_a_gradient_written_after_the_reduction_is_still_checked(tmp_path: Path, norms_read: list[int]) -> None:
    with pytest.raises(FloatingPointError, match=r"step 2, epoch 0: .*every rank's loss was finite"):
        _fit(tmp_path, NaNWrittenAfterTheReduction())
    assert norms_read == [2]  # the step whose gradient changed, read once; the others had the verdict


def test_skip_uses_the_verdict_too(tmp_path: Path, norms_read: list[int]) -> None:
    model = NaNLossOnRankZero()
    with pytest.warns(UserWarning, match="step 3: non-finite gradients, optimizer step skipped"):
        _fit(tmp_path, model, on_nonfinite="skip")
    assert all(bool(torch.isfinite(p).all()) for p in model.parameters()) and norms_read == []


def test_a_nan_outside_the_optimizer_does_not_fail_its_step(tmp_path: Path) -> None:
    model = NaNOutsideTheOptimizer()
    trainer = _fit(tmp_path, model)
    assert trainer.global_step == 4 and bool(torch.isfinite(model.layer.weight).all())


@pytest.mark.xfail(strict=True, reason="a write through `.data` bumps no version counter the verdict can see "
                   "(reported in the #37 review, not fixed)")
def test_a_nan_written_through_data_is_caught_at_its_step(tmp_path: Path) -> None:
    with pytest.raises(FloatingPointError, match=r"step 2, epoch 0: .*every rank's loss was finite"):
        _fit(tmp_path, NaNWrittenThroughData())
