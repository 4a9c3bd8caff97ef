"""`weights_only=False`: resuming from (or evaluating) a checkpoint that holds objects other than
tensors and plain values, which the user trusts. Lightning's Trainer refuses such a file by default
and loads it when asked; so does ours, with the same callback state back."""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch

pl = pytest.importorskip("pytorch_lightning")
from pytorch_lightning.demos.boring_classes import BoringModel  # noqa: E402

from strategies.checkpoint_io import CheckpointError  # noqa: E402
from trainer import Trainer  # noqa: E402


@dataclass
class Record:
    """A custom object in a callback's state: torch.load(weights_only=True) refuses to rebuild it."""

    steps: int


class Counting(pl.Callback):
    def __init__(self) -> None:
        self.record = Record(0)

    def on_train_batch_end(self, *args: Any) -> None:
        self.record = Record(self.record.steps + 1)

    def state_dict(self) -> dict[str, Any]:
        return {"record": self.record}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.record = state_dict["record"]


def _trainer(trainer_class: type, root: Path, max_steps: int, callback: Counting) -> Any:
    return trainer_class(default_root_dir=root, max_steps=max_steps, limit_train_batches=4, limit_val_batches=0,
                         logger=False, enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])


def _resume(trainer_class: type, root: Path, weights_only: bool | None) -> tuple[str, int]:
    first = Counting()
    trainer = _trainer(trainer_class, root, 4, first)
    trainer.fit(BoringModel())
    path = trainer.checkpoint_callback.best_model_path
    again = Counting()
    try:
        _trainer(trainer_class, root, 6, again).fit(BoringModel(), ckpt_path=path, weights_only=weights_only)
    except (CheckpointError, pickle.UnpicklingError) as error:  # Lightning lets torch's UnpicklingError through
        assert "weights_only" in str(error)
        return "refused", again.record.steps
    return "loaded", again.record.steps


@pytest.mark.parametrize("weights_only", [None, False])
def test_a_trusted_checkpoint_loads_when_asked_as_in_lightning(tmp_path: Path, weights_only: bool | None) -> None:
    ours = _resume(Trainer, tmp_path / "ours", weights_only)
    lightning = _resume(pl.Trainer, tmp_path / "pl", weights_only)
    assert ours == lightning
    assert ours == (("refused", 0) if weights_only is None else ("loaded", 6))  # 4 restored + 2 more steps


def test_resuming_from_last_does_not_skip_a_file_it_refuses_to_trust(tmp_path: Path) -> None:
    """'last' skips damaged files and starts over; a readable file holding custom objects is not damaged:
    starting over (and, after a preemption, deleting that checkpoint) would lose the run."""
    from strategies.checkpoint_io import UntrustedCheckpointError

    _trainer(Trainer, tmp_path, 4, Counting()).fit(BoringModel())
    with pytest.raises(UntrustedCheckpointError, match="weights_only=False"):
        _trainer(Trainer, tmp_path, 6, Counting()).fit(BoringModel(), ckpt_path="last")


def test_a_checkpoint_io_without_weights_only_still_loads(tmp_path: Path) -> None:
    """A CheckpointIO written before `weights_only` existed (load(path, map_location)) keeps working."""
    from strategies.checkpoint_io import TorchCheckpointIO
    from strategies.single_device import SingleDeviceStrategy

    class OldStyle(TorchCheckpointIO):
        def load(self, path: Any, map_location: Any = None) -> dict[str, Any]:  # type: ignore[override]
            return super().load(path, map_location)

    first = Trainer(default_root_dir=tmp_path, max_steps=2, limit_val_batches=0, logger=False,
                    enable_progress_bar=False, enable_model_summary=False)
    first.fit(BoringModel())
    again = Trainer(default_root_dir=tmp_path, max_steps=3, limit_val_batches=0, logger=False,
                    enable_progress_bar=False, enable_model_summary=False,
                    strategy=SingleDeviceStrategy(checkpoint_io=OldStyle()))
    again.fit(BoringModel(), ckpt_path=first.checkpoint_callback.best_model_path)
    assert again.global_step == 3


def test_load_from_checkpoint_takes_weights_only(tmp_path: Path) -> None:
    from trainer import LightningModule

    class Small(LightningModule):
        def __init__(self, note: Any = None) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(2, 1)

    torch.save({"state_dict": Small().state_dict(), "hyper_parameters": {"note": Record(3)}}, tmp_path / "m.ckpt")
    with pytest.raises(CheckpointError, match="weights_only=False"):
        Small.load_from_checkpoint(tmp_path / "m.ckpt")
    assert Small.load_from_checkpoint(tmp_path / "m.ckpt", weights_only=False).hparams.note == Record(3)


def test_weights_only_must_be_a_bool_or_none(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="weights_only='no' must be None, True or False"):
        Trainer(default_root_dir=tmp_path).fit(BoringModel(), weights_only="no")  # type: ignore[arg-type]
