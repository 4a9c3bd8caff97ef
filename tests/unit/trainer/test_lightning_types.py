"""Lightning's classes from both packages, as our Trainer recognises them and as programs check our objects:
callbacks by class hierarchy (a `BaseFinetuning` subclass, a class whose Lightning base a harness swapped in the
public module), our strategies as Lightning's strategy ABCs, a pickled ModelCheckpoint, and a module's own
`manual_backward` attribute routed through our Trainer's backward (Lightning's hook-recording test's way)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from pathlib import Path
from typing import Any

import lightning.pytorch as L
import pytest
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from strategies import DDPStrategy, SingleDeviceStrategy, Strategy
from strategies.lightning_types import derives_from, package_of
from trainer import Trainer
from trainer.callbacks import ModelCheckpoint
from trainer.callbacks.dispatch import adopt_callback
from trainer.lightning_types import is_lightning_instance

REPO = Path(__file__).resolve().parents[3]
PACKAGES = [L, pl]


@pytest.mark.parametrize("package", PACKAGES, ids=["lightning.pytorch", "pytorch_lightning"])
def test_callbacks_of_either_package_are_recognised_by_their_hierarchy(package: Any) -> None:
    class Finetuning(package.callbacks.BaseFinetuning):
        def freeze_before_training(self, pl_module: Any) -> None: ...

        def finetune_function(self, pl_module: Any, epoch: int, optimizer: Any) -> None: ...

    callback = Finetuning()
    assert is_lightning_instance(callback, "callbacks.Callback")
    assert package_of(Finetuning) == package.__name__
    assert not is_lightning_instance(callback, "callbacks.EarlyStopping")
    adopt_callback(callback)  # accepted (raised TypeError when Lightning's public Callback name was patched)


def test_recognition_does_not_depend_on_lightnings_public_names(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lightning's suite in `full` mode puts our Callback where Lightning's public one was; a callback
    defined on Lightning's own class (through BaseFinetuning) is still Lightning's."""
    from trainer.callbacks import Callback as OurCallback

    monkeypatch.setattr(L.callbacks, "Callback", OurCallback)
    monkeypatch.setattr(sys.modules["lightning.pytorch.callbacks.callback"], "Callback", OurCallback)
    assert is_lightning_instance(L.callbacks.LearningRateMonitor(), "callbacks.Callback")


def test_a_users_class_named_like_lightnings_is_not_lightnings() -> None:
    class EarlyStopping:  # the user's own, in the user's module
        pass

    assert not is_lightning_instance(EarlyStopping(), "callbacks.EarlyStopping")
    assert derives_from(L.callbacks.EarlyStopping, "callbacks.EarlyStopping")
    assert derives_from(pl.callbacks.ModelCheckpoint, "callbacks.Checkpoint")


@pytest.mark.parametrize("package", PACKAGES, ids=["lightning.pytorch", "pytorch_lightning"])
def test_our_strategies_are_lightnings_strategy_types(package: Any) -> None:
    Trainer(accelerator="cpu", devices=1, logger=False)  # registers with every Lightning package imported
    lightning = package.strategies
    assert isinstance(SingleDeviceStrategy(), lightning.SingleDeviceStrategy)
    assert not isinstance(SingleDeviceStrategy(), lightning.ParallelStrategy)
    ddp = DDPStrategy()
    assert all(isinstance(ddp, kind) for kind in (lightning.Strategy, lightning.ParallelStrategy, lightning.DDPStrategy))
    assert not isinstance(ddp, lightning.SingleDeviceStrategy)
    assert issubclass(Strategy, lightning.Strategy)


def test_ddp_reads_as_lightnings_ddp_strategy_before_launch() -> None:
    ours: Any = Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False).strategy
    theirs: Any = L.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False).strategy
    for name in ("num_processes", "num_nodes", "world_size", "global_rank", "local_rank", "node_rank",
                 "is_global_zero", "root_device", "parallel_devices", "distributed_sampler_kwargs"):
        assert getattr(ours, name) == getattr(theirs, name), name
    mine, lightnings = ours.cluster_environment, theirs.cluster_environment
    assert (mine.world_size(), mine.global_rank(), mine.local_rank(), mine.node_rank()) == \
        (lightnings.world_size(), lightnings.global_rank(), lightnings.local_rank(), lightnings.node_rank())
    assert mine.creates_processes_externally == lightnings.creates_processes_externally


def test_importing_strategies_and_trainer_registers_nothing_and_imports_no_lightning() -> None:
    code = ("import sys, strategies, trainer; from trainer import Trainer; Trainer(logger=False); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('lightning', 'pytorch_lightning')))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120,
                          env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "[]"


def test_a_pickled_model_checkpoint_equals_the_original_and_answers_lightnings_names(tmp_path: Path) -> None:
    ours = ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3)
    assert vars(pickle.loads(pickle.dumps(ours))) == vars(ours)
    theirs = L.callbacks.ModelCheckpoint(dirpath=tmp_path, every_n_train_steps=3)
    for name in ("_every_n_train_steps", "_every_n_epochs", "_train_time_interval", "_save_on_train_epoch_end"):
        assert getattr(ours, name) == getattr(theirs, name), name
    default = ModelCheckpoint(dirpath=tmp_path)
    assert (default._every_n_train_steps, default._every_n_epochs) == (0, 1)  # Lightning's defaults


class _ManualModule(L.LightningModule):
    def __init__(self, calls: list[str]) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(2, 1)
        self.calls = calls
        original = self.manual_backward  # Lightning's hook-recording test wraps each method on the instance

        def recording(loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
            original(loss, *args, **kwargs)
            calls.append("manual_backward")

        self.manual_backward = recording  # type: ignore[method-assign]

    def training_step(self, batch: Any, batch_idx: int) -> None:
        optimizer: Any = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(self.layer(batch[0]).sum())
        optimizer.step()

    def on_before_backward(self, loss: torch.Tensor) -> None:
        self.calls.append("on_before_backward")

    def on_after_backward(self) -> None:
        self.calls.append("on_after_backward")

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)


@pytest.mark.parametrize("trainer_class", [Trainer, L.Trainer], ids=["ours", "lightning"])
def test_a_manual_backward_wrapper_on_the_instance_runs_the_backward_hooks(trainer_class: Any, tmp_path: Path) -> None:
    calls: list[str] = []
    module = _ManualModule(calls)
    wrapper = module.__dict__["manual_backward"]
    loader = DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2)
    trainer_class(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=tmp_path).fit(module, loader)
    assert calls == ["on_before_backward", "on_after_backward", "manual_backward"] * 2
    assert module.__dict__["manual_backward"] is wrapper  # the user's attribute is put back after the stage
