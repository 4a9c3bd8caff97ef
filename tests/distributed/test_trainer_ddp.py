"""Our Trainer on 2 real processes (gloo) equals one process trained on the global batch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strategies import DDPStrategy
from tests.helpers.models import DropoutRegressor, RegressionData, TinyRegressor
from tests.helpers.rank_checks import RankAgreement, SaveAtEnd, max_param_diff
from trainer import Trainer, seed_everything

pytestmark = pytest.mark.timeout(180)


def _fit(tmp_path: Path, devices: int, batch_size: int, strategy: Any, **kwargs: Any) -> tuple[TinyRegressor, Trainer]:
    torch.manual_seed(0)
    model = TinyRegressor(optimizer="adam", lr=0.02)
    agreement = RankAgreement()
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=2, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, callbacks=[agreement], **kwargs)
    trainer.fit(model, datamodule=RegressionData(batch_size=batch_size, global_order=devices == 1))
    return model, trainer


@pytest.mark.parametrize("strategy_kwargs", [
    {},                                                     # default buckets
    pytest.param({"bucket_cap_mb": 1e-5, "first_bucket_cap_mb": 1e-5},   # one bucket per parameter
                 marks=pytest.mark.conformance),
    pytest.param({"gradient_as_bucket_view": False}, marks=pytest.mark.conformance),
])
def test_ddp_equals_single_process_on_global_batch(tmp_path: Path, strategy_kwargs: dict[str, Any]) -> None:
    single, _ = _fit(tmp_path, 1, 16, "single")
    ddp, trainer = _fit(tmp_path, 2, 8, DDPStrategy(**strategy_kwargs))
    agreement = trainer.callbacks[0]
    assert agreement.world_size == 2 and agreement.max_rank_diff == 0.0
    assert max_param_diff(single, ddp) < 1e-5
    assert trainer.global_step == 8  # 64 samples / (2 ranks x 8) x 2 epochs


def test_ddp_with_accumulation_and_bf16(tmp_path: Path) -> None:
    single, _ = _fit(tmp_path, 1, 8, "single", accumulate_grad_batches=2, precision="bf16-mixed")
    ddp, trainer = _fit(tmp_path, 2, 4, "ddp", accumulate_grad_batches=2, precision="bf16-mixed")
    assert trainer.callbacks[0].max_rank_diff == 0.0
    assert max_param_diff(single, ddp) < 1e-2  # bf16 autocast: same math, rounding differs by batch split


def test_sync_dist_metrics_are_global(tmp_path: Path) -> None:
    _, single = _fit(tmp_path, 1, 16, "single")
    _, ddp = _fit(tmp_path, 2, 8, "ddp")
    assert float(ddp.callback_metrics["val_loss"]) == pytest.approx(float(single.callback_metrics["val_loss"]), rel=1e-5)


def _fit_dropout(tmp_path: Path, max_epochs: int, ckpt_path: str | None = None,
                 save_to: Path | None = None) -> DropoutRegressor:
    seed_everything(3)
    model = DropoutRegressor()
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", max_epochs=max_epochs, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      default_root_dir=tmp_path, callbacks=[SaveAtEnd(save_to)] if save_to else None)
    trainer.fit(model, datamodule=RegressionData(batch_size=8, shuffle=True), ckpt_path=ckpt_path)
    return model


@pytest.mark.conformance
def test_workers_are_seeded_and_resume_is_exact(tmp_path: Path) -> None:
    # Equality needs both: the seed reaching the spawned workers (the first halves agree) and
    # every rank's RNG stream restored from the checkpoint (the second halves agree).
    uninterrupted = _fit_dropout(tmp_path, 4)
    _fit_dropout(tmp_path, 2, save_to=tmp_path / "half.ckpt")
    resumed = _fit_dropout(tmp_path, 4, ckpt_path=str(tmp_path / "half.ckpt"))
    assert max_param_diff(uninterrupted, resumed) == 0.0
