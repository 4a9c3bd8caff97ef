"""Warnings about a fit set up in a way that is possibly a mistake, under Lightning's Trainer and
ours: in the same situations (and only there) both warn, each in its own words (Lightning's are
`PossibleUserWarning`s, ours plain `UserWarning`s; both are UserWarnings)."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils.data import DataLoader, Sampler, SequentialSampler

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch.callbacks import ModelCheckpoint  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset  # noqa: E402

from trainer import Trainer  # noqa: E402

_TRAINERS = {"lightning": pl.Trainer, "ours": Trainer}
_QUIET = {"logger": False, "enable_progress_bar": False, "enable_model_summary": False}


def _warnings_about(topic: dict[str, str], side: str, run: Callable[[], Any]) -> list[str]:
    """The UserWarnings `run` emits whose text has `topic[side]` (each Trainer words it its own way)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [str(w.message) for w in caught if issubclass(w.category, UserWarning) and topic[side] in str(w.message)]


_MAX_EPOCHS = {"lightning": "`max_epochs` was not set", "ours": "max_epochs=None"}


@pytest.mark.parametrize("kwargs, warned, max_epochs", [
    ({"max_epochs": None}, True, 1000),
    ({"max_epochs": None, "max_steps": 2}, False, -1),
    ({"max_epochs": None, "max_time": timedelta(minutes=5)}, False, -1),  # Lightning's Timer bounds it
    ({"max_epochs": 2}, False, 2),
    ({"fast_dev_run": True}, False, 1),
], ids=["unset", "max_steps", "max_time", "set", "fast_dev_run"])
def test_unset_max_epochs_warns_and_becomes_1000_as_in_lightning(tmp_path: Path, kwargs: dict[str, Any],
                                                                 warned: bool, max_epochs: int) -> None:
    class StopsAtOnce(BoringModel):
        def training_step(self, batch: Any, batch_idx: int) -> Any:
            self.trainer.should_stop = True
            return super().training_step(batch, batch_idx)

    found = {}
    for side, trainer_class in _TRAINERS.items():
        trainer = trainer_class(default_root_dir=tmp_path / side, limit_train_batches=1, limit_val_batches=0,
                                enable_checkpointing=False, **_QUIET, **kwargs)
        messages = _warnings_about(_MAX_EPOCHS, side, lambda: trainer.fit(StopsAtOnce()))
        found[side] = (bool(messages), trainer.max_epochs, trainer.current_epoch)
    assert found["ours"] == found["lightning"]
    assert found["ours"][:2] == (warned, max_epochs)


_EVAL_MODE = {"lightning": "in eval mode", "ours": "in eval mode"}


@pytest.mark.parametrize("frozen", [True, False])
def test_a_module_left_in_eval_mode_warns_as_in_lightning(tmp_path: Path, frozen: bool) -> None:
    found = {}
    for side, trainer_class in _TRAINERS.items():
        model = BoringModel()
        model.frozen_part = torch.nn.Sequential(torch.nn.Linear(32, 4), torch.nn.Dropout())
        if frozen:
            model.frozen_part.eval()
        trainer = trainer_class(default_root_dir=tmp_path / side, max_epochs=1, limit_train_batches=1,
                                limit_val_batches=1, enable_checkpointing=False, **_QUIET)
        found[side] = bool(_warnings_about(_EVAL_MODE, side, lambda: trainer.fit(model)))
    assert found["ours"] == found["lightning"] == frozen


class _Batches:
    """Three batches of a plain iterable; `stateful` adds state_dict/load_state_dict."""

    def __init__(self) -> None:
        self.index = 0

    def __iter__(self) -> Any:
        for i in range(self.index, len(self)):
            yield torch.ones(2, 32) * i

    def __len__(self) -> int:
        return 3


class _StatefulBatches(_Batches):
    def state_dict(self) -> dict[str, int]:
        return {"index": self.index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.index = state["index"]


_MID_EPOCH = {"lightning": "resuming from a checkpoint that ended before the epoch ended", "ours": "Resuming inside"}


@pytest.mark.parametrize("data_class, step, warned", [(_Batches, 1, True), (_Batches, 3, False),
                                                       (_StatefulBatches, 1, False)],
                         ids=["mid-epoch", "epoch-end", "stateful-loader"])
def test_resuming_mid_epoch_without_a_stateful_loader_warns_as_in_lightning(tmp_path: Path, data_class: type,
                                                                            step: int, warned: bool) -> None:
    found = {}
    for side, trainer_class in _TRAINERS.items():
        directory = tmp_path / side
        trainer_class(default_root_dir=directory, max_epochs=1, **_QUIET,
                      callbacks=[ModelCheckpoint(dirpath=directory, every_n_train_steps=1, save_top_k=-1)]
                      ).fit(BoringModel(), data_class())
        resumed = trainer_class(default_root_dir=directory, max_epochs=1, enable_checkpointing=False, **_QUIET)
        checkpoint = str(directory / f"epoch=0-step={step}.ckpt")
        found[side] = bool(_warnings_about(_MID_EPOCH, side, lambda: resumed.fit(BoringModel(), data_class(),
                                                                              ckpt_path=checkpoint)))
    assert found["ours"] == found["lightning"] == warned


class _InOrder(Sampler[int]):
    """Yields the indices in order, but is not a SequentialSampler: the Trainer cannot know that."""

    def __init__(self, data: Any) -> None:
        self.data = data

    def __iter__(self) -> Any:
        return iter(range(len(self.data)))

    def __len__(self) -> int:
        return len(self.data)


_OVERFIT = {"lightning": "requested to overfit", "ours": "overfit_batches"}


@pytest.mark.parametrize("sampler", ["custom", "shuffle", "sequential"])
def test_overfitting_a_loader_that_may_reorder_warns_and_reads_it_in_order_as_in_lightning(
        tmp_path: Path, sampler: str) -> None:
    class Model(BoringModel):
        def _loader(self) -> DataLoader:
            dataset = RandomDataset(32, 64)
            if sampler == "custom":
                return DataLoader(dataset, sampler=_InOrder(dataset))
            return DataLoader(dataset, shuffle=sampler == "shuffle")

        def train_dataloader(self) -> DataLoader:
            return self._loader()

        def val_dataloader(self) -> DataLoader:
            return self._loader()

    found = {}
    for side, trainer_class in _TRAINERS.items():
        trainer = trainer_class(default_root_dir=tmp_path / side, max_epochs=1, overfit_batches=2,
                                enable_checkpointing=False, **_QUIET)
        messages = _warnings_about(_OVERFIT, side, lambda: trainer.fit(Model()))
        samplers = (type(trainer.train_dataloader.sampler), type(trainer.val_dataloaders.sampler))
        found[side] = (len(messages), samplers)
    assert found["ours"] == found["lightning"]
    assert found["ours"] == ((2, (SequentialSampler, SequentialSampler)) if sampler != "sequential"
                             else (0, (SequentialSampler, SequentialSampler)))
