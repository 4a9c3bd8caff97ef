"""torch.save's switches that our checkpoint writes change while they run, then put back.

Recent torch keeps them per thread (a ContextVar per setting: torch.utils._config_module): a save sets
them for its own thread and puts back what it found there, whatever other threads do meanwhile. Older
torch keeps them as process-wide globals: a background write and a save on another thread may overlap,
so each switch is counted, set when the first of our saves that needs it starts and restored to what was
found when the last one ends; a torch.save of someone else's running meanwhile sees our values. Both are
harmless to torch.load (which reads neither checksums nor the alignment).

* **No zip CRC32s.** torch.load does not check them (a flipped byte in a tensor loads silently either
  way), yet computing them took ~75 % of a save's CPU (507 MB: 1.0-1.3 s against 0.25-0.27 s, one thread):
  time a synchronous save stalls every rank, and CPU a background write takes from training on a machine
  without an idle core. `unzip -t` reports the empty checksums, and reading a member with Python's
  `zipfile` raises BadZipFile (a tool that scans checkpoints that way).
* **Storages at block-aligned offsets** for writes around the page cache (direct_write.py); each storage
  then starts on a 4 KiB boundary, which pads the file by up to that much per tensor.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from typing import Any

import torch

from strategies.direct_write import ALIGNMENT


class _CountedOverride:
    """One of torch.save's settings, held at `value` while our save on this thread (torch that keeps it per
    thread) or any of our saves (torch that keeps it process-wide) needs it."""

    def __init__(self, read: Callable[[], Any], write: Callable[[Any], None], value: Any, per_thread: bool) -> None:
        self._read, self._write, self._value, self._per_thread = read, write, value, per_thread
        self._lock = threading.Lock()
        self._holders = 0
        self._found: Any = None

    @contextlib.contextmanager
    def held(self) -> Iterator[None]:
        if self._per_thread:  # this thread's own setting: no other thread's save can see or undo it
            found = self._read()
            self._write(self._value)
            try:
                yield
            finally:
                self._write(found)
            return
        with self._lock:
            if self._holders == 0:
                self._found = self._read()
                self._write(self._value)
            self._holders += 1
        try:
            yield
        finally:
            with self._lock:
                self._holders -= 1
                if self._holders == 0:
                    self._write(self._found)


def _kept_per_thread(key: str) -> bool:
    """Whether torch keeps the serialization setting `key` per thread (a ContextVar), not process-wide."""
    try:
        from torch.utils.serialization import config
        return isinstance(getattr(config, "_config")[key].user_override, ContextVar)
    except (ImportError, AttributeError, KeyError):
        return False


def _crc32_override() -> _CountedOverride | None:
    setter = getattr(torch.serialization, "set_crc32_options", None)  # torch >= 2.5
    if setter is None:
        return None
    return _CountedOverride(torch.serialization.get_crc32_options, setter, False,
                            _kept_per_thread("save.compute_crc32"))


def _alignment_override(alignment: int) -> _CountedOverride | None:
    try:  # torch >= 2.6
        from torch.utils.serialization import config
        config.save.storage_alignment  # noqa: B018 (present in this torch?)
    except (ImportError, AttributeError):
        return None
    return _CountedOverride(lambda: config.save.storage_alignment,
                            lambda value: setattr(config.save, "storage_alignment", value), alignment,
                            _kept_per_thread("save.storage_alignment"))


_NO_CRC32 = _crc32_override()
_BLOCK_ALIGNED = _alignment_override(ALIGNMENT)


def can_block_align_storages() -> bool:
    """Whether this torch can place storages at block-aligned file offsets (torch >= 2.6)."""
    return _BLOCK_ALIGNED is not None


@contextlib.contextmanager
def without_zip_crc32() -> Iterator[None]:
    """torch.save writes the archive's records without CRC32s (where this torch can)."""
    with _NO_CRC32.held() if _NO_CRC32 is not None else contextlib.nullcontext():
        yield


@contextlib.contextmanager
def storages_block_aligned() -> Iterator[None]:
    """torch.save starts every storage's bytes at a file offset that is a multiple of `ALIGNMENT`."""
    if _BLOCK_ALIGNED is None:
        raise RuntimeError("this torch cannot align storages in its archives: ask can_block_align_storages first")
    with _BLOCK_ALIGNED.held():
        yield
