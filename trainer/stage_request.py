"""What one stage was asked to do, as the entry point (`Trainer.fit`/`validate`/`test`/`predict`) settled it:
one frozen record that travels unchanged to every rank (pickled to a pool's workers, inherited by forked
ones), so no rank re-reads or edits the caller's arguments."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

from torch import nn

from trainer.checkpoint_choice import CheckpointRequest


@dataclass(frozen=True)
class StageRequest:
    """One stage's inputs. `loaders` maps a data stage ("train", "validate", "test", "predict") to what the
    user passed for it (a loader, a list of them, a CombinedLoader, or None: ask the module/datamodule)."""

    stage: str  # "fit", "validate", "test" or "predict"
    model: nn.Module
    loaders: dict[str, Any]
    datamodule: Any = None
    checkpoint: CheckpointRequest = CheckpointRequest()
    verbose: bool = True  # validate/test: print the results table
    return_predictions: bool | None = None  # predict: None and True keep the predictions
    launcher_pid: int = field(default_factory=os.getpid)  # a rank elsewhere runs on a copy of the caller's objects

    @property
    def in_launching_process(self) -> bool:
        return os.getpid() == self.launcher_pid
