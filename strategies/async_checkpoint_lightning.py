"""Background checkpoint writes inside Lightning's own Trainer: `LightningDDPStrategy(async_checkpoint=True)`.

Lightning's Trainer writes through `strategy.checkpoint_io` (`save_checkpoint` on global rank 0,
`remove_checkpoint` when ModelCheckpoint rotates, `teardown` at the end). This object answers those
calls with our writer (strategies/async_checkpoint.py): the state is copied before `save_checkpoint`
returns, one write is in flight, the file is renamed into place whole, a rotated-out file is removed
only after its replacement is committed (Lightning's own AsyncCheckpointIO removes it at once), and a
failed write raises at the next save or at teardown. It follows Lightning's CheckpointIO interface by
its members, so this file never imports Lightning.
"""

from __future__ import annotations

import os
from typing import Any

from strategies.async_checkpoint import BackgroundCheckpointWriter, CheckpointSaveStats
from strategies.checkpoint_io import CheckpointIO, TorchCheckpointIO


class _LightningWriter(CheckpointIO):
    """A Lightning CheckpointIO seen as ours (what the background thread calls)."""

    def __init__(self, lightning_io: Any) -> None:
        self.lightning_io = lightning_io

    def save(self, checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None:
        self.lightning_io.save_checkpoint(checkpoint, path)

    def load(self, path: str | os.PathLike[str], map_location: Any = None,
             weights_only: bool = True) -> dict[str, Any]:
        loaded: dict[str, Any] = self.lightning_io.load_checkpoint(path, map_location=map_location,
                                                                   weights_only=weights_only)
        return loaded

    def remove(self, path: str | os.PathLike[str]) -> None:
        self.lightning_io.remove_checkpoint(path)


class LightningBackgroundCheckpointIO:
    """Lightning's CheckpointIO interface over our background writer. `checkpoint_io`: a Lightning
    CheckpointIO to write through, or None for ours (atomic: temp file, fsync, rename)."""

    def __init__(self, checkpoint_io: Any = None) -> None:
        self.checkpoint_io = checkpoint_io
        self._io: CheckpointIO = TorchCheckpointIO() if checkpoint_io is None else _LightningWriter(checkpoint_io)
        self._writer: BackgroundCheckpointWriter | None = None

    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        storage_options: Any = None) -> None:
        if storage_options is not None:
            raise TypeError("save_checkpoint(storage_options=...) is not supported by background checkpoint "
                            "writes; pass a CheckpointIO that takes them as LightningDDPStrategy(checkpoint_io=...).")
        if self._writer is None:
            self._writer = BackgroundCheckpointWriter(self._io)
        self._writer.submit(checkpoint, os.fspath(path))

    def load_checkpoint(self, path: str | os.PathLike[str], map_location: Any = None,
                        weights_only: bool | None = None) -> dict[str, Any]:
        self._finish()  # a file being written is read once it is whole
        return self._io.load(path, map_location=map_location, weights_only=weights_only is not False)

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        if self._writer is None:
            self._io.remove(path)
        else:
            self._writer.after_commit(lambda: self._io.remove(path))

    def teardown(self) -> None:
        if self._writer is not None:
            self._writer.close()  # kept, idle: its counters stay readable, the next stage reuses it
        teardown = getattr(self.checkpoint_io, "teardown", None)
        if callable(teardown):
            teardown()

    @property
    def stats(self) -> CheckpointSaveStats:
        return self._writer.stats if self._writer is not None else CheckpointSaveStats()

    def _finish(self) -> None:
        if self._writer is not None:
            self._writer.wait()

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_writer": None}  # a spawned rank gets the settings, not the thread
