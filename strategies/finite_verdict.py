"""Whether a pass's averaged gradients were finite, as the shared-memory transport saw them, for free.

Why it exists: the Trainer's non-finite check (trainer/nonfinite.py) reads every gradient once a step, a
pass over memory as long as the reduction's own (32 MiB: ~5 ms of a ~100 ms step on the project's CPU).
When the transport averages gradients in place (strategies/comm_hooks.py `_mean_in_place`) each rank
already looks at the share it summed while it is in cache, and the ranks' counts combine in shared memory
(`SharedMemoryAllReduce.nonfinite_rounds`), so every rank holds the same verdict without a collective.

The verdict is only given for the tensors it covers, as they were: each averaged tensor is remembered by a
weak reference and its version counter. A `.grad` replaced since (a new tensor), written in place since
(`on_after_backward` editing it, clipping, a no_sync backward adding to it: every in-place op bumps the
version, also through views), or never averaged by this pass gets no verdict, and the check reads it.
"""

from __future__ import annotations

import weakref
from collections.abc import Iterable

import torch


class FiniteVerdict:
    """The last synchronised pass's verdict and the tensors it covers."""

    def __init__(self) -> None:
        self._finite = False
        self._covered: dict[int, tuple[weakref.ref[torch.Tensor], int]] = {}

    def settle(self, finite: bool, averaged: Iterable[torch.Tensor]) -> None:
        """Record a pass's verdict over `averaged`, the tensors holding its means now that it is over."""
        self._finite = finite
        self._covered = {id(tensor): (weakref.ref(tensor), tensor._version) for tensor in averaged}

    def clear(self) -> None:
        self._covered = {}

    def finite(self, grads: Iterable[torch.Tensor]) -> bool | None:
        """The verdict when it covers every one of `grads` unchanged since the pass, else None. "Not finite" is
        said of the pass, not of a tensor: it is given only for all the tensors it covers, and a part of them
        (an optimizer that does not hold every parameter) gets None, and the check reads them."""
        covered, asked = self._covered, set()
        for grad in grads:
            entry = covered.get(id(grad))
            if entry is None or entry[0]() is not grad or grad._version != entry[1]:
                return None
            asked.add(id(grad))
        if not covered:
            return None
        return True if self._finite else (False if len(asked) == len(covered) else None)
