"""How many batches a stage runs (limit_*_batches, fast_dev_run) and device placement."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from trainer.precision import move_to_device

_LIMIT_ATTR = {"train": "limit_train_batches", "validate": "limit_val_batches",
               "test": "limit_test_batches", "predict": "limit_predict_batches"}


def num_batches(trainer: Any, loader: Any, stage: str) -> int:
    """Batches per epoch after `limit_*_batches` (a float is a fraction, an int a count)."""
    limit = getattr(trainer, _LIMIT_ATTR[stage])
    try:
        available = len(loader)
    except TypeError:  # an iterable dataset: only an int limit can bound it
        return int(limit) if isinstance(limit, int) else -1
    if isinstance(limit, float):
        return int(available * limit)
    return min(available, int(limit))


def iterate_limited(trainer: Any, loader: Any, stage: str, skip: int = 0) -> Iterator[tuple[int, Any]]:
    """Yield `(batch_idx, batch on this rank's device)`, stopping at the stage's limit.

    `skip` fast-forwards a resumed epoch: skipped batches are drawn from the loader (so the
    sampler order matches the interrupted run) but not moved or computed on.
    """
    limit = num_batches(trainer, loader, stage)
    if limit == 0:
        return
    device = trainer.strategy.root_device
    for batch_idx, batch in enumerate(loader):
        if 0 <= limit <= batch_idx:
            break
        if batch_idx < skip:
            continue
        batch = trainer.precision_plugin.convert_input(move_to_device(batch, device))
        trainer.metric_store.current_batch_size = _batch_size(batch)
        yield batch_idx, batch


def _batch_size(batch: Any) -> int | None:
    """Lightning's inference: the length of the first tensor found in the batch."""
    import torch

    if isinstance(batch, torch.Tensor):
        return int(batch.shape[0]) if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = _batch_size(item)
            if size is not None:
                return size
    return None
