"""torch.compile'd modules train compiled under our Trainer and DDPStrategy (#18): compiled code
runs in the workers, the graph is split at our bucket boundaries (so buckets can launch during
backward), and after several steps at world size 2 the weights equal torch DDP + torch.compile
on the same shards, and our own eager run.

The backend is AOTAutograd without code generation (tests/helpers/compile_backends.py): the same
graph capture, splitting and compiled backward as inductor, without its C++ compile time. It does
not reorder arithmetic, so the comparisons are exact up to float summation order (1e-6)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from strategies import DDPStrategy
from tests.helpers.compile_backends import LOG_VARIABLE, MlpSteps, graphs_compiled, recording_aot_eager
from tests.helpers.launch_recorder import LaunchRecorder
from tests.helpers.spawn import run_on_ranks
from trainer import LightningModule, Trainer
from trainer.callbacks import Callback, ModelCheckpoint

TOL = 1e-6
BATCH, SAMPLES = 8, 64  # 4 steps per rank


class Mlp(MlpSteps, LightningModule):
    pass


def _data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(torch.randn(SAMPLES, 32, generator=generator), torch.randn(SAMPLES, 1, generator=generator))


class RecordLaunchOrder(Callback):
    """Each rank writes the order its reducer launched the buckets in at the last step (as its
    comm hook, a LaunchRecorder, saw them)."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        order = trainer.strategy.comm_hook.passes[-1]
        Path(self.out, f"launch-{trainer.global_rank}.json").write_text(json.dumps(order))


def _fit_ours(compiled: bool, tmp_path: Path) -> dict[str, torch.Tensor]:
    model = Mlp()
    target = torch.compile(model, backend=recording_aot_eager) if compiled else model
    # Buckets of ~16 KiB: the 64x64 layer alone fills one, so the graph splits into several pieces.
    strategy = DDPStrategy(bucket_cap_mb=0.016, first_bucket_cap_mb=0.004, comm_hook=LaunchRecorder())
    trainer = Trainer(strategy=strategy, accelerator="cpu", devices=2, max_epochs=1, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      enable_telemetry=False, default_root_dir=str(tmp_path), callbacks=[RecordLaunchOrder(tmp_path)])
    trainer.fit(target, DataLoader(_data(), batch_size=BATCH))
    trainer.strategy.stop_workers()
    return {key: value.clone() for key, value in model.state_dict().items()}


def _torch_ddp_compiled(rank: int, world_size: int) -> dict[str, torch.Tensor]:
    from torch.nn.parallel import DistributedDataParallel

    model = Mlp()
    ddp = torch.compile(DistributedDataParallel(model), backend=recording_aot_eager)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    x, y = _data().tensors
    # The shard our Trainer trains on: a training DistributedSampler always shuffles (Lightning's rule)
    mine = torch.tensor(list(DistributedSampler(range(SAMPLES), num_replicas=world_size, rank=rank, shuffle=True,
                                                seed=int(os.environ.get("PL_GLOBAL_SEED", 0)))))
    for start in range(0, len(mine), BATCH):
        index = mine[start:start + BATCH]
        optimizer.zero_grad()
        nn.functional.mse_loss(ddp(x[index]), y[index]).backward()
        optimizer.step()
    return {key: value.detach().clone() for key, value in model.state_dict().items()}


@pytest.mark.timeout(300)
@pytest.mark.conformance
def test_compiled_module_trains_compiled_split_at_buckets_and_equals_torch_ddp_compiled(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    log = tmp_path / "graphs.log"
    monkeypatch.setenv(LOG_VARIABLE, str(log))
    compiled = _fit_ours(compiled=True, tmp_path=tmp_path)
    pieces = graphs_compiled(log)
    assert set(pieces) == {0, 1} and min(pieces.values()) >= 2  # compiled in each worker, in pieces
    orders = [json.loads((tmp_path / f"launch-{rank}.json").read_text()) for rank in (0, 1)]
    assert orders[0] == orders[1] and len(orders[0]) >= 2  # several buckets, launched in one order everywhere
    log.unlink()
    eager = _fit_ours(compiled=False, tmp_path=tmp_path)
    assert graphs_compiled(log) == {}
    reference = run_on_ranks(_torch_ddp_compiled, 2)
    assert all(torch.equal(reference[0][key], reference[1][key]) for key in compiled)
    for key in compiled:
        assert torch.allclose(compiled[key], reference[0][key], atol=TOL, rtol=0), key
        assert torch.allclose(compiled[key], eager[key], atol=TOL, rtol=0), key
    assert not torch.equal(compiled["net.0.weight"], Mlp().net[0].weight.detach())  # it trained


class CompilesPart(Mlp):
    """Compiles one submodule itself, as in configure_model: its state dict names `_orig_mod`."""

    def configure_model(self) -> None:
        if not isinstance(self.net, torch._dynamo.eval_frame.OptimizedModule):
            self.net = torch.compile(self.net, backend=recording_aot_eager)  # type: ignore[assignment]


@pytest.mark.timeout(300)
def test_checkpoints_hold_plain_names_and_load_compiled_or_not(tmp_path: Path) -> None:
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=1, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path),
                      callbacks=[ModelCheckpoint(dirpath=str(tmp_path / "whole"))])
    whole = Mlp()
    trainer.fit(torch.compile(whole, backend=recording_aot_eager), DataLoader(_data(), batch_size=BATCH))
    saved = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)["state_dict"]
    assert set(saved) == set(Mlp().state_dict())  # no "_orig_mod." anywhere
    plain = Mlp()
    plain.load_state_dict(saved)
    assert all(torch.equal(plain.state_dict()[key], whole.state_dict()[key]) for key in saved)

    part = CompilesPart()
    trainer = Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_progress_bar=False,
                      enable_model_summary=False, default_root_dir=str(tmp_path),
                      callbacks=[ModelCheckpoint(dirpath=str(tmp_path / "part"))])
    # Resume the compiled-part module from the whole module's (plain) checkpoint, train on, save again.
    trainer.fit(part, DataLoader(_data(), batch_size=BATCH), ckpt_path=trainer_path(tmp_path / "whole"))
    assert any("_orig_mod" in key for key in part.state_dict())
    saved = torch.load(trainer.checkpoint_callback.best_model_path, weights_only=True)["state_dict"]
    assert set(saved) == set(Mlp().state_dict()) and trainer.current_epoch == 2
    assert os.path.basename(trainer.checkpoint_callback.best_model_path).startswith("epoch=1")


def trainer_path(directory: Path) -> str:
    (path,) = directory.glob("*.ckpt")
    return str(path)
