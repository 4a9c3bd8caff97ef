"""How many batches a stage runs per epoch (`limit_*_batches`, set by the user or by fast_dev_run), and the
loaders behind one entry of a stage: what the data sources count and the loops iterate."""

from __future__ import annotations

from typing import Any

from trainer.combined_loader import CombinedLoader

_EVAL_STAGES = ("validate", "test", "predict")

_LIMIT_ATTR = {"train": "limit_train_batches", "validate": "limit_val_batches",
               "test": "limit_test_batches", "predict": "limit_predict_batches"}


def num_batches(limits: Any, loader: Any, stage: str) -> int:
    """Batches per epoch after `limit_*_batches`, read from `limits` (anything holding the Trainer's
    `limit_*_batches` settings)."""
    return limited_batches(getattr(limits, _LIMIT_ATTR[stage]), loader, stage)


def limited_batches(limit: int | float, loader: Any, stage: str) -> int:
    """Batches per epoch of `loader` after the stage's `limit` (a float is a fraction, an int a count)."""
    try:
        available = len(loader)
    except (TypeError, NotImplementedError):  # no length (an iterable dataset): an int limit bounds it
        return _unsized_limit(limit, stage)
    if isinstance(limit, float):
        limited = int(available * limit)
        # Evaluation shards may differ by a batch: never let a fraction round one rank down to
        # no batch at all, or it would skip the stage (and its epoch-end sync) alone.
        return max(limited, 1) if stage in _EVAL_STAGES and limit > 0 and available > 0 else limited
    return min(available, int(limit))


def _unsized_limit(limit: int | float, stage: str) -> int:
    """-1 (until the loader ends) or a batch count; a fraction of a loader without a length means nothing."""
    if isinstance(limit, int):
        return limit
    if limit in (0.0, 1.0):
        return 0 if limit == 0.0 else -1
    raise ValueError(f"{_LIMIT_ATTR[stage]}={limit} is a fraction of the batches, but the {stage} dataloader has no "
                     "length (an IterableDataset, or __len__ not implemented): use 1.0 (all of it), 0.0 (none) or an "
                     "int number of batches.")


def members(loader: Any) -> list[Any]:
    """The loaders behind one entry of a stage (several for a CombinedLoader)."""
    return loader.flattened if isinstance(loader, CombinedLoader) else [loader]
