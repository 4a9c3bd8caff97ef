"""Several dataloaders read as one, with Lightning's four ways of combining them.

`fit(train_dataloaders={"a": loader_a, "b": loader_b})` trains on batches shaped like the
collection (`{"a": batch_a, "b": batch_b}`), Lightning's `max_size_cycle` default: the epoch is as
long as the longest loader and shorter ones start over. The other modes: `min_size` (stop with
the shortest), `max_size` (run to the longest; an exhausted loader contributes `None`) and
`sequential` (one loader after the other, each batch tagged with its loader's index; what
evaluation does with several loaders). Collections may nest (`{"a": [loader_1, loader_2]}`): every
loader in them is a member, and batches come in the collection's shape; a list of plain values
(`[0, 1, 2]`) is itself a member. A Lightning `CombinedLoader` handed to our Trainer is read
through its public `iterables` and becomes one of these.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from torch.utils._pytree import tree_flatten, tree_unflatten  # Lightning's reading of a collection, too

MODES = ("max_size_cycle", "min_size", "max_size", "sequential")


class CombinedLoader:
    """A collection (dict, list, tuple or one iterable) of iterables, iterated together by `mode`.

    Unlike Lightning's, its length is known before iterating: `len()` of every member that has
    one (a member without a length makes the combination unsized where the mode needs it).
    """

    def __init__(self, iterables: Any, mode: str = "min_size") -> None:
        if mode not in MODES:
            raise ValueError(f"CombinedLoader mode {mode!r} is not one of {list(MODES)}.")
        self.mode = mode
        self._iterables = iterables
        self._flattened, self._shape = tree_flatten(iterables, is_leaf=_is_member)

    @property
    def iterables(self) -> Any:
        """The collection as given (with each member replaced when `flattened` was assigned)."""
        return self._iterables

    @property
    def flattened(self) -> list[Any]:
        return list(self._flattened)

    @flattened.setter
    def flattened(self, members: list[Any]) -> None:
        """Replace the members in order (the strategy swaps in distributed samplers this way)."""
        if len(members) != len(self._flattened):
            raise ValueError(f"CombinedLoader holds {len(self._flattened)} iterables; got {len(members)} to replace "
                             "them.")
        self._flattened = list(members)
        self._iterables = tree_unflatten(self._flattened, self._shape)

    def lengths(self) -> list[int | float]:
        """Each member's number of batches (inf where it has no length)."""
        return [_length(member) for member in self._flattened]

    def __len__(self) -> int:
        lengths = self.lengths()
        if not lengths:
            return 0
        if self.mode == "min_size":
            total = min(lengths)
        elif self.mode == "sequential":
            total = sum(lengths)
        else:
            total = max(lengths)
        if total == float("inf"):
            raise TypeError(f"this CombinedLoader ({self.mode}) has a member without a length, so it has none")
        return int(total)

    def __iter__(self) -> Iterator[Any]:
        if self.mode == "sequential":
            return self._sequential()
        return self._together()

    def _sequential(self) -> Iterator[tuple[Any, int, int]]:
        for dataloader_idx, member in enumerate(self._flattened):
            for batch_idx, batch in enumerate(member):
                yield batch, batch_idx, dataloader_idx

    def _together(self) -> Iterator[Any]:
        if not self._flattened:
            return
        iterators = [iter(member) for member in self._flattened]
        exhausted = [False] * len(iterators)
        while True:
            batches = []
            for index, iterator in enumerate(iterators):
                batch, iterators[index], ended = self._next_of(index, iterator, exhausted[index])
                if ended and self.mode == "min_size":
                    return
                exhausted[index] = exhausted[index] or ended
                batches.append(batch)
            if all(exhausted):  # the longest member has ended (max_size, max_size_cycle)
                return
            yield tree_unflatten(batches, self._shape)

    def _next_of(self, index: int, iterator: Iterator[Any], was_exhausted: bool) -> tuple[Any, Iterator[Any], bool]:
        """The member's next batch; (batch, iterator, whether it has ended). `max_size_cycle` restarts
        an ended member; `max_size` gives None for it from then on."""
        sentinel = object()
        if was_exhausted and self.mode == "max_size":
            return None, iterator, True
        batch = next(iterator, sentinel)
        if batch is not sentinel:
            return batch, iterator, False
        if self.mode == "max_size_cycle":
            iterator = iter(self._flattened[index])
            batch = next(iterator, sentinel)
            return (None if batch is sentinel else batch), iterator, True
        return None, iterator, True


def _is_member(node: Any) -> bool:
    """Whether `node` is one iterable to draw batches from rather than a collection of them: anything but a
    list, tuple or dict, and one of those whose items are all plain values (`[0, 1, 2]` is data; Lightning's
    reading)."""
    if isinstance(node, dict):
        items: Iterable[Any] = node.values()
    elif isinstance(node, (list, tuple)):
        items = node
    else:
        return True
    return all(isinstance(item, (int, float, str)) for item in items)


def _length(member: Iterable[Any]) -> int | float:
    try:
        return len(member)  # type: ignore[arg-type]
    except TypeError:
        return float("inf")
