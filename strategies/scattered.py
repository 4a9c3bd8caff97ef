"""Several tensors read and written as one flat sequence: a bucket's gradients where autograd left them.

Why it exists: on a CPU a bucket costs a pass over memory to fill (each gradient copied into its slot), and
the shared-memory transport (strategies/shm_transport.py) then copies the bucket into its slots once more.
Handing the transport the gradients themselves, in the bucket's order, lets its own copy do both jobs: it
reads each gradient once, divides it on the way into its slot, and writes the average back where the
gradient was. One contiguous tensor is the one-piece case, so the transport has one code path.
"""

from __future__ import annotations

import bisect
from collections.abc import Iterator, Sequence

import torch


class Scattered:
    """Contiguous tensors of one dtype and device, in order, addressed as one flat run of `numel` elements."""

    def __init__(self, tensors: Sequence[torch.Tensor]) -> None:
        if not tensors:
            raise ValueError("Scattered needs at least one tensor.")
        first = tensors[0]
        for tensor in tensors:
            if not tensor.is_contiguous() or (tensor.dtype, tensor.device) != (first.dtype, first.device):
                raise ValueError(f"Scattered takes contiguous tensors of one dtype and device; got {tensor.dtype} on "
                                 f"{tensor.device} (contiguous={tensor.is_contiguous()}) after {first.dtype} on "
                                 f"{first.device}.")
        self.tensors = list(tensors)
        self._flats = [tensor.view(-1) for tensor in tensors]
        self._starts: list[int] = []
        total = 0
        for flat in self._flats:
            self._starts.append(total)
            total += flat.numel()
        self.numel, self.dtype, self.device = total, first.dtype, first.device

    def pieces(self, start: int, stop: int) -> Iterator[tuple[torch.Tensor, int]]:
        """The flat slices covering elements [start, stop), each with its offset from `start`."""
        index = bisect.bisect_right(self._starts, start) - 1
        while index < len(self._flats) and self._starts[index] < stop:
            begin = self._starts[index]
            low, high = max(start, begin), min(stop, begin + self._flats[index].numel())
            if high > low:
                yield self._flats[index][low - begin:high - begin], low - start
            index += 1

    def single(self, start: int, stop: int) -> torch.Tensor | None:
        """Elements [start, stop) as one slice when they lie in one tensor (no scratch needed), else None."""
        index = bisect.bisect_right(self._starts, start) - 1
        begin = self._starts[index]
        if stop - begin > self._flats[index].numel():
            return None
        return self._flats[index][start - begin:stop - begin]

    def read_into(self, start: int, destination: torch.Tensor, divisor: int = 1) -> None:
        """Copy elements [start, start + len(destination)) into `destination` (converting to its dtype),
        divided by `divisor` on the way unless it is 1: one pass over each source. Into a narrower dtype (a
        compressed hook's wire dtype) it rounds first and divides the rounded values, as torch's fp16/bf16 hooks
        do: dividing first rounds once instead of twice, other bits where the result is subnormal (fp16 below
        6e-5, common for gradients) or the world size is no power of two."""
        for piece, offset in self.pieces(start, start + destination.numel()):
            target = destination[offset:offset + piece.numel()]
            if divisor == 1:
                target.copy_(piece)
            elif target.dtype != piece.dtype:
                target.copy_(piece)
                target.div_(divisor)
            else:
                torch.div(piece, divisor, out=target)

    def write_from(self, start: int, source: torch.Tensor) -> None:
        """Copy `source` over elements [start, start + len(source)) (converting to this run's dtype)."""
        for piece, offset in self.pieces(start, start + source.numel()):
            piece.copy_(source[offset:offset + piece.numel()])
