"""Reading and writing checkpoint files: atomic on write, code-free on read."""

from __future__ import annotations

import abc
import errno
import logging
import os
import pickle
import tempfile
import zipfile
from pathlib import Path
from typing import Any

import cloudpickle
import torch

from strategies.direct_write import ALIGNMENT, DirectFile, DirectWriteRefused, set_direct_writes
from strategies.torch_save_settings import can_block_align_storages, storages_block_aligned, without_zip_crc32

log = logging.getLogger(__name__)

DIRECT_WRITE_MIN_BYTES = 32 * 1024 * 1024  # below this a checkpoint is written through the page cache


class CheckpointError(RuntimeError):
    """A checkpoint file is missing, truncated, foreign or unsafe; the message names the file."""


class UntrustedCheckpointError(CheckpointError):
    """A readable checkpoint holding objects that loading with `weights_only=True` refuses: not a damaged
    file, so resuming from "last" must not skip it and start over (the user may trust it)."""


class CheckpointIO(abc.ABC):
    """How a checkpoint dict becomes a file and back. Strategies call it on the right ranks."""

    @abc.abstractmethod
    def save(self, checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None: ...

    @abc.abstractmethod
    def load(self, path: str | os.PathLike[str], map_location: Any = None,
             weights_only: bool = True) -> dict[str, Any]:
        """The checkpoint dict. `weights_only=False` means the caller trusts the file: any pickled
        object is rebuilt, which runs whatever code the file names (torch.load's meaning)."""

    def remove(self, path: str | os.PathLike[str]) -> None:
        Path(path).unlink(missing_ok=True)


class TorchCheckpointIO(CheckpointIO):
    """`torch.save` to a temp file in the target directory, fsync, then `os.replace`.

    A reader therefore sees the old file or the new one, never half of one, even if the
    writer is killed mid-save. The archive is written without zip CRC32 checksums (torch.load never reads
    them, and computing them was most of a save's CPU time: torch_save_settings.py), and a large checkpoint
    around the page cache where the file system allows (direct_write.py). Loading uses `weights_only=True`
    unless the caller says it trusts the file, so a crafted pickle cannot run code.
    """

    def save(self, checkpoint: dict[str, Any], path: str | os.PathLike[str]) -> None:
        target = Path(path)
        tmp_name: str | None = None
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            _remove_stale_temp_files(target)
            fd, tmp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
            with os.fdopen(fd, "wb") as handle:
                if not _written_direct(checkpoint, handle.fileno(), target):
                    _write_buffered(checkpoint, handle)
            os.replace(tmp_name, target)
            _fsync_directory(target.parent)
        except (OSError, RuntimeError) as error:
            _discard(tmp_name)
            cause = _os_error_in(error)
            if cause is None:
                raise
            # A full disk, a quota, a read-only or vanished mount: say so; the old file stays.
            kept = "the previous file is unchanged" if target.exists() else "no earlier file existed"
            raise CheckpointError(f"Could not write checkpoint {str(target)!r}: {cause.strerror or cause} "
                                  f"(errno {cause.errno}); {kept}. {_advice(cause.errno)}") from error
        except BaseException:
            _discard(tmp_name)
            raise

    def load(self, path: str | os.PathLike[str], map_location: Any = None,
             weights_only: bool = True) -> dict[str, Any]:
        source = Path(path)
        if not source.is_file():
            raise CheckpointError(f"Checkpoint file {str(source)!r} does not exist.")
        try:
            checkpoint = torch.load(source, map_location=map_location, weights_only=weights_only)
        except pickle.UnpicklingError as error:
            if not zipfile.is_zipfile(source):  # no torch.save archive at all: damaged or foreign, not untrusted
                raise CheckpointError(f"Checkpoint {str(source)!r} is truncated or not a torch checkpoint: "
                                      f"{error}") from error
            raise UntrustedCheckpointError(
                f"Checkpoint {str(source)!r} holds objects that are not plain tensors/containers and "
                f"was refused (loading with weights_only=True never executes pickled code): {error}. If you "
                "trust this file, pass weights_only=False (to fit/validate/test/predict or load_from_checkpoint)."
            ) from error
        except (RuntimeError, EOFError, zipfile.BadZipFile, ValueError) as error:
            raise CheckpointError(
                f"Checkpoint {str(source)!r} is truncated or not a torch checkpoint: {error}"
            ) from error
        if not isinstance(checkpoint, dict):
            raise CheckpointError(
                f"Checkpoint {str(source)!r} holds a {type(checkpoint).__name__}, expected a dict."
            )
        return checkpoint


def _written_direct(checkpoint: dict[str, Any], fd: int, target: Path) -> bool:
    """Write `checkpoint` to the empty file `fd` with `O_DIRECT` (direct_write.py), where it is large enough
    to be worth it and this torch, platform and file system allow. False: nothing was written, and the
    file takes ordinary writes again."""
    if not _worth_writing_direct(checkpoint) or not can_block_align_storages() or not set_direct_writes(fd, True):
        return False
    direct = DirectFile(fd)
    try:
        with without_zip_crc32(), storages_block_aligned():
            _dump(checkpoint, direct)
        direct.finish()
        return True
    except (OSError, RuntimeError) as error:
        if not isinstance(_os_error_in(error), DirectWriteRefused):
            raise
        log.info("a direct write of %s failed with EINVAL (a file system that takes O_DIRECT but refuses it, or a "
                 "write cut short by a size limit): writing it through the page cache", target)
    finally:
        direct.close()
    set_direct_writes(fd, False)
    os.ftruncate(fd, 0)
    os.lseek(fd, 0, os.SEEK_SET)
    return False


def _worth_writing_direct(checkpoint: dict[str, Any]) -> bool:
    """Large, and mostly in page-aligned memory (a background save's snapshot) that the disk can read in
    place: only then is the write's CPU cost gone. Live tensors (a synchronous save) would have to be
    copied into the aligned buffer, as much CPU as the page cache's copy, and the save would wait for the
    disk sooner. Also: tensors large enough on average that aligning each to a block pads the file by at
    most ~2 %."""
    tensors, nbytes, aligned = _tensor_bytes(checkpoint)
    return nbytes >= DIRECT_WRITE_MIN_BYTES and 2 * aligned >= nbytes and tensors * ALIGNMENT * 50 <= nbytes


def _tensor_bytes(value: Any) -> tuple[int, int, int]:
    """(tensors, their storages' bytes, the bytes of those that start on a page) in a checkpoint dict."""
    if isinstance(value, torch.Tensor):
        try:
            storage = value.untyped_storage()
        except RuntimeError:  # sparse, nested, a wrapper subclass: no one storage; torch.save writes its parts
            return 1, 0, 0
        return 1, storage.nbytes(), storage.nbytes() if storage.data_ptr() % ALIGNMENT == 0 else 0
    if isinstance(value, dict):
        value = list(value.values())
    if isinstance(value, (list, tuple)):
        parts = [_tensor_bytes(item) for item in value]
        return (sum(part[0] for part in parts), sum(part[1] for part in parts), sum(part[2] for part in parts))
    return 0, 0, 0


def _write_buffered(checkpoint: dict[str, Any], handle: Any) -> None:
    with without_zip_crc32():
        _dump(checkpoint, handle)
    handle.flush()
    os.fsync(handle.fileno())


def _dump(checkpoint: dict[str, Any], handle: Any) -> None:
    """`torch.save`. A class our launcher sent to a worker by value (one defined in the user's script,
    `__main__`) cannot be pickled by name there, since the worker's `__main__` holds another copy of it;
    a checkpoint holding such an object (a callback's state) is written with cloudpickle instead, which
    stores that class by value. Loading it takes `weights_only=False`, as any custom object does."""
    try:
        torch.save(checkpoint, handle)
    except pickle.PicklingError as error:
        if "not the same object as __main__." not in str(error):
            raise  # a lambda, an open file...: not ours to store as code
        handle.seek(0)  # the file is ours alone, from its start
        handle.truncate()
        torch.save(checkpoint, handle, pickle_module=cloudpickle)


def _remove_stale_temp_files(target: Path) -> None:
    """Temporary files of earlier writes of `target` that were killed mid-write (only this rank writes
    `target`, and not twice at once): each is as large as a checkpoint."""
    for stale in target.parent.glob(f".{target.name}.*.tmp"):
        stale.unlink(missing_ok=True)


def _discard(tmp_name: str | None) -> None:
    if tmp_name is not None:
        Path(tmp_name).unlink(missing_ok=True)


def _advice(code: int | None) -> str:
    if code in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return "Free space (or raise the quota or file-size limit), or choose another directory."
    if code in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "Make the directory writable, or choose another directory."
    return "Check the directory and its file system, or choose another directory."


def _os_error_in(error: BaseException) -> OSError | None:
    """The operating system's refusal behind `error`: torch's zip writer reports a failed write as a
    RuntimeError ("unexpected pos ...") whose context is the OSError."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError):
            return seen
        seen = seen.__cause__ or seen.__context__
    return None


def _fsync_directory(directory: Path) -> None:
    """Make the rename itself durable (POSIX); harmless where directories cannot be opened."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
