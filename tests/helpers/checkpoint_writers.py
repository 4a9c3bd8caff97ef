"""Checkpoint writers that are slow, gated or failing, and a fingerprint of a checkpoint's content, for the
background-write tests (importable by spawned workers: the strategy travels with its CheckpointIO)."""

from __future__ import annotations

import errno
import hashlib
import os
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import torch

from strategies.checkpoint_io import TorchCheckpointIO
from trainer.callbacks.base import Callback


class SlowCheckpointIO(TorchCheckpointIO):
    """Sleeps before it serialises: the training thread has long moved on (and changed the live tensors)
    by the time the file is written."""

    def __init__(self, delay_s: float = 0.2) -> None:
        self.delay_s = delay_s

    def save(self, checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None:
        time.sleep(self.delay_s)
        super().save(checkpoint, path)


class GatedCheckpointIO(TorchCheckpointIO):
    """Writes only once `gate` is set (the test decides when a write may finish)."""

    def __init__(self) -> None:
        self.gate = threading.Event()

    def save(self, checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None:
        if not self.gate.wait(timeout=60):
            raise TimeoutError("the test never opened the gate")
        super().save(checkpoint, path)


class DiskFullMidway:
    """A file-like writer standing in for the open checkpoint file: takes `budget` bytes, then fails as a full
    disk does (OSError ENOSPC)."""

    def __init__(self, handle: Any, budget: int) -> None:
        self.handle, self.budget = handle, budget

    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        if size > self.budget:
            self.handle.write(bytes(memoryview(data).cast("B")[:self.budget]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        self.budget -= size
        return int(self.handle.write(data))

    def __getattr__(self, name: str) -> Any:
        return getattr(self.handle, name)


def fingerprint(value: Any) -> Any:
    """The content of a checkpoint (or any part), as nested plain values with every tensor replaced by a hash
    of its dtype, shape and bytes: equal fingerprints, equal checkpoints."""
    if isinstance(value, torch.Tensor):
        data = value.detach().to("cpu").contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
        return ("tensor", str(value.dtype), tuple(value.shape), hashlib.sha1(data).hexdigest())
    if isinstance(value, dict):
        return {key: fingerprint(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [fingerprint(item) for item in value]
    return repr(value)


class FingerprintAtSave(Callback):
    """Records, on global rank 0 and at the very moment of each save (`on_save_checkpoint`, on the training
    thread), the fingerprint of the whole checkpoint dict, by the step it was taken at."""

    def __init__(self) -> None:
        self.by_step: dict[int, list[Any]] = {}

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        if trainer.is_global_zero:
            self.by_step.setdefault(trainer.global_step, []).append(fingerprint(checkpoint))

    def state_dict(self) -> dict[str, Any]:
        return {}


class KilledMidWrite(TorchCheckpointIO):
    """SIGKILLs its own process (rank 0, from the writer thread when saves run in the background) once
    `after_bytes` bytes of its `save_index`-th save have reached the file: a real death in mid-write."""

    def __init__(self, save_index: int, after_bytes: int) -> None:
        self.save_index, self.after_bytes, self.saves = save_index, after_bytes, 0

    def save(self, checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None:
        from strategies import checkpoint_io

        self.saves += 1
        if self.saves != self.save_index:
            super().save(checkpoint, path)
            return
        real_dump = checkpoint_io._dump
        checkpoint_io._dump = lambda checkpoint, handle: real_dump(checkpoint, _DieAfter(handle, self.after_bytes))
        try:
            super().save(checkpoint, path)
        finally:
            checkpoint_io._dump = real_dump


class _DieAfter(DiskFullMidway):
    def write(self, data: Any) -> int:
        size = memoryview(data).nbytes
        if size >= self.budget:
            self.handle.write(bytes(memoryview(data).cast("B")[:self.budget]))
            self.handle.flush()
            os.kill(os.getpid(), 9)
        self.budget -= size
        return int(self.handle.write(data))


def direct_writes_work_in(directory: Path) -> bool:
    """Whether checkpoints saved under `directory` can be written around the page cache (O_DIRECT):
    this torch, this platform and the file system all allow it."""
    from strategies.direct_write import set_direct_writes
    from strategies.torch_save_settings import can_block_align_storages

    fd, name = tempfile.mkstemp(dir=directory)
    try:
        return can_block_align_storages() and set_direct_writes(fd, True)
    finally:
        os.close(fd)
        os.unlink(name)


def record_direct_writes(monkeypatch: Any) -> list[Any]:
    """Every DirectFile a save in this process finishes, from now on (pytest's `monkeypatch` undoes it)."""
    from strategies.direct_write import DirectFile

    finished: list[DirectFile] = []
    real_finish = DirectFile.finish

    def recording_finish(self: DirectFile) -> None:
        finished.append(self)
        real_finish(self)

    monkeypatch.setattr(DirectFile, "finish", recording_finish)
    return finished
