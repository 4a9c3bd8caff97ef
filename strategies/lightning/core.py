"""Our GradReducer inside Lightning's own DDP strategy, for either Lightning package.

`pytorch_lightning` and the unified `lightning.pytorch` ship separate copies of every class, and
each Trainer refuses the other's strategy objects. So the strategy is built once per package by
`build_strategy_class(base)`, with that package's `DDPStrategy` as the base; everything here
stays free of Lightning imports, which keeps a single implementation of the logic.

What changes against Lightning's DDPStrategy: while fitting, `strategy.model` is a
`ReducedModule` instead of torch's `DistributedDataParallel`. Lightning reaches the wrapped
module only through `strategy.model(*args)` (its forward redirection), `block_backward_sync()`
and `pre_backward`/`post_backward`, so those are the members we replace.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch
from torch import nn
from torch.distributed.constants import default_pg_timeout
from typing_extensions import override

from strategies.async_checkpoint_lightning import LightningBackgroundCheckpointIO
from strategies.autotune import reducer_summary
from strategies.comm_hooks import CommHook
from strategies.compile import split_lightning_compiled
from strategies.replicas import broadcast_tensors, check_same_parameters
from strategies.lightning.preemption import LightningPreemption
from strategies.preemption import PreemptionPolicy
from strategies.reducer_options import ReducerOptions
from strategies.zero import attach_shards, optimizer_state_dict, shard_lightning_optimizers

START_METHODS = ("popen", "spawn", "fork", "forkserver")
# Names registered in each package's StrategyRegistry, with the launcher's start method.
REGISTERED_NAMES = {"bucket_ddp": "popen", "bucket_ddp_spawn": "spawn"}


class ReducedModule(nn.Module):
    """Stands where torch's `DistributedDataParallel` would: Lightning's `strategy.model` while fitting.

    Building it makes every rank start from rank 0's parameters and buffers and attaches a
    GradReducer to the LightningModule's parameters. `forward` only re-broadcasts buffers when
    torch DDP would (see `will_sync_module_buffers`) and calls the module; gradients are averaged
    by the reducer's hooks during backward.
    """

    def __init__(self, module: nn.Module, options: ReducerOptions, rank: int,
                 timeout: timedelta = default_pg_timeout) -> None:
        super().__init__()
        check_same_parameters(module, rank)  # a clear error instead of a hang on mismatched models
        broadcast_tensors([*module.parameters(), *module.buffers()])
        self.module = module
        self.broadcast_buffers = options.broadcast_buffers
        # Torch DDP's flag and initial value: True until a forward that no synchronised backward
        # follows (no grad, or inside no_sync); it decides whether the *next* forward syncs buffers.
        self.require_forward_param_sync = True
        self.reducer, self.tuning = options.attach(module, timeout=timeout)  # tuning: None unless "auto"
        self.zero = attach_shards(self.reducer, rank, self.reducer.world_size)  # zero_stage=1: strategies/zero.py

    @override
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        if self.will_sync_module_buffers():
            broadcast_tensors(list(self.module.buffers()))
        output = self.module(*args, **kwargs)
        # DDP's `_post_forward`, read after the forward as there: a raising forward leaves the flag.
        self.require_forward_param_sync = torch.is_grad_enabled() and self.reducer.require_backward_grad_sync
        return output

    def will_sync_module_buffers(self) -> bool:
        """Whether the next forward starts by copying rank 0's buffers: torch DDP's rule, decided by the
        *previous* forward. So the first validation forward after a synchronised training step syncs
        (evaluating with rank 0's BatchNorm statistics), the first training forward after validation
        does not, and under accumulation only the first micro-batch of a window does. Matching it
        keeps validation metrics and every rank's buffers equal to Lightning's `strategy="ddp"`."""
        return self.require_forward_param_sync and self.broadcast_buffers and any(True for _ in self.module.buffers())

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Like `DistributedDataParallel.no_sync`: backward passes inside only accumulate locally."""
        with self.reducer.no_sync():
            yield

    def remove(self) -> None:
        """Detach the reducer; the module's `.grad` tensors stay valid, its parameters get their own storage."""
        self.reducer.remove()
        if self.zero is not None:
            self.zero.release_parameters()


def build_strategy_class(base: type[Any], module: str) -> type[Any]:
    """Return `LightningDDPStrategy` subclassing `base` (one Lightning package's `DDPStrategy`).

    `module` is where the class is published; pickle (Lightning's spawn launcher) finds it there.
    """

    class LightningDDPStrategy(base):  # type: ignore[misc,valid-type]
        """Lightning's DDP strategy with our bucketed GradReducer instead of torch's DDP.

        The first eight arguments are those of our `DDPStrategy`; the rest are Lightning's own, but
        `preemption` (ours: strategies/lightning/preemption.py): a notice stops every rank after the
        same batch with Lightning's SLURM checkpoint. Registered as "bucket_ddp" (subprocess launcher,
        like "ddp") and "bucket_ddp_spawn".
        """

        def __init__(self, bucket_cap_mb: float | str = 25, first_bucket_cap_mb: float = 1,
                     gradient_as_bucket_view: bool = True, comm_hook: str | CommHook | None = None,
                     find_unused_parameters: bool = False, broadcast_buffers: bool = True,
                     transport: str = "auto", zero_stage: int = 0, *,
                     accelerator: Any = None, parallel_devices: list[torch.device] | None = None,
                     cluster_environment: Any = None, checkpoint_io: Any = None, precision_plugin: Any = None,
                     process_group_backend: str | None = None, timeout: timedelta | None = default_pg_timeout,
                     start_method: str = "popen",
                     preemption: PreemptionPolicy | dict[str, Any] | bool | None = None,
                     async_checkpoint: bool = False) -> None:
            if async_checkpoint:  # ours: snapshot, then write on a thread (strategies/async_checkpoint_lightning.py)
                checkpoint_io = LightningBackgroundCheckpointIO(checkpoint_io)
            self._preemption = LightningPreemption(PreemptionPolicy.from_argument(preemption))
            self.reducer_options = ReducerOptions(bucket_cap_mb, first_bucket_cap_mb, gradient_as_bucket_view,
                                                  comm_hook, find_unused_parameters, broadcast_buffers, transport,
                                                  zero_stage)
            if start_method not in START_METHODS:
                raise ValueError(f"start_method={start_method!r} is not supported; expected one of {START_METHODS}.")
            super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                             cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                             precision_plugin=precision_plugin, process_group_backend=process_group_backend,
                             timeout=timeout, start_method=start_method)

        @override
        def configure_ddp(self) -> None:
            # Lightning calls this only when fitting. It replaces both the torch DDP wrapper and
            # `_register_ddp_hooks`: our comm hooks are chosen by name in the reducer options.
            self.model: nn.Module = self._setup_model(self.model)

        @override
        def _setup_model(self, model: nn.Module) -> nn.Module:
            if self.world_size > 1:  # a compiled module's graphs split at our buckets, as under torch DDP
                split_lightning_compiled(model, *self.reducer_options.graph_split_caps())
            return ReducedModule(model, self.reducer_options, rank=self.global_rank,
                                 timeout=self._timeout or default_pg_timeout)

        @override
        def setup_optimizers(self, trainer: Any) -> None:
            super().setup_optimizers(trainer)
            reduced = self.reduced_module
            if reduced is not None and reduced.zero is not None:
                shard_lightning_optimizers(self.optimizers, reduced.zero, self.precision_plugin)

        @override
        def optimizer_state(self, optimizer: Any) -> dict[str, Any]:
            return optimizer_state_dict(getattr(optimizer, "_optimizer", optimizer))  # a LightningOptimizer's own

        @override
        @contextlib.contextmanager
        def block_backward_sync(self) -> Iterator[None]:
            # Lightning's version only recognises torch DDP; without this, gradient accumulation
            # would all-reduce on every micro-batch.
            reduced = self.reduced_module
            with reduced.no_sync() if reduced is not None else contextlib.nullcontext():
                yield

        @override
        def pre_backward(self, closure_loss: torch.Tensor) -> None:
            if self.reduced_module is not None:
                self.reduced_module.reducer.prepare_for_backward(closure_loss)

        @override
        def post_backward(self, closure_loss: torch.Tensor) -> None:
            if self.reduced_module is not None:
                self.reduced_module.reducer.finish_backward()

        @override
        def on_train_start(self) -> None:
            super().on_train_start()
            self._preemption.start(self.global_rank, syncs=self._completed_syncs)

        @override
        def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
            super().on_train_batch_start(batch, batch_idx)
            self._preemption.at_batch_start(self.lightning_module.trainer)

        @override
        def on_train_end(self) -> None:
            self._preemption.stop()
            super().on_train_end()

        @override
        def on_exception(self, exception: BaseException) -> None:
            super().on_exception(exception)
            module = self.lightning_module
            if module is not None and module._trainer is not None:
                self._preemption.on_exception(module.trainer, exception)
            self._preemption.stop()

        @override
        def teardown(self) -> None:
            self._preemption.stop()
            reduced = self.reduced_module
            if reduced is not None:
                reduced.remove()
                self.model = reduced.module  # Lightning's teardown expects the bare module back
            super().teardown()

        def _completed_syncs(self) -> int:
            reduced = self.reduced_module
            return reduced.reducer.completed_syncs if reduced is not None else 0

        @property
        def reduced_module(self) -> ReducedModule | None:
            """The wrapper holding the reducer while fitting; None before setup and after teardown."""
            return self.model if isinstance(self.model, ReducedModule) else None

        def reducer_summary(self) -> dict[str, Any] | None:
            """Bucket layout and communication telemetry of the reducer (None when not fitting)."""
            reduced = self.reduced_module
            return reducer_summary(reduced.reducer, reduced.tuning) if reduced is not None else None

    LightningDDPStrategy.__module__ = module
    LightningDDPStrategy.__qualname__ = LightningDDPStrategy.__name__
    return LightningDDPStrategy


def register_strategy_names(strategy_class: type[Any], registry: Any) -> None:
    """Make `Trainer(strategy="bucket_ddp")` work; re-importing replaces the entry, never fails."""
    for name, start_method in REGISTERED_NAMES.items():
        registry.register(name, strategy_class, override=True, start_method=start_method,
                          description=f"DDP with the ddp-trainer bucketed GradReducer, start_method={start_method!r}")
