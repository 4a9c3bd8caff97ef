"""Validation, test, predict and the sanity check: eval mode, no gradients, metrics per epoch.

Lightning's order for one evaluation::

    [during fit, after a stepping batch: on_validation_model_zero_grad]
    on_{stage}_model_eval (default: model.eval(); each submodule's mode is restored afterwards)
    on_{stage}_start; on_{stage}_epoch_start
    for loader, for batch: batch-transfer hooks; on_{stage}_batch_start; *_step; on_{stage}_batch_end
        [several loaders, not the sanity check: the loader's epoch metrics once its batches are over]
    epoch metrics; on_{stage}_epoch_end; metrics logged there; on_{stage}_end
    on_{stage}_model_train when overridden, else the saved modes put back

Exactly-once evaluation: under DDP each rank iterates an unpadded shard (the strategy's
`process_dataloader(..., for_training=False)`), so ranks may run different numbers of batches.
That is safe because nothing below issues a collective per batch: the only collectives of a
stage are the metric store's epoch syncs (`compute_epoch`, called at the same points on every
rank: after each of several loaders, before and after `on_*_epoch_end`), each one all-reduce for
every plain value plus the torchmetrics objects' own syncs, in sorted key order. Step-level `sync_dist` values logged
here stay rank-local (see trainer/logged_metrics.py).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn

from trainer.combined_loader import CombinedLoader
from trainer.data_sources import as_counts, overrides
from trainer.stage import Stage
from trainer.batch_counts import num_batches
from trainer.loops.batches import iterate_limited, set_sampler_epoch
from trainer.loops.metric_writes import write_eval_step_metrics, write_logger_metrics
from trainer.loops.signatures import check_eval_signatures
from trainer.prediction_run import PredictionRun
from trainer.loops.step_iterator import StepIterator, takes_dataloader_iter
from trainer.loops.training_step import takes_batch_idx
from trainer.module_adapter import set_current_hook
from trainer.profiler import profile_strategy
from trainer.seed import rng_states, restore_rng_states
from trainer.state import EvalCount

# stage -> (hook prefix, step method)
_STAGES = {"validate": ("validation", "validation_step"), "test": ("test", "test_step"),
           "predict": ("predict", "predict_step")}


def has_step(module: nn.Module, stage: str) -> bool:
    """The module implements the stage's step itself (Lightning's base class defines all of them)."""
    return overrides(module, _STAGES[stage][1])


def run_sanity_check(parts: Stage, module: nn.Module) -> None:
    """A few validation batches before training (`num_sanity_val_steps`), to fail fast on a broken
    validation_step. Nothing it logs reaches a logger or the metrics dicts, and the RNG state is
    put back afterwards, so training is the same with or without it."""
    callbacks, store = parts.callbacks, parts.metrics
    saved_rng = rng_states(parts.strategy.root_device.type)
    parts.status.stage = "sanity_check"
    callbacks.call_callbacks("on_sanity_check_start", parts.trainer, module)
    loaders = parts.data.request("validate", parts.loader_source(), required=False)
    steps = parts.live.num_sanity_val_steps
    full = [num_batches(parts.live, loader, "validate") for loader in loaders]
    parts.data.counts.set_val(parts.status.fn, full)
    limits = [limit if steps == -1 else (steps if limit < 0 else min(steps, limit)) for limit in full]
    parts.data.counts.sanity_val = as_counts(limits)
    if any(limits):
        run_evaluation(parts, module, loaders, "validate", limits=limits)
    callbacks.call_callbacks("on_sanity_check_end", parts.trainer, module)
    parts.progress.fit_validation = EvalCount()  # Lightning counts no sanity batches
    store.clear_views()
    parts.data.seen_batches.clear()  # the logger's evaluation steps count from the first real validation
    parts.status.stage = None
    restore_rng_states(saved_rng, parts.strategy.root_device.type)


def run_evaluation(parts: Stage, module: nn.Module, loaders: list[Any], stage: str,
                   limits: list[int] | None = None) -> list[dict[str, float]]:
    """Run `validation_step`/`test_step` over every loader; returns Lightning's result list: one dict
    of epoch-level metrics per dataloader."""
    prefix, step_name = _STAGES[stage]
    store = parts.metrics
    previous_stage = parts.status.stage
    if previous_stage != "sanity_check":
        parts.status.stage = stage
    counts = limits if limits is not None else [num_batches(parts.live, loader, stage) for loader in loaders]
    _record_counts(parts, stage, _per_member(parts, loaders, counts, stage), limits is not None)
    if not loaders or not any(counts):
        parts.status.stage = previous_stage
        return []
    check_eval_signatures(module, stage, len(loaders))
    if parts.status.fn != "fit":
        store.clear_views()  # validate()/test() report only what they log (Lightning resets here)
    store.reset_stage(stage)
    if parts.status.fn == "fit" and previous_stage != "sanity_check":
        parts.fit_run.validated_in_fit = True
    for loader in loaders:  # as Lightning: evaluation samplers may shuffle by the training epoch
        set_sampler_epoch(loader, parts.progress.current_epoch)
    with _eval_context(parts):  # the whole stage, hooks included
        return _evaluate_loaders(parts, module, loaders, stage, counts, previous_stage)


def _evaluate_loaders(parts: Stage, module: nn.Module, loaders: list[Any], stage: str, counts: list[int],
                      previous_stage: str | None) -> list[dict[str, float]]:
    prefix, step_name = _STAGES[stage]
    callbacks, store = parts.callbacks, parts.metrics
    modes = _capture_modes(module)
    callbacks.call_module(f"on_{prefix}_model_eval", module)
    callbacks.call(f"on_{prefix}_start", parts.trainer, module)
    callbacks.call(f"on_{prefix}_epoch_start", parts.trainer, module)
    # Lightning: with several dataloaders, a dataloader's epoch values are published once it is done,
    # except in the sanity check, which never shows them (not even in on_validation_epoch_end)
    sanity, several = previous_stage == "sanity_check", len(loaders) > 1
    count = EvalCount() if sanity else parts.progress.eval_count(stage, in_fit=parts.status.fn == "fit")
    count.start_run()
    run = _run_fetching_steps if takes_dataloader_iter(getattr(module, step_name)) else _run_batches
    run(parts, module, loaders, stage, counts,
        lambda output, loader_idx: _write_step_metrics(parts, stage, loader_idx),
        loader_done=None if sanity or not several else lambda loader_idx: store.compute_epoch(stage, loader_idx),
        count=count)
    store.dataloader_idx = None
    store.compute_epoch(stage, with_loaders=not sanity)
    callbacks.call(f"on_{prefix}_epoch_end", parts.trainer, module)
    store.compute_epoch(stage, with_loaders=not sanity)
    results = [store.stage_results(stage, idx if len(loaders) > 1 else None) for idx in range(len(loaders))]
    write_logger_metrics(parts)
    callbacks.call(f"on_{prefix}_end", parts.trainer, module)
    store.reset_metric_objects(stage)
    _restore_train_mode(callbacks, module, prefix, modes)
    parts.status.stage = previous_stage
    return results


def _run_batches(parts: Stage, module: nn.Module, loaders: list[Any], stage: str, counts: list[int],
                 after_step: Any, loader_done: Any = None, *, count: EvalCount, before_batch_end: Any = None) -> None:
    """Each loader in turn, each batch: its batch hooks around the step (`dataloader_idx` passed
    when there are several loaders); `before_batch_end(batch_idx, dataloader_idx)` before the batch's
    end hooks, `after_step(output, dataloader_idx)` after them, and `loader_done(dataloader_idx)` once
    a loader's batches are over. `count` counts the batches."""
    prefix, step_name = _STAGES[stage]
    callbacks, store = parts.callbacks, parts.metrics
    for loader_idx, (loader, limit) in enumerate(zip(loaders, counts)):
        store.dataloader_idx = loader_idx if len(loaders) > 1 else None
        extra = (loader_idx,) if len(loaders) > 1 else ()
        batches = iterate_limited(parts, loader, stage, dataloader_idx=loader_idx, limit=limit)
        for batch_idx, batch in batches:
            callbacks.call(f"on_{prefix}_batch_start", parts.trainer, module, batch, batch_idx, *extra)
            output = _step(parts, module, step_name, batch, batch_idx, extra)
            count.batch_done(loader_idx == len(loaders) - 1 and batch_idx + 1 == limit)
            if before_batch_end is not None:
                before_batch_end(batch_idx, loader_idx)
            callbacks.call(f"on_{prefix}_batch_end", parts.trainer, module, output, batch, batch_idx, *extra)
            count.end_hooks_done()
            after_step(output, loader_idx)
        if loader_done is not None:
            loader_done(loader_idx)
    count.is_last_batch = True  # also after a loader without a length


def _write_step_metrics(parts: Stage, stage: str, loader_idx: int) -> None:
    """This batch's step values go to the loggers at the count of batches this loader has run."""
    seen = parts.data.seen_batches.get((stage, loader_idx), 0)
    write_eval_step_metrics(parts, seen)
    parts.data.seen_batches[(stage, loader_idx)] = seen + 1


def _run_fetching_steps(parts: Stage, module: nn.Module, loaders: list[Any], stage: str, counts: list[int],
                        after_step: Any, loader_done: Any = None, *, count: EvalCount,
                        before_batch_end: Any = None) -> None:
    """A step that reads its own batches (`validation_step(self, dataloader_iter)`): all loaders
    through one StepIterator, the step run while batches remain, the batch hooks given the batch
    fetched last (see trainer/loops/step_iterator.py). `after_step(output, dataloader_idx)`;
    `loader_done(dataloader_idx)` when the batch fetched last comes from the next loader, and at
    the end. `count` counts the steps."""
    prefix, step_name = _STAGES[stage]
    callbacks, store = parts.callbacks, parts.metrics
    several = len(loaders) > 1
    steps = StepIterator((batch_idx, batch, loader_idx)
                         for loader_idx, (loader, limit) in enumerate(zip(loaders, counts))
                         for batch_idx, batch in iterate_limited(parts, loader, stage,
                                                                 dataloader_idx=loader_idx, limit=limit))
    previous_loader = 0
    while steps.has_more():
        batch, batch_idx, loader_idx = steps.last
        if loader_done is not None and loader_idx != previous_loader:
            loader_done(previous_loader)
        previous_loader = loader_idx
        callbacks.call(f"on_{prefix}_batch_start", parts.trainer, module, batch, batch_idx,
                       *((loader_idx,) if several else ()))
        store.dataloader_idx = steps.upcoming_dataloader_idx() if several else None
        output = _step(parts, module, step_name, steps, batch_idx, ())
        batch, batch_idx, loader_idx = steps.last
        count.batch_done(False)  # whether it was the last shows once the loop peeks (not before the hooks)
        if before_batch_end is not None:
            before_batch_end(batch_idx, loader_idx)
        callbacks.call(f"on_{prefix}_batch_end", parts.trainer, module, output, batch, batch_idx,
                       *((loader_idx,) if several else ()))
        count.end_hooks_done()
        after_step(output, loader_idx)
    count.is_last_batch = True
    if loader_done is not None:
        loader_done(previous_loader)


def run_predict(parts: Stage, module: nn.Module, run: PredictionRun) -> Any:
    """Predictions of this rank, per loader (a single loader gives a flat list); None when neither
    `return_predictions` nor a prediction writer at epoch end needs them kept. `run` is the predict
    run prediction writers read (`trainer.predict_loop`), already holding the stage's loaders."""
    parts.status.stage = "predict"
    parts.data.counts.predict = as_counts([num_batches(parts.live, loader, "predict") for loader in run.loaders])
    check_eval_signatures(module, "predict", len(run.loaders))
    for loader in run.loaders:
        set_sampler_epoch(loader, parts.progress.current_epoch)
    parts.metrics.clear_views()
    with _eval_context(parts):
        return _predict_loaders(parts, module, run)


def _predict_loaders(parts: Stage, module: nn.Module, prediction: PredictionRun) -> Any:
    callbacks = parts.callbacks
    modes = _capture_modes(module)
    callbacks.call_module("on_predict_model_eval", module)
    callbacks.call("on_predict_start", parts.trainer, module)
    callbacks.call("on_predict_epoch_start", parts.trainer, module)
    counts = [num_batches(parts.live, loader, "predict") for loader in prediction.loaders]
    count = parts.progress.eval_count("predict", in_fit=False)
    count.start_run()
    run = _run_fetching_steps if takes_dataloader_iter(module.predict_step) else _run_batches
    run(parts, module, prediction.loaders, "predict", counts, prediction.add, count=count,
        before_batch_end=prediction.batch_done)
    parts.metrics.dataloader_idx = None
    callbacks.call("on_predict_epoch_end", parts.trainer, module)
    callbacks.call("on_predict_end", parts.trainer, module)
    _set_modes(module, modes)
    return prediction.results() if prediction.keep_predictions else None


def print_results(stage: str, results: list[dict[str, float]]) -> None:
    """A small table of what `validate`/`test` returns, one column per dataloader."""
    keys = sorted({key for result in results for key in result})
    if not keys:
        return
    width = max(len(key) for key in keys) + 2
    header = f"{stage.capitalize() + ' metric':<{width}}" + "".join(f"DataLoader {i:<8}" for i in range(len(results)))
    print(header)
    for key in keys:
        cells = "".join(f"{results[i][key]:<19.6g}" if key in results[i] else " " * 19 for i in range(len(results)))
        print(f"{key:<{width}}{cells}")


def _per_member(parts: Stage, loaders: list[Any], counts: list[int], stage: str) -> list[int]:
    """Lightning reports a combined loader's batches per member loader (`num_val_batches == [3, 2]`
    for one CombinedLoader of a 3- and a 2-batch loader), although it runs as one."""
    if not any(isinstance(loader, CombinedLoader) for loader in loaders):
        return counts
    reported: list[int] = []
    for loader, count in zip(loaders, counts):
        if isinstance(loader, CombinedLoader):
            reported += [num_batches(parts.live, member, stage) for member in loader.flattened]
        else:
            reported.append(count)
    return reported


def _record_counts(parts: Stage, stage: str, counts: list[int], sanity: bool) -> None:
    if sanity:
        parts.data.counts.sanity_val = as_counts(counts)
    elif stage == "validate":
        parts.data.counts.set_val(parts.status.fn, counts)
    else:
        parts.data.counts.test = as_counts(counts)


@contextlib.contextmanager
def _eval_context(parts: Stage) -> Iterator[None]:
    """Lightning's rule: `validate`/`test`/`predict` run under torch.inference_mode (unless
    `inference_mode=False`, or under gloo, whose collectives reject inference tensors); validation
    inside `fit` under no_grad, so what it computes can still meet training tensors."""
    gloo = torch.distributed.is_available() and torch.distributed.is_initialized() \
        and torch.distributed.get_backend() == "gloo"
    inference = parts.fixed.inference_mode and not gloo and parts.status.fn != "fit"
    context = torch.inference_mode() if inference else torch.no_grad()
    with context:
        yield


def _capture_modes(module: nn.Module) -> dict[nn.Module, bool]:
    return {child: child.training for child in module.modules()}


def _set_modes(module: nn.Module, modes: dict[nn.Module, bool]) -> None:
    for child, training in modes.items():
        child.training = training


def _restore_train_mode(callbacks: Any, module: nn.Module, prefix: str, modes: dict[nn.Module, bool]) -> None:
    """A module that overrides on_{stage}_model_train decides itself; otherwise every submodule gets
    back the mode it had (so frozen submodules a user put in eval stay there)."""
    hook = f"on_{prefix}_model_train"
    if overrides(module, hook):
        callbacks.call_module(hook, module)
    else:
        _set_modes(module, modes)


def _step(parts: Stage, module: nn.Module, step_name: str, batch: Any, batch_idx: int, extra: tuple) -> Any:
    previous = set_current_hook(module, step_name)
    try:
        step = getattr(module, step_name)
        args = (batch, batch_idx, *extra) if takes_batch_idx(step) else (batch,)
        with parts.precision.autocast(), profile_strategy(parts, step_name):
            return parts.strategy.evaluation_step(module, step_name, *args)
    finally:
        set_current_hook(module, previous)
