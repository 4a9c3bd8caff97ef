"""Where each stage's dataloaders come from, and asking for them when Lightning does.

A stage's loaders come from (first match): the dataloaders passed to `fit`/`validate`/...; the
DataModule's `*_dataloader` hook; the module's. A hook counts only when it is overridden and not
disabled (`model.val_dataloader = None` switches validation off, as in Lightning). Loaders are
requested lazily, at the point of the loop where Lightning requests them (the validation ones at
the sanity check, the training one right before `on_train_start`), so hooks that build data
from state set up earlier (`setup`, `configure_optimizers`) see that state.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TYPE_CHECKING

from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from strategies.sampler import rebuild_dataloader
from strategies.rank_zero import rank_zero_warn
from trainer.batch_counts import limited_batches
from trainer.combined_loader import CombinedLoader
from trainer.datamodule import LightningDataModule
from trainer.lightning_types import is_lightning_instance

if TYPE_CHECKING:
    from strategies.base import Strategy

HOOKS = {"train": "train_dataloader", "validate": "val_dataloader", "test": "test_dataloader",
         "predict": "predict_dataloader"}
_BASE_CLASSES = ("LightningDataModule", "LightningModule", "DataHooks", "ModelHooks")


def is_datamodule(obj: Any) -> bool:
    """Ours or Lightning's DataModule (Lightning's looked up only if it is imported: trainer/lightning_types.py)."""
    return isinstance(obj, LightningDataModule) or is_lightning_instance(obj, "LightningDataModule")


def overrides(owner: Any, hook: str) -> bool:
    """True when `owner` implements `hook` itself (on its class or instance) and has not disabled it."""
    if owner is None:
        return False
    if hook in getattr(owner, "__dict__", {}):
        attribute = owner.__dict__[hook]
        if not callable(attribute):
            return False
        wrapped = inspect.unwrap(attribute)  # a recording wrapper around the base default is no override
        function = getattr(wrapped, "__func__", wrapped)
        return getattr(function, "__qualname__", "").split(".")[0] not in _BASE_CLASSES
    method = getattr(type(owner), hook, None)
    if method is None or not callable(method):
        return False
    return method.__qualname__.split(".")[0] not in _BASE_CLASSES


INFINITE = float("inf")


def unlimited_if_negative(count: int) -> int | float:
    """Lightning's counts: a negative count (a loader without a length, `max_steps=-1`) is unbounded."""
    return INFINITE if count < 0 else count


@dataclass
class BatchCounts:
    """Batches each loop runs, after the `limit_*_batches` (inf: a loader without a length): what the
    Trainer reports as Lightning's `num_*_batches`. Each loop records its own when it requests its
    loaders; they stay readable after the stage. Validation keeps two lists, fit's and validate()'s,
    as Lightning's two validation loops do."""

    train: int | float = INFINITE
    val: dict[str, list[int | float]] = field(default_factory=dict)  # "fit" or "validate" -> per dataloader
    sanity_val: list[int | float] = field(default_factory=list)
    test: list[int | float] = field(default_factory=list)
    predict: list[int | float] = field(default_factory=list)

    def val_of(self, fn: str | None) -> list[int | float]:
        """Validation's counts for the entry point now running (`trainer.state.fn`)."""
        return self.val.get(_validation_owner(fn), [])

    def set_val(self, fn: str | None, counts: list[int]) -> None:
        self.val[_validation_owner(fn)] = as_counts(counts)


def _validation_owner(fn: str | None) -> str:
    return "validate" if fn == "validate" else "fit"


def as_counts(counts: list[int]) -> list[int | float]:
    return [unlimited_if_negative(count) for count in counts]


@dataclass(frozen=True)
class LoaderSource:
    """What requesting a stage's loaders uses, handed in by the stage (not the whole Trainer): the
    strategy that shards them, the datamodule and module whose `*_dataloader` hooks supply them, how
    a module hook is called (through the callback list, which records it), and two settings:
    `distributed_sampler` (Lightning's `use_distributed_sampler`) and `overfit` (`overfit_batches`
    in a fit: the training loaders read in order)."""

    strategy: Strategy
    datamodule: Any
    module: Any
    call_module_hook: Callable[..., Any]
    distributed_sampler: bool
    overfit: bool


class DataSources:
    """The Trainer's record of given dataloaders, of the loaders each stage is using, and of their
    batch counts."""

    def __init__(self) -> None:
        self.counts = BatchCounts()
        self.given: dict[str, Any] = {}
        self.loaders: dict[str, list[Any]] = {}
        # evaluation batches run per (stage, dataloader) since its loaders were requested: the step
        # Lightning logs evaluation step values at
        self.seen_batches: dict[tuple[str, int], int] = {}

    @property
    def train_dataloader(self) -> Any:
        """The training loader, or the collection of them (as given, with samplers injected)."""
        loaders = self.loaders.get("train")
        if not loaders:
            return None
        return loaders[0].iterables if isinstance(loaders[0], CombinedLoader) else loaders[0]

    @property
    def val_dataloaders(self) -> Any:
        return _one_or_list(self.loaders.get("validate"))

    @property
    def test_dataloaders(self) -> Any:
        return _one_or_list(self.loaders.get("test"))

    @property
    def predict_dataloaders(self) -> Any:
        return _one_or_list(self.loaders.get("predict"))

    def reset(self, given: dict[str, Any]) -> None:
        self.given = {stage: loaders for stage, loaders in given.items() if loaders is not None}
        self.loaders = {}
        self.seen_batches = {}

    def defined(self, stage: str, datamodule: Any, module: Any) -> bool:
        """Whether `stage` has data: loaders given for it, or its hook on the datamodule or the module."""
        if stage in self.given:
            return True
        return any(overrides(owner, HOOKS[stage]) for owner in (datamodule, module))

    def val_defined(self, datamodule: Any, module: Any) -> bool:
        return self.defined("validate", datamodule, module)

    def validates(self, datamodule: Any, module: Any, limit_val_batches: int | float) -> bool:
        """Whether the fit validates at all (Lightning's `trainer.enable_validation`): validation data is
        defined and `limit_val_batches` is not 0."""
        return self.val_defined(datamodule, module) and limit_val_batches != 0

    def request(self, stage: str, source: LoaderSource, required: bool = True) -> list[Any]:
        """Call the stage's hook (or take the given loaders), shard them for this rank, remember them."""
        loaders = self.given.get(stage)
        if loaders is None:
            loaders = _from_hooks(source, stage)
        source.strategy.barrier(f"{HOOKS[stage]}()")
        if loaders is None:
            if required:
                raise ValueError(f"Trainer.{'fit' if stage == 'train' else stage}() found no data: pass dataloaders, "
                                 f"a datamodule with {HOOKS[stage]}(), or implement {HOOKS[stage]}() on the module.")
            self.loaders[stage] = []
            return []
        loaders = as_run_order(loaders, stage)
        if source.overfit:
            loaders = [_each_dataloader(loader, lambda one: _without_shuffle(one, stage)) for loader in loaders]
        if source.distributed_sampler:
            shuffle = _shuffles_shards(source, stage)

            def shard(one: DataLoader) -> Any:  # prediction keeps the loader's sampler and its order (Lightning's)
                return source.strategy.process_dataloader(one, for_training=stage == "train", shuffle=shuffle,
                                                          keep_sampler=stage == "predict")
            loaders = [_each_dataloader(loader, shard) for loader in loaders]
        self.loaders[stage] = loaders
        for key in [key for key in self.seen_batches if key[0] == stage]:
            del self.seen_batches[key]
        return loaders

    def count_training_batches(self, source: LoaderSource, limit: int | float) -> int | float:
        """Training batches per epoch before the loader was requested (for `estimated_stepping_batches`
        inside `configure_optimizers`): request it now, as Lightning does; `limit` is `limit_train_batches`."""
        loaders = self.loaders.get("train") or self.request("train", source)
        self.counts.train = unlimited_if_negative(limited_batches(limit, loaders[0], "train") if loaders else 0)
        return self.counts.train


def _from_hooks(source: LoaderSource, stage: str) -> Any:
    hook = HOOKS[stage]
    datamodule, module = source.datamodule, source.module
    if overrides(datamodule, hook):
        return _returned(getattr(datamodule, hook)(), datamodule, hook)
    if module is not None and overrides(module, hook):
        return _returned(source.call_module_hook(hook, module), module, hook)
    return None


def _returned(loaders: Any, owner: Any, hook: str) -> Any:
    """A hook that is implemented must return data (as in Lightning); None is a forgotten `return`."""
    if loaders is None:
        raise TypeError(f"{type(owner).__name__}.{hook}() returned None: return a DataLoader (or a list or dict of "
                        f"them). To run without it, do not implement {hook}() or set `{hook} = None` on the "
                        "instance.")
    return loaders


def as_run_order(loaders: Any, stage: str) -> list[Any]:
    """What the stage iterates, one entry after the other. Training takes one entry: a collection
    of loaders becomes one `CombinedLoader` (Lightning's `max_size_cycle`). Evaluation runs a
    collection's loaders one by one (each with its `dataloader_idx`); a CombinedLoader in a
    non-sequential mode is evaluated as one loader of combined batches."""
    loaders = _ours_if_lightning_combined(loaders)
    if stage == "train":
        if isinstance(loaders, CombinedLoader):
            if loaders.mode == "sequential":
                raise ValueError("fit() cannot train on CombinedLoader(mode='sequential'): training takes one batch "
                                 "per step; use 'max_size_cycle', 'min_size' or 'max_size'.")
            return [loaders]
        if isinstance(loaders, (dict, list, tuple)):
            return [CombinedLoader(loaders, "max_size_cycle")]
        return [loaders]
    if isinstance(loaders, CombinedLoader):
        return loaders.flattened if loaders.mode == "sequential" else [loaders]
    if isinstance(loaders, dict):
        return list(loaders.values())
    if isinstance(loaders, (list, tuple)):
        return list(loaders)
    return [loaders]


def _ours_if_lightning_combined(loaders: Any) -> Any:
    """Lightning's CombinedLoader becomes ours, read through its public `iterables` and its mode."""
    if is_lightning_instance(loaders, "utilities.CombinedLoader"):
        return CombinedLoader(loaders.iterables, getattr(loaders, "_mode", "min_size"))
    return loaders


def _each_dataloader(loader: Any, change: Callable[[DataLoader], Any]) -> Any:
    """Apply `change` to a DataLoader, or to each DataLoader inside a CombinedLoader."""
    if isinstance(loader, CombinedLoader):
        loader.flattened = [change(member) if isinstance(member, DataLoader) else member
                            for member in loader.flattened]
        return loader
    return change(loader) if isinstance(loader, DataLoader) else loader


def _shuffles_shards(source: LoaderSource, stage: str) -> bool | None:
    """Lightning's rule for the sampler it injects: the training shards are always shuffled (seeded
    by the global seed, reshuffled each epoch) whatever the loader's own `shuffle`, except under
    `overfit_batches`, which trains on the same first batches; evaluation keeps the loader's order."""
    if stage != "train":
        return None
    return not source.overfit


def _without_shuffle(loader: Any, stage: str) -> Any:
    """`overfit_batches` trains on the same first batches every epoch: a loader whose sampler is not
    a SequentialSampler may reorder them (Lightning's rule: any other sampler counts as shuffling),
    so it is rebuilt to read in order, with a warning; one that cannot be rebuilt is warned about."""
    if not isinstance(loader, DataLoader) or isinstance(loader.dataset, IterableDataset) \
            or isinstance(loader.sampler, SequentialSampler):
        return loader
    sampler = type(loader.sampler).__name__
    if type(loader) is DataLoader and type(loader.batch_sampler) is BatchSampler:
        rank_zero_warn(f"overfit_batches: the {HOOKS[stage]} draws its samples with {sampler}, which may reorder "
                       "them; it reads them in order instead, so every epoch sees the same batches.")
        return rebuild_dataloader(loader, SequentialSampler(loader.dataset))  # type: ignore[arg-type]
    rank_zero_warn(f"overfit_batches: the {HOOKS[stage]} draws its samples with {sampler}, which may reorder them, "
                   f"and a {type(loader).__name__} with a {type(loader.batch_sampler).__name__} cannot be rebuilt to "
                   "read in order: epochs may see different batches. Pass a loader with shuffle=False.")
    return loader


def _one_or_list(loaders: list[Any] | None) -> Any:
    """Lightning's form: one loader as itself, several as a list."""
    if loaders is None:
        return None
    return loaders[0] if len(loaders) == 1 else loaders
