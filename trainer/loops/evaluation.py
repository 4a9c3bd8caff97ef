"""Validation, test and predict loops: eval mode, no gradients, metrics aggregated per epoch.

Exactly-once evaluation: under DDP each rank iterates an unpadded shard (the strategy's
`process_dataloader(..., for_training=False)`), so ranks may run different numbers of batches.
That is safe because nothing below issues a collective per batch: the only collectives of a
stage are the metric store's epoch-end syncs (`compute_epoch`, called at the same two points on
every rank: before and after `on_*_epoch_end`), each one all-reduce for every plain value plus
the torchmetrics objects' own syncs, in sorted key order. Step-level `sync_dist` values logged
here stay rank-local (see trainer/logged_metrics.py).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from trainer.loops.batches import iterate_limited
from trainer.module_adapter import set_current_hook

# stage -> (hook prefix, step method)
_STAGES = {"validate": ("validation", "validation_step"), "test": ("test", "test_step"),
           "predict": ("predict", "predict_step")}


def has_step(module: nn.Module, stage: str) -> bool:
    return callable(getattr(module, _STAGES[stage][1], None))


def run_evaluation(trainer: Any, module: nn.Module, loaders: list[Any], stage: str) -> list[dict[str, float]]:
    """Run `validation_step`/`test_step` over every loader; returns Lightning's result list:
    one dict of epoch-level metrics per dataloader (the same dict for all, as metrics are
    aggregated over the whole stage)."""
    prefix, step_name = _STAGES[stage]
    callbacks, store = trainer.callback_list, trainer.metric_store
    was_training = module.training
    store.reset_stage(stage)
    module.eval()
    callbacks.call(f"on_{prefix}_start", trainer, module)
    callbacks.call(f"on_{prefix}_epoch_start", trainer, module)
    with torch.no_grad():
        for loader_idx, loader in enumerate(loaders):
            extra = (loader_idx,) if len(loaders) > 1 else ()
            for batch_idx, batch in iterate_limited(trainer, loader, stage):
                callbacks.call(f"on_{prefix}_batch_start", trainer, module, batch, batch_idx, *extra)
                output = _step(trainer, module, step_name, batch, batch_idx, extra)
                callbacks.call(f"on_{prefix}_batch_end", trainer, module, output, batch, batch_idx, *extra)
    store.compute_epoch(stage)
    callbacks.call(f"on_{prefix}_epoch_end", trainer, module)
    store.compute_epoch(stage)
    trainer.write_logger_metrics()
    callbacks.call(f"on_{prefix}_end", trainer, module)
    module.train(was_training)
    return [_stage_results(trainer, stage) for _ in loaders] if loaders else []


def run_predict(trainer: Any, module: nn.Module, loaders: list[Any]) -> list[Any]:
    """Predictions of this rank, per loader (a single loader gives a flat list)."""
    callbacks = trainer.callback_list
    module.eval()
    callbacks.call("on_predict_start", trainer, module)
    callbacks.call("on_predict_epoch_start", trainer, module)
    results: list[list[Any]] = []
    with torch.no_grad():
        for loader_idx, loader in enumerate(loaders):
            extra = (loader_idx,) if len(loaders) > 1 else ()
            outputs = []
            for batch_idx, batch in iterate_limited(trainer, loader, "predict"):
                callbacks.call("on_predict_batch_start", trainer, module, batch, batch_idx, *extra)
                output = _step(trainer, module, "predict_step", batch, batch_idx, extra)
                callbacks.call("on_predict_batch_end", trainer, module, output, batch, batch_idx, *extra)
                outputs.append(output)
            results.append(outputs)
    callbacks.call("on_predict_epoch_end", trainer, module)
    callbacks.call("on_predict_end", trainer, module)
    return results[0] if len(results) == 1 else results  # type: ignore[return-value]


def _step(trainer: Any, module: nn.Module, step_name: str, batch: Any, batch_idx: int, extra: tuple) -> Any:
    set_current_hook(module, step_name)
    try:
        with trainer.precision_plugin.autocast():
            return getattr(module, step_name)(batch, batch_idx, *extra)
    finally:
        set_current_hook(module, None)


def _stage_results(trainer: Any, stage: str) -> dict[str, float]:
    metrics = trainer.callback_metrics
    return {name: float(metrics[name]) for name in trainer.metric_store.epoch_keys(stage) if name in metrics}
