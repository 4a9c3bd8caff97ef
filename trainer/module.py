"""LightningModule: Lightning's module API, as plain methods in one class.

The Trainer drives the hooks; the module reaches back only through `self.trainer`'s public
members. What `self.log` / `self.log_dict` do lives in trainer/module_logging.py, the optimizer
API (`self.optimizers()`, `self.manual_backward`, ...) in trainer/module_optimization.py: there
as module-level functions, so the same code serves an unchanged `pytorch_lightning.LightningModule`
(see trainer/module_adapter.py, which binds them by these names).
"""

from __future__ import annotations

import inspect
from argparse import Namespace
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from torch.utils._pytree import tree_map

from trainer.hparams import AttributeDict, collect_init_args, checkpoint_hparams
from trainer.module_logging import log, log_dict
from trainer.precision import move_to_device
from trainer.module_optimization import (clip_gradients, lr_schedulers, manual_backward, optimizers, toggle_optimizer,
                                         untoggle_optimizer)

if TYPE_CHECKING:
    # The documented surface (docs/trainer-contract.md), which the Trainer satisfies: a module reaches back
    # through it, as callbacks do, and this module stays out of trainer.trainer's imports.
    from trainer.contract import TrainerContract


class LightningModule(nn.Module):
    """Subclass it exactly as in Lightning: `training_step` and `configure_optimizers` are
    required; every other step and hook is optional."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: TrainerContract | None = None
        self._current_fx_name: str | None = None
        self._hparams: AttributeDict = AttributeDict()
        self._hparams_name: str | None = None  # "kwargs", or the __init__ argument that held them (checkpoints)
        self._strict_loading: bool | None = None  # None: strict (Lightning's default)
        self.automatic_optimization: bool = True
        self.example_input_array: Any = None

    # ------------------------------------------------------------------ state
    @property
    def trainer(self) -> TrainerContract:
        if self._trainer is None:
            raise RuntimeError(f"{type(self).__name__} is not attached to a Trainer; call Trainer.fit(model) first.")
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: TrainerContract | None) -> None:
        self._trainer = trainer

    @property
    def device(self) -> torch.device:
        for tensor in (*self.parameters(), *self.buffers()):
            return tensor.device
        return torch.device("cpu")

    @property
    def global_rank(self) -> int:
        return self._trainer.global_rank if self._trainer else 0

    @property
    def local_rank(self) -> int:
        return self._trainer.local_rank if self._trainer else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer else 0

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer else 0

    @property
    def logger(self) -> Any:
        return self._trainer.logger if self._trainer else None

    @property
    def loggers(self) -> list[Any]:
        return self._trainer.loggers if self._trainer else []

    @property
    def hparams(self) -> AttributeDict:
        return self._hparams

    @property
    def strict_loading(self) -> bool:
        """Whether resuming from a checkpoint requires its state dict to match the module's keys
        exactly (Lightning's; set False for a module that saves only part of its state)."""
        return self._strict_loading in (None, True)

    @strict_loading.setter
    def strict_loading(self, strict: bool | None) -> None:
        self._strict_loading = strict

    def save_hyperparameters(self, *args: Any, ignore: list[str] | str | None = None, logger: bool = True) -> None:
        """Record the caller's `__init__` arguments (or the named ones) in `self.hparams`,
        so checkpoints can rebuild the module with `load_from_checkpoint`."""
        frame = inspect.currentframe()
        caller = frame.f_back if frame is not None else None
        init_args = collect_init_args(caller) if caller is not None else {}
        ignored = {ignore} if isinstance(ignore, str) else set(ignore or ())
        self._hparams_name = "kwargs"
        if args and all(isinstance(name, str) for name in args):
            init_args = {name: init_args[name] for name in args if name in init_args}
        elif args and isinstance(args[0], (Mapping, Namespace)):
            # One object (a dict, an argparse Namespace): remember which __init__ argument it came in as
            self._hparams_name = next((name for name, value in init_args.items() if value is args[0]), None)
            init_args = dict(args[0]) if isinstance(args[0], Mapping) else vars(args[0])
        self._hparams.update({k: v for k, v in init_args.items() if k not in ignored})
        self._log_hyperparams = logger

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str, map_location: Any = None, strict: bool = True,
                             weights_only: bool | None = None, **hparam_overrides: Any) -> LightningModule:
        """Rebuild the module from the hyperparameters and weights stored in a checkpoint; onto the
        CPU unless `map_location` says otherwise, so a GPU run's checkpoint loads anywhere.
        `weights_only=False` trusts the file: any pickled object in it is rebuilt."""
        from strategies.checkpoint_io import TorchCheckpointIO

        checkpoint = TorchCheckpointIO().load(checkpoint_path, map_location=map_location or "cpu",
                                              weights_only=weights_only is not False)
        saved, name = checkpoint.get("hyper_parameters", {}), checkpoint.get("hparams_name")
        if name not in (None, "kwargs") and name in inspect.signature(cls.__init__).parameters:
            module = cls(**{name: saved, **hparam_overrides})  # they came in as one object: passed back so
        else:
            module = cls(**{**saved, **hparam_overrides})
        module.load_state_dict(checkpoint["state_dict"], strict=strict)
        return module

    # ------------------------------------------------------------------ steps (override)
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__}.forward is not implemented.")

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement training_step(batch, batch_idx).")

    def configure_optimizers(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} must implement configure_optimizers().")

    # validation_step / test_step / predict_step are looked up with getattr: absent means "skip".

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        inputs = batch[0] if isinstance(batch, (list, tuple)) else batch
        return self(inputs)

    def configure_callbacks(self) -> list[Any]:
        return []

    # ------------------------------------------------------------------ hooks (override what you need)
    def prepare_data(self) -> None: ...
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...
    def configure_model(self) -> None: ...
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> Any: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_before_backward(self, loss: torch.Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: Any) -> None: ...
    def on_before_zero_grad(self, optimizer: Any) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...

    def on_validation_model_zero_grad(self) -> None:
        self.zero_grad()

    def _trained_model(self) -> nn.Module:
        """`trainer.model` while a stage runs (the hooks below run only then)."""
        model = self.trainer.model
        if model is None:
            raise RuntimeError(f"{type(self).__name__}: no model is attached to the Trainer outside a stage.")
        return model

    def on_validation_model_eval(self) -> None:
        self._trained_model().eval()

    def on_validation_model_train(self) -> None:
        self._trained_model().train()  # called only when overridden; the loop restores modes itself

    def on_test_model_eval(self) -> None:
        self._trained_model().eval()

    def on_test_model_train(self) -> None:
        self._trained_model().train()

    def on_predict_model_eval(self) -> None:
        self._trained_model().eval()

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    # ------------------------------------------------------------------ optimisation hooks
    def backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        """The backward pass itself; the strategy reduces the gradients it produces."""
        loss.backward(*args, **kwargs)

    def optimizer_step(self, epoch: int, batch_idx: int, optimizer: Any, optimizer_closure: Any = None) -> None:
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Any) -> None:
        optimizer.zero_grad()

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def configure_gradient_clipping(self, optimizer: Any, gradient_clip_val: float | None = None,
                                    gradient_clip_algorithm: str | None = None) -> None:
        self.clip_gradients(optimizer, gradient_clip_val=gradient_clip_val,
                            gradient_clip_algorithm=gradient_clip_algorithm)

    # ------------------------------------------------------------------ API shared with PL modules
    def log(self, name: str, value: Any, **kwargs: Any) -> None:
        log(self, name, value, **kwargs)

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
        log_dict(self, dictionary, **kwargs)

    def optimizers(self, use_pl_optimizer: bool = True) -> Any:
        return optimizers(self, use_pl_optimizer)

    def lr_schedulers(self) -> Any:
        return lr_schedulers(self)

    def manual_backward(self, loss: torch.Tensor, *args: Any, **kwargs: Any) -> None:
        manual_backward(self, loss, *args, **kwargs)

    def clip_gradients(self, optimizer: Any, gradient_clip_val: float | None = None,
                       gradient_clip_algorithm: str | None = None) -> None:
        clip_gradients(self, optimizer, gradient_clip_val, gradient_clip_algorithm)

    def toggle_optimizer(self, optimizer: Any) -> None:
        toggle_optimizer(self, optimizer)

    def untoggle_optimizer(self, optimizer: Any) -> None:
        untoggle_optimizer(self, optimizer)

    def all_gather(self, data: Any, group: Any = None, sync_grads: bool = False) -> Any:
        """Every rank's `data` (a tensor, a number, or a nested collection of them): each tensor stacked
        along a new leading rank dimension (none on one process), as Lightning's. Every rank calls it,
        with the same shapes."""
        strategy = self.trainer.strategy

        def gather(leaf: Any) -> Any:
            if isinstance(leaf, (int, float)):
                leaf = torch.tensor(leaf, device=self.device)
            if not isinstance(leaf, torch.Tensor):
                return leaf
            return strategy.all_gather(leaf, group=group, sync_grads=sync_grads)

        return tree_map(gather, data)

    def print(self, *args: Any, **kwargs: Any) -> None:
        if self._trainer is None or self._trainer.is_global_zero:
            print(*args, **kwargs)

    def freeze(self) -> None:
        for parameter in self.parameters():
            parameter.requires_grad = False
        self.eval()

    def unfreeze(self) -> None:
        for parameter in self.parameters():
            parameter.requires_grad = True
        self.train()

    def __getstate__(self) -> dict[str, Any]:
        # The trainer is not part of the model: never pickle it into spawned workers or files.
        state = self.__dict__.copy()
        state["_trainer"] = None
        return state


__all__ = ["LightningModule", "checkpoint_hparams", "clip_gradients", "log", "log_dict", "lr_schedulers",
           "manual_backward", "optimizers", "toggle_optimizer", "untoggle_optimizer"]
