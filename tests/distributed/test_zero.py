"""ZeRO stage 1 (`DDPStrategy(zero_stage=1)`) against plain DDP (`zero_stage=0`), 2 real processes on CPU.

Each rank steps only its even shard of every bucket (cut through parameters), then the shards are
all-gathered: the weights after fit must equal zero_stage=0's bit for bit (the update is elementwise, the
gradients are the same all-reduced ones, the clip norm is computed over the same whole gradients), while
each rank's optimizer holds about half the state.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from strategies import DDPStrategy
from tests.helpers.zero_models import ZeroNet, zero_data
from trainer import Trainer
from trainer.callbacks import ModelCheckpoint

pytestmark = pytest.mark.timeout(240)
_MODEL_KEYS = ("optimizer", "scheduler", "manual")


def _fit(zero_stage: int, tmp_path: Path | None = None, devices: int = 2, find_unused: bool = False,
         ckpt_path: str | None = None, callbacks: list[Any] | None = None, max_epochs: int = 2,
         **kwargs: Any) -> tuple[ZeroNet, Trainer]:
    model = ZeroNet(**{key: kwargs.pop(key) for key in _MODEL_KEYS if key in kwargs})
    # Tiny buckets: several of them, shards cut through parameters, padding at the ends.
    strategy = DDPStrategy(zero_stage=zero_stage, bucket_cap_mb=0.0005, first_bucket_cap_mb=0.0002,
                           find_unused_parameters=find_unused) if devices > 1 else "single"
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=max_epochs, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=bool(callbacks),
                      callbacks=callbacks, default_root_dir=tmp_path, **kwargs)
    trainer.fit(model, zero_data(), ckpt_path=ckpt_path)
    return model, trainer


def _assert_same_weights(expected: torch.nn.Module, actual: torch.nn.Module) -> None:
    for (name, want), got in zip(expected.state_dict().items(), actual.state_dict().values()):
        assert torch.equal(want, got), f"{name}: max difference {(want - got).abs().max().item()}"


def _assert_trained(model: ZeroNet) -> None:
    """The comparison means something only if the optimizer moved the weights."""
    assert not torch.equal(model.first.weight, ZeroNet().first.weight)


@pytest.mark.parametrize("case", [
    {"optimizer": "sgd"},
    {"optimizer": "adam", "scheduler": True},
    {"optimizer": "adamw", "gradient_clip_val": 0.05},
    {"optimizer": "adamw", "accumulate_grad_batches": 4, "find_unused": True},
    {"manual": True},
], ids=["sgd-momentum", "adam-two-groups-scheduler", "adamw-clip-norm", "adamw-accumulate4-unused", "manual-two"])
def test_weights_are_bit_identical_to_zero_stage_0(case: dict[str, Any]) -> None:
    plain, _ = _fit(0, **dict(case))
    sharded, trainer = _fit(1, **dict(case))
    _assert_trained(sharded)
    _assert_same_weights(plain, sharded)
    assert torch.equal(sharded.frozen.weight, ZeroNet().frozen.weight)  # frozen stays frozen
    if case.get("find_unused"):
        assert torch.equal(sharded.unused, ZeroNet().unused)  # never had a gradient: never stepped (no decay)


def test_each_rank_holds_half_the_optimizer_state() -> None:
    plain, plain_trainer = _fit(0, optimizer="adam")
    sharded, trainer = _fit(1, optimizer="adam")
    full_bytes = _state_bytes(plain_trainer.optimizers[0])
    mine = _state_bytes(trainer.optimizers[0])  # rank 0's shard, in the caller
    zero = trainer.strategy.summary()["zero"]
    assert zero["optimizer_state_bytes_per_rank"][0] == mine
    # Adam's moments: 8 bytes per trainable element, halved (+ the step counts, +- one segment each)
    assert abs(mine - full_bytes / 2) <= 0.05 * full_bytes
    assert abs(zero["optimizer_state_bytes_total"] - full_bytes) <= 0.05 * full_bytes
    assert len(zero["shard_elements_per_bucket"]) >= 2 and zero["padding_elements"] >= 0


def _state_bytes(optimizer: torch.optim.Optimizer) -> int:
    return sum(value.numel() * value.element_size() for state in optimizer.state.values()
               for value in state.values() if isinstance(value, torch.Tensor))


def test_an_optimizer_that_is_not_elementwise_is_refused_by_name() -> None:
    with pytest.raises(TypeError, match="LBFGS"):
        _fit(1, optimizer="lbfgs", max_epochs=1)


@pytest.mark.parametrize("value", [3, -1, "1", True])
def test_zero_stage_is_validated(value: Any) -> None:
    with pytest.raises(ValueError, match="zero_stage"):
        DDPStrategy(zero_stage=value)


def test_stage_two_and_auto_buckets_are_refused_with_a_reason() -> None:
    with pytest.raises(ValueError, match="not implemented"):
        DDPStrategy(zero_stage=2)
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        DDPStrategy(zero_stage=1, bucket_cap_mb="auto")
    with pytest.raises(ValueError, match="gradient_as_bucket_view"):
        DDPStrategy(zero_stage=1, gradient_as_bucket_view=False)
    strategy = Trainer(accelerator="cpu", devices=2, strategy="ddp_zero1", logger=False).strategy
    assert isinstance(strategy, DDPStrategy) and strategy.zero_stage == 1
    with pytest.raises(ValueError, match="zero_stage=2"):
        Trainer(accelerator="cpu", devices=2, strategy="ddp_zero2", logger=False)
