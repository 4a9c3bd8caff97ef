"""A callback's kind is recognised by type, not by class name: a user's own class that shares a name
with one of Lightning's callbacks is not taken for it, while Lightning's (both packages) and ours are."""

from __future__ import annotations

import enum
from typing import Any

import pytest

from trainer import callbacks as ours
from trainer.callbacks.dispatch import (adopt_callback, is_checkpoint, is_early_stopping, is_model_summary,
                                        is_monitoring, is_progress_bar)
from trainer.callbacks.early_stopping import EarlyStoppingReason

lightning_callbacks = pytest.importorskip("lightning.pytorch.callbacks")
pl_callbacks = pytest.importorskip("pytorch_lightning.callbacks")


class EarlyStopping(ours.Callback):
    """A user's own callback that happens to share Lightning's name."""


class Checkpoint(ours.Callback):
    pass


class ProgressBar(ours.Callback):
    pass


class ModelSummary(ours.Callback):
    pass


class Callback:
    """Not a callback of any framework, only named like one."""


def test_a_user_class_named_early_stopping_is_not_early_stopping() -> None:
    assert not is_early_stopping(EarlyStopping())
    assert not is_monitoring(EarlyStopping())


@pytest.mark.parametrize("package", [lightning_callbacks, pl_callbacks], ids=["lightning", "pytorch_lightning"])
def test_lightnings_early_stopping_is_early_stopping(package: Any) -> None:
    assert is_early_stopping(package.EarlyStopping(monitor="val_loss"))
    assert is_monitoring(package.EarlyStopping(monitor="val_loss"))


def test_our_early_stopping_is_early_stopping() -> None:
    assert is_early_stopping(ours.EarlyStopping(monitor="val_loss"))


def test_other_kinds_go_by_type_too() -> None:
    assert not is_checkpoint(Checkpoint()) and not is_progress_bar(ProgressBar())
    assert not is_model_summary(ModelSummary())
    for package in (lightning_callbacks, pl_callbacks):
        assert is_checkpoint(package.ModelCheckpoint()) and is_progress_bar(package.TQDMProgressBar())
        assert is_model_summary(package.ModelSummary())
    assert is_checkpoint(ours.ModelCheckpoint()) and is_progress_bar(ours.TQDMProgressBar())
    assert is_model_summary(ours.ModelSummary())


def test_only_real_callbacks_are_adopted() -> None:
    adopt_callback(lightning_callbacks.Callback())
    adopt_callback(ours.Callback())
    with pytest.raises(TypeError, match="got Callback"):
        adopt_callback(Callback())


def test_stopping_reason_equals_lightnings_member_only() -> None:
    class _UsersReason(enum.Enum):
        PATIENCE_EXHAUSTED = 3

    _UsersReason.__name__ = _UsersReason.__qualname__ = "EarlyStoppingReason"
    theirs = lightning_callbacks.early_stopping.EarlyStoppingReason
    assert EarlyStoppingReason.PATIENCE_EXHAUSTED == theirs.PATIENCE_EXHAUSTED
    assert EarlyStoppingReason.PATIENCE_EXHAUSTED != _UsersReason.PATIENCE_EXHAUSTED
