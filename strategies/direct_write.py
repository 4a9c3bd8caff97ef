"""Writing a large checkpoint around the page cache (Linux `O_DIRECT`), so the write costs almost no CPU.

A buffered write copies every byte into the page cache (allocating, and later reclaiming, pages) and the
kernel's writeback then sends them to the disk: 0.3-1.1 CPU-seconds for a 507 MB checkpoint on the 2-core
development machine, taken from training when a background save runs beside it on a machine without an
idle core. With `O_DIRECT` the disk reads the bytes straight from our memory: ~0.02-0.05 CPU-seconds for the
same file. The price is alignment: the memory address, the file offset and the length of every write must
be multiples of the device's block size (`ALIGNMENT` covers 512-byte and 4 KiB devices).

torch.save hands each tensor's storage to `write` as one piece, in place. With the archive's storage
alignment set to `ALIGNMENT` (torch's `save.storage_alignment`), each storage starts at an aligned file
offset; if its memory is aligned too (the background snapshot's buffers are: checkpoint_snapshot.py), its
whole blocks go to the disk without a copy. Everything else (zip headers, the pickle, an unaligned
tensor, a storage's last partial block) is gathered in an aligned bounce buffer and written from there.
The file's tail is padded to a whole block and then truncated to its true length.
"""

from __future__ import annotations

import errno
import mmap
import os
from typing import Any

import numpy as np

ALIGNMENT = 4096
BOUNCE_BYTES = 8 * 1024 * 1024  # the copy buffer for what cannot go straight to the disk
_MAX_WRITE = 1 << 30  # one syscall writes at most this much (Linux caps a write near 2 GiB)


class DirectWriteRefused(OSError):
    """The file system took the `O_DIRECT` flag but refused an aligned write (EINVAL): the caller writes
    the file again the ordinary way."""


def set_direct_writes(fd: int, on: bool) -> bool:
    """Switch an open file to `O_DIRECT` writes, or back. False where the platform or file system has
    none (macOS, tmpfs, some network and FUSE mounts): that file is written through the page cache."""
    flag = getattr(os, "O_DIRECT", 0)
    if not flag:
        return False
    import fcntl
    try:
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | flag if on else flags & ~flag)
    except OSError:
        return False
    return True


class DirectFile:
    """A write-only file object over a descriptor opened with `O_DIRECT`, for torch.save.

    `finish` must be called once all is written: it writes the last partial block, cuts the padding off
    and fsyncs. Before that the file on disk is incomplete (its caller writes to a temporary name).
    """

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._bounce = mmap.mmap(-1, BOUNCE_BYTES)  # anonymous mappings are page-aligned
        self._bounce_view = memoryview(self._bounce)
        self._pending = 0  # bytes in the bounce buffer not yet written
        self._written = 0  # bytes on disk (a multiple of ALIGNMENT until `finish`)
        self.bytes_copied = 0  # what went through the bounce buffer (the rest was written in place)

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        start, size = 0, view.nbytes
        address = _address_of(view) if size >= ALIGNMENT else 1
        while start < size:
            remaining = size - start
            if remaining >= ALIGNMENT and self._pending % ALIGNMENT == 0 and (address + start) % ALIGNMENT == 0:
                self._write_pending()
                whole_blocks = remaining - remaining % ALIGNMENT
                self._write_all(view[start:start + whole_blocks])
                start += whole_blocks
                continue
            taken = min(remaining, BOUNCE_BYTES - self._pending)
            self._bounce_view[self._pending:self._pending + taken] = view[start:start + taken]
            self._pending += taken
            self.bytes_copied += taken
            start += taken
            if self._pending == BOUNCE_BYTES:
                self._write_pending()
        return size

    def tell(self) -> int:
        return self._written + self._pending

    def flush(self) -> None:
        """Nothing to do: bytes reach the disk as whole blocks, the rest at `finish`."""

    def seek(self, offset: int) -> int:
        """Only back to the start (a save retried with another pickler), which empties the file."""
        if offset != 0:
            raise OSError(errno.ESPIPE, "a direct-write checkpoint file can only be rewound to its start")
        os.ftruncate(self._fd, 0)
        os.lseek(self._fd, 0, os.SEEK_SET)
        self._pending = self._written = 0
        return 0

    def truncate(self) -> None:
        """The file is already empty after `seek(0)`, the only position it can be rewound to."""

    def finish(self) -> None:
        """Write the last partial block, trim the zero padding off and make the file durable."""
        length = self.tell()
        padded = -self._pending % ALIGNMENT
        self._bounce_view[self._pending:self._pending + padded] = bytes(padded)
        self._pending += padded
        self._write_pending()
        os.ftruncate(self._fd, length)
        os.fsync(self._fd)

    def close(self) -> None:
        try:
            self._bounce_view.release()
            self._bounce.close()
        except BufferError:
            pass  # a failed write's traceback still holds a slice: the mapping goes when that does

    def _write_pending(self) -> None:
        if self._pending:
            self._write_all(self._bounce_view[:self._pending])
            self._pending = 0

    def _write_all(self, view: memoryview) -> None:
        done = 0
        while done < view.nbytes:
            try:
                done += os.write(self._fd, view[done:done + _MAX_WRITE])
            except OSError as error:
                if error.errno == errno.EINVAL:
                    raise DirectWriteRefused(errno.EINVAL, "the file system refused an O_DIRECT write") from error
                raise
        self._written += done


def _address_of(view: memoryview) -> int:
    """Where `view`'s bytes start in memory (read-only views too, which ctypes cannot take)."""
    return int(np.frombuffer(view, dtype=np.uint8).ctypes.data)
