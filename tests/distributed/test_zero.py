"""ZeRO stages 1 and 2 (`DDPStrategy(zero_stage=1|2)`) against plain DDP (`zero_stage=0`), 2 real processes on CPU.

Each rank receives (reduce-scatter) and steps only its even shard of every bucket (cut through parameters),
then the shards are all-gathered: the weights after fit must equal zero_stage=0's bit for bit (the update is
elementwise, the shard of the averaged gradients has the all-reduce's bits), except with clipping by norm,
whose global norm is summed across the shards in another order: there within 1e-6 relative. Each rank's
optimizer holds about half the state; at stage 2 each also keeps only half the gradients between steps.
The stage-2 cases beyond two representative ones are `conformance` (slow: `make conformance`).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, cast

import pytest
import torch

from strategies import DDPStrategy
from strategies.worker_failure import WorkerFailedError
from tests.helpers.zero_models import ZeroNet, zero_data
from tests.integration.test_lightning_adapter import JOB_TIMEOUT_S, _run
from trainer import Trainer
from trainer.callbacks import ModelCheckpoint

pytestmark = pytest.mark.timeout(240)
_MODEL_KEYS = ("optimizer", "scheduler", "manual")


def _fit(zero_stage: int, tmp_path: Path | None = None, devices: int = 2, find_unused: bool = False,
         ckpt_path: str | None = None, callbacks: list[Any] | None = None, max_epochs: int = 2,
         compiled: bool = False, transport: str = "auto", **kwargs: Any) -> tuple[ZeroNet, Trainer]:
    model = ZeroNet(**{key: kwargs.pop(key) for key in _MODEL_KEYS if key in kwargs})
    # Tiny buckets: several of them, shards cut through parameters, padding at the ends.
    # A loaded shared machine may hold a rank back for longer than the default 25 s stall verdict.
    strategy = DDPStrategy(zero_stage=zero_stage, bucket_cap_mb=0.0005, first_bucket_cap_mb=0.0002,
                           find_unused_parameters=find_unused, stall_timeout=150,
                           transport=transport) if devices > 1 else "single"
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_epochs=max_epochs, logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=bool(callbacks),
                      callbacks=callbacks, default_root_dir=tmp_path, **kwargs)
    # aot_eager: torch.compile's graph capture and compiled backward, without inductor's C++ build time
    target = cast(ZeroNet, torch.compile(model, backend="aot_eager")) if compiled else model
    trainer.fit(target, zero_data(), ckpt_path=ckpt_path)
    return model, trainer


def _assert_same_weights(expected: torch.nn.Module, actual: torch.nn.Module, rtol: float = 0.0) -> None:
    """Bit-identical (`rtol=0`), or within `rtol` of the largest magnitude of each tensor."""
    for (name, want), got in zip(expected.state_dict().items(), actual.state_dict().values()):
        worst = (want - got).abs().max().item()
        assert worst <= rtol * want.abs().max().item(), f"{name}: max difference {worst}"


# Clipping by norm reads the global gradient norm, summed across the shards in another order than torch's
# norm of per-parameter norms: the clip factor may differ in its last bits.
NORM_RTOL = 1e-6


def _parity_rtol(case: dict[str, Any]) -> float:
    return NORM_RTOL if case.get("gradient_clip_val") else 0.0


def _assert_trained(model: ZeroNet) -> None:
    """The comparison means something only if the optimizer moved the weights."""
    assert not torch.equal(model.first.weight, ZeroNet().first.weight)


PARITY_CASES = {
    "sgd-momentum": {"optimizer": "sgd"},
    "adam-two-groups-scheduler": {"optimizer": "adam", "scheduler": True},
    "adamw-clip-norm": {"optimizer": "adamw", "gradient_clip_val": 0.05},
    "adamw-accumulate4-unused": {"optimizer": "adamw", "accumulate_grad_batches": 4, "find_unused": True},
    "manual-two": {"manual": True},
    "bf16-mixed-clip": {"optimizer": "adam", "precision": "bf16-mixed", "gradient_clip_val": 0.05},
    "compiled": {"optimizer": "adamw", "compiled": True},
    "gloo-reduce-scatter": {"optimizer": "adamw", "transport": "process_group"},
}
# In `make test`, one case per stage (the rest run in `make conformance`): stage 1 with clipping (the norm
# across shards), stage 2 in an accumulation window with an unused parameter.
FAST = {1: ("adamw-clip-norm",), 2: ("adamw-accumulate4-unused",)}


def _cases(stage: int) -> list[Any]:
    cases = dict(PARITY_CASES)
    if stage == 2:
        cases["gloo-clip-norm"] = {"optimizer": "adamw", "gradient_clip_val": 0.05, "transport": "process_group"}
    return [pytest.param(case, id=name, marks=() if name in FAST[stage] else pytest.mark.conformance)
            for name, case in cases.items()]


def _assert_same_as_zero_stage_0(zero_stage: int, case: dict[str, Any]) -> tuple[ZeroNet, Trainer]:
    plain, _ = _fit(0, **dict(case))
    sharded, trainer = _fit(zero_stage, **dict(case))
    _assert_trained(sharded)
    _assert_same_weights(plain, sharded, _parity_rtol(case))
    assert torch.equal(sharded.frozen.weight, ZeroNet().frozen.weight)  # frozen stays frozen
    if case.get("find_unused"):
        assert torch.equal(sharded.unused, ZeroNet().unused)  # never had a gradient: never stepped (no decay)
    return sharded, trainer


@pytest.mark.parametrize("case", _cases(1))
def test_stage_1_weights_equal_zero_stage_0(case: dict[str, Any]) -> None:
    _assert_same_as_zero_stage_0(1, case)


@pytest.mark.parametrize("case", _cases(2))
def test_stage_2_weights_equal_zero_stage_0_and_each_rank_keeps_half_the_gradients(case: dict[str, Any]) -> None:
    _, trainer = _assert_same_as_zero_stage_0(2, case)
    zero = trainer.strategy.summary()["zero"]
    gradients = zero["gradient_bytes_this_rank"]
    full = 4 * sum(zero["shard_elements_per_bucket"]) * 2  # fp32, both ranks' shards: the padded buckets
    assert gradients["held"] == gradients["shards"] == full // 2  # between steps: only this rank's shard
    assert full // 2 <= gradients["peak"] <= full + full // 2  # while backward runs: buckets come and go


@pytest.mark.conformance
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


# Every rank refuses at setup; the caller (rank 0) raises its own error, or the worker's (naming the rank and
# carrying its message) when that one is seen first, which a loaded machine decides.
def test_an_optimizer_that_is_not_elementwise_is_refused_by_name() -> None:
    with pytest.raises((TypeError, WorkerFailedError), match="cannot shard torch.optim.lbfgs.LBFGS"):
        _fit(1, optimizer="lbfgs", max_epochs=1)


def test_a_loss_scaler_is_refused() -> None:
    """16-mixed: each rank's GradScaler would judge overflow on its own shard and skip a step alone."""
    with pytest.raises((ValueError, WorkerFailedError), match="cannot run with a loss scaler"):
        _fit(1, precision="16-mixed", max_epochs=1)


@pytest.mark.parametrize("value", [3, -1, "1", True])
def test_zero_stage_is_validated(value: Any) -> None:
    with pytest.raises(ValueError, match="zero_stage"):
        DDPStrategy(zero_stage=value)


@pytest.mark.parametrize("zero_stage", [1, 2])
def test_auto_buckets_and_comm_hooks_are_refused_with_a_reason(zero_stage: int) -> None:
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        DDPStrategy(zero_stage=zero_stage, bucket_cap_mb="auto")
    with pytest.raises(ValueError, match="gradient_as_bucket_view"):
        DDPStrategy(zero_stage=zero_stage, gradient_as_bucket_view=False)
    with pytest.raises(ValueError, match="reduce-scatters each bucket.*'bf16'"):
        DDPStrategy(zero_stage=zero_stage, comm_hook="bf16")
    strategy = Trainer(accelerator="cpu", devices=2, strategy=f"ddp_zero{zero_stage}", logger=False).strategy
    assert isinstance(strategy, DDPStrategy) and strategy.zero_stage == zero_stage


# ---------------------------------------------------------------------- checkpoints
def _checkpointed(zero_stage: int, tmp_path: Path, **kwargs: Any) -> dict[str, Any]:
    """A 2-process fit stopped after 3 steps (mid-epoch) with a checkpoint there; the checkpoint."""
    directory = tmp_path / f"zero{zero_stage}"
    _fit(zero_stage, directory, max_steps=3, optimizer="adam", scheduler=True,
         callbacks=[ModelCheckpoint(dirpath=directory, every_n_train_steps=3, save_top_k=-1)], **kwargs)
    (path,) = directory.glob("*.ckpt")
    return {"path": str(path), **torch.load(path, weights_only=True)}


def _assert_same_state(expected: Any, actual: Any, where: str = "", rtol: float = 0.0) -> None:
    """Equal (floating tensors within `rtol` of their largest magnitude, when given), recursively."""
    if isinstance(expected, torch.Tensor) and rtol and expected.is_floating_point() and expected.dim():
        worst = (expected - actual).abs().max().item()
        assert worst <= rtol * expected.abs().max().item(), f"{where}: max difference {worst}"
    elif isinstance(expected, torch.Tensor):
        assert torch.equal(expected, actual), where
    elif isinstance(expected, dict):
        assert set(expected) == set(actual), f"{where}: keys {sorted(expected)} vs {sorted(actual)}"
        for key in expected:
            _assert_same_state(expected[key], actual[key], f"{where}/{key}", rtol)
    elif isinstance(expected, (list, tuple)):
        assert len(expected) == len(actual), where
        for position, (want, got) in enumerate(zip(expected, actual)):
            _assert_same_state(want, got, f"{where}[{position}]", rtol)
    else:
        assert expected == actual, f"{where}: {expected!r} vs {actual!r}"


@pytest.mark.parametrize("zero_stage", [1, pytest.param(2, marks=pytest.mark.conformance)])
@pytest.mark.conformance
def test_rank_0_writes_the_same_ordinary_optimizer_state_as_zero_stage_0(zero_stage: int, tmp_path: Path) -> None:
    plain, sharded = _checkpointed(0, tmp_path), _checkpointed(zero_stage, tmp_path)
    # Consolidated: numbered like the unsharded optimizer, every moment whole: the very dict plain DDP writes,
    # so it loads wherever that one does (zero_stage=0, one process, another world size).
    _assert_same_state(plain["optimizer_states"], sharded["optimizer_states"], "optimizer_states")
    _assert_same_state(plain["state_dict"], sharded["state_dict"], "state_dict")
    assert len(sharded["optimizer_states"][0]["state"]) == sum(1 for p in ZeroNet().parameters() if p.requires_grad)


@pytest.mark.parametrize("stage", [1, pytest.param(2, marks=pytest.mark.conformance)])
@pytest.mark.conformance
def test_resume_is_exact_and_loads_at_any_world_size(stage: int, tmp_path: Path) -> None:
    sharded = _checkpointed(stage, tmp_path)
    uninterrupted, _ = _fit(0, optimizer="adam", scheduler=True)
    resumed, _ = _fit(stage, tmp_path / "resumed", ckpt_path=sharded["path"], optimizer="adam", scheduler=True)
    _assert_same_weights(uninterrupted, resumed)  # bit-identical continuation, and equal to zero_stage=0's
    # The same file into zero_stage=0, into one process, and sharded over 3: an ordinary checkpoint.
    for devices, zero_stage in ((2, 0), (1, 0), (3, stage)):
        model, trainer = _fit(zero_stage, tmp_path / f"load{devices}", devices=devices, ckpt_path=sharded["path"],
                              max_steps=3, optimizer="adam", scheduler=True)  # nothing left to train: as loaded
        _assert_same_state(sharded["state_dict"], model.state_dict(), f"weights at {devices} processes")
        optimizer = trainer.optimizers[0]
        saved = sharded["optimizer_states"][0]["state"]
        sharding = getattr(optimizer, "zero_shards", None)
        if sharding is None:
            _assert_same_state(saved, optimizer.state_dict()["state"], f"optimizer at {devices} processes")
            continue
        # 3 ranks: rank 0 holds exactly its third of each moment, cut from the 2-process checkpoint
        numbers = {id(p): n for n, p in enumerate(p for g in sharding.original_groups for p in g)}
        for index, segment in sharding.shards.segments.items():
            whole = saved[numbers[id(sharding.shards.params[index])]]
            mine = optimizer.state[sharding.shards.tensors[index]]
            for key in ("exp_avg", "exp_avg_sq"):
                expected = whole[key].reshape(-1)[segment.start:segment.start + segment.length]
                assert torch.equal(mine[key], expected), key
            assert torch.equal(mine["step"], whole["step"])


@pytest.mark.conformance
@pytest.mark.parametrize("stage", [1, 2])
def test_resume_at_another_world_size_continues_exactly_as_zero_stage_0(stage: int, tmp_path: Path) -> None:
    """A 2-rank checkpoint resumed by 3 ranks: sharded in thirds, it trains on exactly as zero_stage=0 does
    from the same file (the shared-memory sums run in rank order at any world size)."""
    sharded = _checkpointed(stage, tmp_path)
    plain, _ = _fit(0, tmp_path / "plain3", devices=3, ckpt_path=sharded["path"], optimizer="adam", scheduler=True)
    resumed, _ = _fit(stage, tmp_path / "zero3", devices=3, ckpt_path=sharded["path"], optimizer="adam",
                      scheduler=True)
    assert not torch.equal(resumed.first.weight, sharded["state_dict"]["first.weight"])  # it trained on
    _assert_same_weights(plain, resumed)


# ---------------------------------------------------------------------- inside Lightning's Trainer
@pytest.mark.timeout(JOB_TIMEOUT_S + 30)
@pytest.mark.conformance
def test_the_plug_in_inside_lightnings_trainer_is_bit_identical_and_writes_the_same_checkpoint(
        tmp_path: Path) -> None:
    """pytorch_lightning.Trainer + LightningDDPStrategy(zero_stage=1 and 2) against zero_stage=0: AdamW with two
    groups, norm clipping (Lightning's precision plugin, pointed at the norm across the shards: so within
    NORM_RTOL, not bit for bit), a scheduler."""
    script = Path(__file__).resolve().parents[1] / "helpers" / "lightning_zero.py"
    result = _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
                   str(tmp_path)], cwd=tmp_path)
    assert result.returncode == 0, result.stdout[-6000:]
    runs = torch.load(tmp_path / "zero.pt", weights_only=True)
    plain = runs["zero0"]
    for sharded in (runs["zero1"], runs["zero2"]):
        _assert_same_state(plain["weights"], sharded["weights"], "weights", NORM_RTOL)
        _assert_same_state(plain["optimizer_states"], sharded["optimizer_states"], "optimizer_states", NORM_RTOL)
        assert abs(sharded["state_elements"] - plain["state_elements"] / 2) <= 0.05 * plain["state_elements"]
