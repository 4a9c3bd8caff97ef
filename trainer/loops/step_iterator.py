"""Steps that read their own batches: `training_step(self, dataloader_iter)` (Lightning's form).

A step whose signature names a `dataloader_iter` parameter gets an iterator instead of a batch
and calls `next(dataloader_iter)` as often as it likes (to prefetch, or to take several micro-
batches per step); each call returns `(batch, batch_idx, dataloader_idx)`. The loop runs the
step again while batches remain, so it peeks one item ahead. The batch hooks around such a step
see the last batch fetched: before the first step `(None, 0, 0)`, after a step the batch it
fetched last (what Lightning passes too). Evaluation runs all of a stage's loaders through one
iterator, one after the other.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Iterator
from typing import Any

_NOTHING = object()


def takes_dataloader_iter(step: Any) -> bool:
    """The step reads its own batches (its signature has a `dataloader_iter` parameter)."""
    function = getattr(step, "__func__", step)
    return _names_dataloader_iter(function) if callable(function) else False


@functools.lru_cache(maxsize=256)
def _names_dataloader_iter(function: Any) -> bool:
    try:
        return "dataloader_iter" in inspect.signature(function).parameters
    except (TypeError, ValueError):
        return False


class StepIterator:
    """`next()` gives `(batch, batch_idx, dataloader_idx)` from `(batch_idx, batch, dataloader_idx)`
    items; `has_more()` peeks without consuming; `last` is what was fetched most recently."""

    def __init__(self, items: Iterator[tuple[int, Any, int]]) -> None:
        self._items = items
        self._peeked: Any = _NOTHING
        self.last: tuple[Any, int, int] = (None, 0, 0)

    def __iter__(self) -> StepIterator:
        return self

    def __next__(self) -> tuple[Any, int, int]:
        item = self._take()
        if item is _NOTHING:
            raise StopIteration
        batch_idx, batch, dataloader_idx = item
        self.last = (batch, batch_idx, dataloader_idx)
        return self.last

    def has_more(self) -> bool:
        if self._peeked is _NOTHING:
            self._peeked = next(self._items, _NOTHING)
        return self._peeked is not _NOTHING

    def upcoming_dataloader_idx(self) -> int:
        """The loader of the next batch (what a step logging right after fetching it logs under)."""
        return int(self._peeked[2]) if self.has_more() else self.last[2]

    def _take(self) -> Any:
        if self._peeked is not _NOTHING:
            item, self._peeked = self._peeked, _NOTHING
            return item
        return next(self._items, _NOTHING)
