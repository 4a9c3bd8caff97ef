"""A point-in-time copy of a checkpoint dict, so it can be written while training goes on.

What a checkpoint dict holds are mostly references to live state: `module.state_dict()` gives the
parameters themselves (detached, same storage), `optimizer.state_dict()` the optimizer's own state
tensors, a callback its own dicts. The next optimizer step changes them in place, a forward pass
changes BatchNorm buffers, a callback its scores. Writing such a dict from another thread would
write parameters of one step beside optimizer state of the next (Lightning #20953, NVIDIA's
resiliency extension). So, on the training thread and before it goes on, every tensor is copied
into a CPU buffer and every other value deep-copied; the writer only ever sees the copy.

The copy goes into buffers kept from the previous save (same shapes and dtypes: the usual case),
so a save costs one memcpy per tensor, not fresh allocations and page faults; at most one save is
in flight, and the next snapshot is taken only after that write finished, so the buffers are free.
Where there is a GPU the buffers are pinned and filled by non-blocking copies on the current
stream: the training thread does not wait for them at all, and since everything that runs later
on that stream (the next forward, the next optimizer step) is ordered after the copies, the copy
still reads the state of this step. The writer waits for the copies (a CUDA event) before it
serialises. On the CPU the copy is synchronous: it is the whole stall of an asynchronous save. CPU buffers start on
a page boundary, so the writer can hand them to the disk without a copy (direct_write.py).
"""

from __future__ import annotations

import copy
import mmap
from collections import OrderedDict
from typing import Any

import torch

from strategies.direct_write import ALIGNMENT


class CheckpointSnapshot:
    """Copies checkpoint dicts into reusable CPU buffers; `take` on the training thread, `ready`
    on the writer's before it reads the copy."""

    def __init__(self) -> None:
        self._buffers: list[torch.Tensor] = []  # in the order of the previous snapshot's tensors
        self._used = 0
        self._copied_on: list[torch.cuda.Event] = []
        self._copies: dict[tuple[Any, ...], torch.Tensor] = {}  # this take's copies, by what they copied

    def take(self, checkpoint: dict[str, Any]) -> dict[str, Any]:
        """A copy of `checkpoint` that shares nothing mutable with it."""
        self._used = 0
        self._copies = {}
        devices: set[torch.device] = set()
        copied = self._copy(checkpoint, devices)
        self._copies = {}
        del self._buffers[self._used:]  # a smaller checkpoint than last time: free the rest
        self._copied_on = [_event_on(device) for device in devices]
        return copied

    def ready(self) -> None:
        """Block until the non-blocking device-to-host copies of the last `take` are done."""
        for event in self._copied_on:
            event.synchronize()
        self._copied_on = []

    @property
    def nbytes(self) -> int:
        """Bytes held in snapshot buffers (the memory an asynchronous save costs, beyond the file)."""
        return sum(buffer.numel() * buffer.element_size() for buffer in self._buffers)

    def _copy(self, value: Any, devices: set[torch.device]) -> Any:
        if isinstance(value, torch.Tensor):
            return self._copy_tensor(value, devices)
        if isinstance(value, OrderedDict):
            return OrderedDict((key, self._copy(item, devices)) for key, item in value.items())
        if type(value) is dict:
            return {key: self._copy(item, devices) for key, item in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self._copy(item, devices) for item in value)
        if value is None or isinstance(value, (bool, int, float, str, bytes)):
            return value
        return copy.deepcopy(value)  # a callback's own object, a namedtuple, a set...: copied whole

    def _copy_tensor(self, tensor: torch.Tensor, devices: set[torch.device]) -> torch.Tensor:
        tensor = tensor.detach()
        if (tensor.layout != torch.strided or type(tensor) is not torch.Tensor or tensor.is_quantized
                or tensor.is_nested):
            return tensor.to("cpu", copy=True)  # sparse, quantized, nested, a subclass: a plain fresh copy
        seen = (tensor.device, tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tensor.shape,
                tensor.stride(), tensor.dtype)
        if seen[1] and seen in self._copies:  # the same tensor twice (tied weights): one copy, as torch.save keeps one
            return self._copies[seen]
        buffer = self._copies[seen] = self._buffer_like(tensor)
        non_blocking = tensor.device.type == "cuda"
        buffer.copy_(tensor, non_blocking=non_blocking)
        if non_blocking:
            devices.add(tensor.device)
        return buffer

    def _buffer_like(self, tensor: torch.Tensor) -> torch.Tensor:
        index, self._used = self._used, self._used + 1
        if index < len(self._buffers):
            kept = self._buffers[index]
            if kept.shape == tensor.shape and kept.dtype == tensor.dtype:
                return kept
        if tensor.device.type == "cuda":
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
        else:
            buffer = _page_aligned_empty(tensor.shape, tensor.dtype)
        if index < len(self._buffers):
            self._buffers[index] = buffer
        else:
            self._buffers.append(buffer)
        return buffer


def _page_aligned_empty(shape: torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """A CPU tensor whose storage starts on a page boundary, so a write around the page cache takes it
    without a copy (direct_write.py). torch's allocator aligns to 64 bytes; an anonymous mapping is
    page-aligned, and the tensor keeps it alive. (Pinned buffers are page-aligned already.)"""
    nbytes = shape.numel() * dtype.itemsize
    if nbytes < ALIGNMENT:
        return torch.empty(shape, dtype=dtype)
    private = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE)  # anonymous, not shared memory: THP may back it
    return torch.frombuffer(private, dtype=dtype).view(shape)


def _event_on(device: torch.device) -> torch.cuda.Event:
    """An event after everything queued so far on `device`'s current stream (the copies just issued)."""
    event = torch.cuda.Event()
    event.record(torch.cuda.current_stream(device))
    return event
