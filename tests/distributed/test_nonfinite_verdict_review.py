"""Review of #37: the transport's finite verdict (strategies/finite_verdict.py) read by the Trainer's non-finite
check, on 2 real processes, against what the check gave before it (a norm over the optimizer's gradients).

The verdict is one bit for the whole pass: "not finite" says some averaged gradient was, not which one, so it
must not condemn gradients that were finite (a parameter outside the optimizer). And it is kept only while
the covered gradients are unchanged, which it learns from their version counters.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from tests.helpers.models import RegressionData, TinyRegressor
from trainer import Trainer

pytestmark = pytest.mark.timeout(180)


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


def _fit(tmp_path: Path, model: TinyRegressor, **kwargs: Any) -> Trainer:
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, **kwargs)
    trainer.fit(model, datamodule=RegressionData(batch_size=8))
    return trainer


def test_a_nan_outside_the_optimizer_does_not_fail_its_step(tmp_path: Path) -> None:
    model = NaNOutsideTheOptimizer()
    trainer = _fit(tmp_path, model)
    assert trainer.global_step == 4 and bool(torch.isfinite(model.layer.weight).all())


@pytest.mark.xfail(strict=True, reason="a write through `.data` bumps no version counter the verdict can see "
                   "(reported in the #37 review, not fixed)")
def test_a_nan_written_through_data_is_caught_at_its_step(tmp_path: Path) -> None:
    with pytest.raises(FloatingPointError, match=r"step 2, epoch 0: .*every rank's loss was finite"):
        _fit(tmp_path, NaNWrittenThroughData())
