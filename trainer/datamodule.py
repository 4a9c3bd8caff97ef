"""LightningDataModule: the data half of a job, with Lightning's hook contract."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trainer.contract import TrainerContract


class LightningDataModule:
    """Override `prepare_data` (download/generate once, on global rank 0), `setup(stage)`
    (build datasets on every rank) and the `*_dataloader` methods you need."""

    def __init__(self) -> None:
        self.trainer: TrainerContract | None = None  # set by the Trainer for the stage

    def prepare_data(self) -> None: ...

    def setup(self, stage: str) -> None: ...

    def teardown(self, stage: str) -> None: ...

    def train_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} does not implement train_dataloader().")

    def val_dataloader(self) -> Any:
        return None

    def test_dataloader(self) -> Any:
        return None

    def predict_dataloader(self) -> Any:
        return None

    def state_dict(self) -> dict[str, Any]:
        return {}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None: ...

    def on_exception(self, exception: BaseException) -> None:
        """Called when a stage ends by an exception (Ctrl-C included), after the callbacks' `on_exception`."""

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state["trainer"] = None
        return state
