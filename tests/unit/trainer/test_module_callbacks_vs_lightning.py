"""A module's `configure_callbacks()` against Lightning's Trainer: each returned callback replaces the
Trainer's callbacks of its type, the others are added, and checkpointing stays last."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

pl = pytest.importorskip("lightning.pytorch")
from lightning.pytorch import callbacks as lightning_callbacks  # noqa: E402
from lightning.pytorch.demos.boring_classes import BoringModel  # noqa: E402

from trainer import Trainer  # noqa: E402
from trainer import callbacks as our_callbacks  # noqa: E402

_SIDES = {"lightning": (pl.Trainer, lightning_callbacks), "ours": (Trainer, our_callbacks)}


class _Seen(pl.Callback):
    """Records the Trainer's callbacks (type name and patience/monitor, where they have one) as fit starts."""

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.seen: list[tuple[str, Any]] = []

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self.seen = [(type(c).__name__, getattr(c, "tag", None) or getattr(c, "patience", None))
                     for c in trainer.callbacks if not type(c).__name__.endswith(("ProgressBar", "Summary",
                                                                                   "Monitor"))]


class _Configures(BoringModel):
    def __init__(self, returned: list[Any]) -> None:
        super().__init__()
        self._returned = returned

    def configure_callbacks(self) -> Any:
        return self._returned


def _callbacks_during_fit(side: str, tmp_path: Path) -> list[tuple[str, Any]]:
    trainer_class, callbacks = _SIDES[side]
    given = [callbacks.ModelCheckpoint(dirpath=tmp_path / side),
             callbacks.EarlyStopping(monitor="x", patience=1, strict=False), _Seen("trainer's")]
    returned = [callbacks.EarlyStopping(monitor="x", patience=7, strict=False), _Seen("module's")]
    trainer = trainer_class(callbacks=given, default_root_dir=tmp_path / f"{side}-root", max_epochs=1,
                            limit_train_batches=1, limit_val_batches=0, logger=False, enable_progress_bar=False,
                            enable_model_summary=False)
    trainer.fit(_Configures(returned))
    return returned[1].seen


def test_configure_callbacks_replaces_by_type_and_keeps_checkpointing_last(tmp_path: Path) -> None:
    ours = _callbacks_during_fit("ours", tmp_path)
    assert ours == _callbacks_during_fit("lightning", tmp_path)
    assert ours == [("EarlyStopping", 7), ("_Seen", "module's"), ("ModelCheckpoint", None)]
