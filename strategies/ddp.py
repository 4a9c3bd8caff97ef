"""DDPStrategy: one process per device, gradients averaged by our own bucketed reducer.

It *has* (never inherits) each piece: an environment (ranks), the launcher (processes), the
process group, the reducer (gradients), the sampler helper (data) and a CheckpointIO (files).
`__init__` only validates and stores, so a strategy is cheap to build and to pickle into the
workers; everything that needs a process group happens in `setup_environment`/`setup_module`.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader
from typing_extensions import override

from strategies import collectives, process_group
from strategies.autotune import AUTO, CapTuning, reducer_summary
from strategies.base import BackwardPass, Strategy, check_accelerator, check_group, resolve_reduce_op
from strategies.checkpoint_io import CheckpointIO
from strategies.environment import (ClusterEnvironment, check_launch_matches, detect_environment,
                                    processes_launched_externally, processes_outlive_stages)
from strategies.environment.lightning_api import LightningEnvironmentView
from strategies.hang_guard import HangGuard
from strategies.preemption import PreemptionPolicy
from strategies.reducer_options import ReducerOptions, check_bool, check_positive_number, option_property
from strategies.replicas import broadcast_tensors, check_same_parameters
from strategies.sampler import distribute_dataloader

if TYPE_CHECKING:
    from strategies.reducer import GradReducer
    from strategies.zero import ZeroShards

START_METHODS = ("forkserver", "spawn")  # how local workers start (strategies/launcher.py)
DEBUG_COLLECTIVES_VARIABLE = "DDP_TRAINER_DEBUG_COLLECTIVES"  # =1: debug_collectives for any run


class DDPStrategy(Strategy):
    """Distributed data parallel over `devices x num_nodes` processes with our GradReducer.

    Arguments mirror `torch.nn.parallel.DistributedDataParallel` where they share a name;
    `comm_hook` is None (plain mean), "fp16", "bf16" or a `(state, bucket) -> Future` callable.
    `bucket_cap_mb="auto"` times a few bucket sizes during the first steps and keeps the fastest
    (all ranks agree); `state_dict()` carries the pick into checkpoints so a resume skips it.
    `stall_timeout` (seconds, None = off) arms the hang guard: ranks that stop meeting in the same
    collective end the job naming ranks, operations and call sites (`strategies/hang_guard.py`),
    long before `timeout`; `debug_collectives=True` fingerprints every collective across ranks.
    `transport="auto"` sends CPU gradients between ranks of one host through shared memory
    (strategies/shm_transport.py), else through the process group; "process_group" forces the latter.
    `preemption` (strategies/preemption.py) says which signals announce a preemption (default SIGTERM
    and SIGUSR1), the grace period and whether to requeue on SLURM: every rank stops after the same
    step, rank 0 writes one checkpoint, the processes exit with code 75. False turns it off.
    `start_method` starts local workers from a forkserver that imports torch once for all of them
    ("forkserver", where the platform has it) or has each import it ("spawn"); with "forkserver", ranks
    1..N-1 are forked from the caller instead where that is safe (strategies/forked_ranks.py).
    `async_checkpoint=True` makes ModelCheckpoint's saves copy the state on rank 0 and write it on a
    thread, still atomically (strategies/async_checkpoint.py); off by default (docs/checkpoints.md).
    `zero_stage=1` shards the optimizer state: each rank receives (reduce-scatter) and steps only its even 1/N
    of every bucket, then the updated parameters are all-gathered (strategies/zero.py); `zero_stage=2` also
    keeps only that shard of the gradients between steps (strategies/zero_reducer.py); 0 (default) keeps all
    of it everywhere.
    """

    bucket_cap_mb = option_property("bucket_cap_mb")
    first_bucket_cap_mb = option_property("first_bucket_cap_mb")
    gradient_as_bucket_view = option_property("gradient_as_bucket_view")
    comm_hook = option_property("comm_hook")
    find_unused_parameters = option_property("find_unused_parameters")
    broadcast_buffers = option_property("broadcast_buffers")
    transport = option_property("transport")
    zero_stage = option_property("zero_stage")

    def __init__(self, bucket_cap_mb: float | str = 25, first_bucket_cap_mb: float = 1,
                 gradient_as_bucket_view: bool = True, comm_hook: str | Callable[..., Any] | None = None,
                 find_unused_parameters: bool = False, broadcast_buffers: bool = True,
                 sync_batchnorm: bool = False, process_group_backend: str | None = None,
                 timeout: timedelta = timedelta(minutes=10), max_restarts: int = 0, accelerator: str = "auto",
                 checkpoint_io: CheckpointIO | None = None, stall_timeout: float | None = 25.0,
                 debug_collectives: bool = False, transport: str = "auto",
                 start_method: str = "forkserver",
                 preemption: PreemptionPolicy | dict[str, Any] | bool | None = None,
                 async_checkpoint: bool = False, zero_stage: int = 0) -> None:
        super().__init__(accelerator=accelerator, checkpoint_io=checkpoint_io, preemption=preemption,
                         async_checkpoint=async_checkpoint)
        options = ReducerOptions(bucket_cap_mb, first_bucket_cap_mb, gradient_as_bucket_view, comm_hook,
                                 find_unused_parameters, broadcast_buffers, transport,
                                 zero_stage)  # names a bad value's argument
        if stall_timeout is not None:
            check_positive_number("stall_timeout", stall_timeout, unit="seconds", alternative="None (the hang "
                                                                                             "guard off)")
        check_bool("sync_batchnorm", sync_batchnorm)
        check_bool("debug_collectives", debug_collectives)
        process_group.validate_backend(process_group_backend)
        if not isinstance(timeout, timedelta) or timeout.total_seconds() <= 0:
            raise ValueError(f"timeout={timeout!r} must be a positive datetime.timedelta.")
        if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
            raise ValueError(f"max_restarts={max_restarts!r} must be an int >= 0.")
        check_accelerator(accelerator)
        if start_method not in START_METHODS:
            why_not_fork = (" ('fork' is not offered: a forked worker hangs in OpenMP once the launching "
                            "process has used it)") if start_method == "fork" else ""
            raise ValueError(f"start_method={start_method!r} is not one of {list(START_METHODS)}{why_not_fork}.")
        self.reducer_options = options
        self._tuned_bucket_cap_mb: float | None = None  # restored from a checkpoint before the reducer exists
        self.sync_batchnorm, self.process_group_backend = sync_batchnorm, process_group_backend
        self.timeout, self.max_restarts = timeout, max_restarts
        self.stall_timeout = None if stall_timeout is None else float(stall_timeout)
        self.debug_collectives = debug_collectives
        self.start_method = start_method
        self._hang_guard: HangGuard | None = None
        self._environment: ClusterEnvironment | None = None
        self._reducer: GradReducer | None = None
        self._tuning: CapTuning | None = None  # bucket_cap_mb="auto" driving the reducer
        self._zero: ZeroShards | None = None  # this rank's optimizer shards (zero_stage 1 or 2)
        self._buffers_due = True  # torch DDP's require_forward_param_sync: sync buffers at the next forward
        self._owns_process_group = False

    # ------------------------------------------------------------------ configuration
    @override
    def configure(self, *, accelerator: str | None = None, devices: int = 1, num_nodes: int = 1) -> None:
        for name, value in (("devices", devices), ("num_nodes", num_nodes)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int for DDPStrategy, got {value!r}.")
        super().configure(accelerator=accelerator, devices=devices, num_nodes=num_nodes)
        process_group.resolve_backend(self.process_group_backend, torch.device(self.accelerator))
        if self.sync_batchnorm and self.accelerator != "cuda":
            raise ValueError("sync_batchnorm=True needs accelerator='cuda': torch's SyncBatchNorm does not run "
                             "on CPU. Set sync_batchnorm=False or train on GPUs.")

    # ------------------------------------------------------------------ ranks
    @property
    def environment(self) -> ClusterEnvironment:
        """Where this process's ranks come from: fixed by `setup_environment`, detected afresh before."""
        return self._environment or detect_environment(self.devices * self.num_nodes)

    @property
    @override
    def global_rank(self) -> int:
        return self.environment.global_rank

    @property
    @override
    def local_rank(self) -> int:
        return self.environment.local_rank

    @property
    @override
    def node_rank(self) -> int:
        return self.environment.node_rank

    @property
    @override
    def world_size(self) -> int:
        return self.environment.world_size

    @property
    @override
    def restart_count(self) -> int:
        return self.environment.restart_count

    # Lightning's ParallelStrategy reads these; programs do too (e.g. to split a batch per process).
    @property
    def num_processes(self) -> int:
        """Processes on this node (Lightning's `len(parallel_devices)`)."""
        return self.devices

    @property
    def parallel_devices(self) -> list[torch.device]:
        """This node's devices, one per process, as Lightning lists them."""
        if self.accelerator == "cuda":
            return [torch.device("cuda", index) for index in range(self.devices)]
        return [torch.device(self.accelerator)] * self.devices

    @property
    def cluster_environment(self) -> LightningEnvironmentView:
        """The environment, with Lightning's `ClusterEnvironment` API (`world_size()`, `main_address`, ...)."""
        return LightningEnvironmentView(self.environment, launched=self._environment is not None)

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """What a DistributedSampler needs for this rank, as Lightning's DDPStrategy gives it."""
        return {"num_replicas": self.num_nodes * self.num_processes, "rank": self.global_rank}

    # ------------------------------------------------------------------ lifecycle
    @override
    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        from strategies import launcher

        if self.num_nodes > 1 and not processes_launched_externally():
            raise ValueError(f"num_nodes={self.num_nodes} needs one launcher per node: start the script with "
                             f"torchrun (--nnodes={self.num_nodes} --nproc-per-node={self.devices}) or srun; "
                             f"the built-in launcher starts processes on this machine only.")
        return launcher.launch(self, fn, args, kwargs, nprocs=self.devices, in_place=self._runs_in_place(),
                               max_restarts=self.max_restarts, start_method=self.start_method,
                               device_kind=self.accelerator, group=(self.process_group_backend, self.timeout))

    def _runs_in_place(self) -> bool:
        """The ranks exist already (torchrun, SLURM) or there is one: this process runs its rank, nothing is started."""
        return processes_launched_externally() or self.devices * self.num_nodes == 1

    @property
    @override
    def restarts_in_process(self) -> int:
        return 0 if self._runs_in_place() else self.max_restarts

    @override
    def setup_environment(self) -> None:
        self.configure(accelerator=self.accelerator, devices=self.devices, num_nodes=self.num_nodes)
        self._environment = detect_environment(self.devices * self.num_nodes)
        check_launch_matches(self._environment, self.devices, self.num_nodes, self.accelerator)
        backend = process_group.resolve_backend(self.process_group_backend, self.root_device)
        self._owns_process_group = process_group.init_process_group(
            self._environment, backend=backend, device=self.root_device, timeout=self.timeout)
        self._start_hang_guard()

    def _start_hang_guard(self) -> None:
        debug = self.debug_collectives or os.environ.get(DEBUG_COLLECTIVES_VARIABLE, "") not in ("", "0")
        if self.world_size == 1 or (self.stall_timeout is None and not debug):
            return
        # Off (None) only disarms the verdicts on stalls; debug fingerprints still need a bound.
        stall_timeout = self.stall_timeout or self.timeout.total_seconds()
        self._hang_guard = HangGuard(dist.distributed_c10d._get_default_store(), self.global_rank,
                                     self.world_size, stall_timeout=stall_timeout, debug=debug).start()

    @override
    def setup_module(self, module: nn.Module, *, for_training: bool = True) -> nn.Module:
        self._require_process_group("setup_module")
        if self.sync_batchnorm:
            module = nn.SyncBatchNorm.convert_sync_batchnorm(module)
        module = module.to(self.root_device)
        check_same_parameters(module, self.global_rank)
        if not for_training and not processes_launched_externally():
            # Evaluation in our own workers: every rank loaded the same weights from one payload, and
            # nothing is synchronised (as Lightning, which wraps in DDP for fit only), so neither a
            # broadcast nor a reducer is needed; for a large model the broadcast was most of test().
            self._buffers_due = False
            return module
        broadcast_tensors([*module.parameters(), *module.buffers()])
        if self._reducer is not None:
            self._reducer.remove()
        self._buffers_due = True
        self._reducer, self._tuning = self.reducer_options.attach(module, timeout=self.timeout,
                                                                  adopted_mb=self._tuned_bucket_cap_mb)
        if self.zero_stage:
            from strategies.zero import attach_shards

            self._zero = attach_shards(self._reducer, self.global_rank, self.world_size)
        return module

    @override
    def setup_optimizers(self, optimizers: list[torch.optim.Optimizer], loss_scaling: bool = False) -> None:
        if self._zero is not None:
            from strategies.zero import shard_optimizers

            shard_optimizers(optimizers, self._zero, loss_scaling)

    @override
    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if self._zero is None:
            return optimizer.state_dict()
        from strategies.zero import optimizer_state_dict

        return optimizer_state_dict(optimizer)

    @override
    def process_dataloader(self, dataloader: DataLoader, *, for_training: bool = True,
                           shuffle: bool | None = None, keep_sampler: bool = False) -> DataLoader:
        return distribute_dataloader(dataloader, num_replicas=self.world_size, rank=self.global_rank,
                                     pad=for_training, shuffle=shuffle, keep_sampler=keep_sampler)

    @override
    def training_step(self, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        self.raise_failed_checkpoint_write()
        return self._forward(module, "training_step", *args, **kwargs)

    @override
    def evaluation_step(self, module: nn.Module, step_name: str, *args: Any) -> Any:
        return self._forward(module, step_name, *args)

    def _forward(self, module: nn.Module, step_name: str, *args: Any, **kwargs: Any) -> Any:
        """torch DDP's buffer rule, decided by the *previous* forward: rank 0's buffers (BatchNorm
        running statistics) are broadcast before a forward when the one before ran with grad enabled
        outside `no_sync()`, and before the very first. So the first validation forward after a
        synchronised step syncs, the first training forward after validation does not, and only the
        first micro-batch of an accumulation window does. Every rank takes the same branch (each has
        at least one evaluation batch), so the broadcast cannot hang on uneven evaluation shards."""
        if self._buffers_due and self.reducer_options.broadcast_buffers and dist.is_initialized() and dist.get_world_size() > 1:
            buffers = list(module.buffers())
            if buffers:
                broadcast_tensors(buffers)
        output = getattr(module, step_name)(*args, **kwargs)
        self._buffers_due = torch.is_grad_enabled() and (self._reducer is None or self._reducer.require_backward_grad_sync)
        return output

    @override
    def teardown(self) -> None:
        if self._hang_guard is not None:
            self._hang_guard.stop(finished=True)
            self._hang_guard = None
        if self._reducer is not None:
            self._reducer.remove()
            self._reducer = self._tuning = None
        if self._zero is not None:
            self._zero.release_parameters()  # the sharded optimizers stay (a checkpoint after fit still reads them)
        # Under torchrun/SLURM and in our own workers the process lives on for the next stage
        # (fit, then test): the group stays, since re-creating it on the launcher's store hangs,
        # and joining it again would cost the next stage its start-up. Our workers destroy it as
        # they exit. A world of one run in place (a notebook, a test) releases it now.
        if self._owns_process_group and not processes_outlive_stages():
            process_group.destroy_process_group()
            self._owns_process_group = False
        super().teardown()  # a checkpoint still being written in the background

    # ------------------------------------------------------------------ gradients
    @override
    def backward(self, loss: torch.Tensor, run: BackwardPass | None = None) -> None:
        reducer = self._require_reducer("backward")
        reducer.prepare_for_backward(loss)
        (run or torch.Tensor.backward)(loss)
        reducer.finish_backward()

    @override
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        with self._require_reducer("no_sync").no_sync():
            yield

    # ------------------------------------------------------------------ collectives
    @override
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        check_group(group)
        op = resolve_reduce_op(reduce_op)
        if not isinstance(tensor, torch.Tensor):
            return tensor
        return collectives.all_reduce(tensor, op, self.root_device, group)

    @override
    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        check_group(group)
        return collectives.all_gather(tensor, self.root_device, group, sync_grads)

    @override
    def broadcast(self, obj: Any, src: int = 0) -> Any:
        return collectives.broadcast_object(obj, src)

    @override
    def barrier(self, name: str | None = None) -> None:
        collectives.barrier(self.root_device, name)

    @override
    def gradient_buffers(self, grads: list[torch.Tensor]) -> list[torch.Tensor] | None:
        if self._zero is not None:  # a rank holds only its shard: `gradient_norm` answers for the optimizers
            return None
        return self._reducer.gradient_buffers(grads) if self._reducer is not None else None

    @override
    def reduced_gradients_finite(self, grads: list[torch.Tensor]) -> bool | None:
        if self._zero is not None or self._reducer is None:
            return None
        return self._reducer.reduced_finite(grads)

    @override
    def gradient_norm(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        if self._zero is None:
            return None
        from strategies.zero import gradient_norm

        return gradient_norm(optimizer)

    @override
    def completed_gradient_syncs(self) -> int:
        return self._reducer.completed_syncs if self._reducer is not None else 0

    @override
    def agreement_store(self) -> Any:
        return process_group.shared_store()

    # ------------------------------------------------------------------ state in checkpoints
    @override
    def state_dict(self) -> dict[str, Any]:
        """What a resume needs to behave alike: the bucket cap "auto" settled on (None before)."""
        tuned = self._tuning.chosen_mb if self._tuning is not None else None
        return {"bucket_cap_mb": self.bucket_cap_mb, "tuned_bucket_cap_mb": tuned}

    @override
    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Reuse a checkpoint's tuned bucket cap (only with bucket_cap_mb="auto"; a number wins)."""
        tuned = state.get("tuned_bucket_cap_mb")
        if self.bucket_cap_mb != AUTO or tuned is None:
            return
        self._tuned_bucket_cap_mb = float(tuned)
        if self._tuning is not None:
            self._tuning.adopt(self._tuned_bucket_cap_mb)

    # ------------------------------------------------------------------ reporting
    @override
    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "environment": type(self.environment).__name__,
            "backend": dist.get_backend() if dist.is_initialized() else None,
            **self.reducer_options.summary(),
            "reducer": reducer_summary(self._reducer, self._tuning) if self._reducer is not None else None,
            "zero": self._zero.summary() if self._zero is not None else None,
        }

    # ------------------------------------------------------------------ helpers
    def _require_process_group(self, method: str) -> None:
        if not dist.is_initialized():
            raise RuntimeError(f"DDPStrategy.{method}() needs the process group; call it inside "
                               f"strategy.launch(fn) (which runs setup_environment() first).")

    def _require_reducer(self, method: str) -> GradReducer:
        if self._reducer is None:
            raise RuntimeError(f"DDPStrategy.{method}() needs the gradient reducer; call "
                               f"strategy.setup_module(module) first.")
        return self._reducer

    @override
    def compile_context(self, dynamo_ctx: Any) -> Any:
        if self.world_size < 2:
            return dynamo_ctx  # nothing to overlap with
        from strategies.compile import bucketed_context

        return bucketed_context(dynamo_ctx, *self.reducer_options.graph_split_caps(self._tuned_bucket_cap_mb))

    @override
    def stop_workers(self) -> None:
        from strategies import launcher

        launcher.stop_workers(self)

    def __getstate__(self) -> dict[str, Any]:
        # Only configuration travels to the workers; per-process state is rebuilt there.
        return {**super().__getstate__(), "_environment": None, "_reducer": None, "_tuning": None, "_zero": None,
                "_owns_process_group": False, "_hang_guard": None}
