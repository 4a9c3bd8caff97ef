"""The contract between the Trainer and everything that knows about devices and processes.

The Trainer owns the loop; a `Strategy` owns where the loop runs. The Trainer calls only
the members below and never asks which strategy it holds (a needed branch becomes a method
here with a sensible default). Call order inside `Trainer.fit`::

    strategy.configure(accelerator=..., devices=..., num_nodes=...)   # in Trainer.__init__
    strategy.launch(work, *args)          # this process runs rank 0, workers the other ranks (or in place)
      └ on every rank: strategy.setup_environment(); work(*args)
          module = strategy.setup_module(module)
          loader = strategy.process_dataloader(loader)
          for each batch:
              with strategy.no_sync() (all but the last micro-batch of an accumulation window):
                  loss = strategy.training_step(module, batch, batch_idx)
                  strategy.backward(loss)           # gradients are reduced when it returns
              optimizer.step()                      # always after the reduction
          strategy.save_checkpoint(ckpt, path)      # every rank calls; rank 0 writes
          strategy.teardown()

Collectives (`reduce`, `all_gather`, `broadcast`, `barrier`) must be called by every rank
in the same order: never inside `if strategy.is_global_zero:`.
"""

from __future__ import annotations

import abc
import contextlib
import os
from collections.abc import Callable, Iterator
from typing import Any, Literal

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import DataLoader

from strategies import process_group
from strategies.async_checkpoint import BackgroundCheckpointWriter, CheckpointSaveStats
from strategies.checkpoint_io import CheckpointIO, TorchCheckpointIO
from strategies.hang_guard import LEDGER
from strategies.preemption import PreemptionPolicy, PreemptionWatch, next_fit_key

ReduceOp = Literal["mean", "sum", "max", "min"]
BackwardPass = Callable[[torch.Tensor], object]  # runs one backward pass of a loss (the module's `backward` hook)
_REDUCE_OP_NAMES = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}


def resolve_reduce_op(reduce_op: Any) -> ReduceOp:
    """Lightning's spellings of a reduction (`"mean"`/`"avg"`, `"sum"`, `"max"`, `"min"`, in any case,
    or torch's `ReduceOp.SUM`/`AVG`/`MAX`/`MIN`) as one of ours."""
    if isinstance(reduce_op, str) and reduce_op.lower() in _REDUCE_OP_NAMES:
        return _REDUCE_OP_NAMES[reduce_op.lower()]  # type: ignore[return-value]
    if dist.is_available():
        for name in ("sum", "avg", "max", "min"):
            if reduce_op == getattr(dist.ReduceOp, name.upper()):
                return _REDUCE_OP_NAMES[name]  # type: ignore[return-value]
    raise ValueError(f"reduce_op={reduce_op!r} is not supported; use one of {sorted(_REDUCE_OP_NAMES)} "
                     "(or torch.distributed.ReduceOp.SUM/AVG/MAX/MIN).")


def check_group(group: Any) -> None:
    """A collective's `group` (Lightning's argument): None or the default group (`torch.distributed.group.WORLD`,
    what Lightning's `self.all_gather` passes). A subgroup is refused: the hang guard expects every rank in
    every collective, so a subgroup's collective would later read as ranks out of step. A string there
    is a reduction passed in the group's place."""
    if isinstance(group, str):
        raise TypeError(f"group={group!r} is not a process group; pass the reduction by name, "
                        f"reduce(tensor, reduce_op={group!r}) (the signature is Lightning's: reduce(tensor, "
                        "group=None, reduce_op='mean')).")
    if group is None:
        return
    if not dist.is_available() or group is not dist.group.WORLD:
        raise ValueError(f"group={group!r}: collectives run on every rank (group=None or "
                         "torch.distributed.group.WORLD); a subgroup is not supported by this strategy.")
ACCELERATORS = ("cpu", "cuda", "gpu", "auto")


def check_accelerator(accelerator: str) -> None:
    if accelerator not in ACCELERATORS:
        raise ValueError(f"accelerator={accelerator!r} is not one of {list(ACCELERATORS)}.")


def resolve_accelerator(accelerator: str) -> str:
    """Turn "auto" into the concrete device type this machine offers; "gpu" (Lightning's name for
    whichever GPU the machine has) is CUDA here."""
    check_accelerator(accelerator)
    if accelerator == "gpu":
        accelerator = "cuda"
    if accelerator == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if accelerator == "cuda" and not torch.cuda.is_available():
        raise RuntimeError(f"accelerator={accelerator!r} but no CUDA device is visible "
                           "(torch.cuda.is_available() is False); use 'cpu' or 'auto'.")
    return accelerator


class Strategy(abc.ABC):
    """Where and how a training loop runs: processes, devices, gradient sync and rank-0 I/O.

    Subclasses override `setup_environment` and whatever their distribution scheme changes;
    the defaults describe one process on one device.
    """

    def __init__(self, accelerator: str = "auto", checkpoint_io: CheckpointIO | None = None,
                 preemption: PreemptionPolicy | dict[str, Any] | bool | None = None,
                 async_checkpoint: bool = False) -> None:
        if not isinstance(async_checkpoint, bool):
            raise TypeError(f"async_checkpoint must be True or False, got {async_checkpoint!r}.")
        self.accelerator = accelerator
        self.checkpoint_io = checkpoint_io or TorchCheckpointIO()
        self.async_checkpoint = async_checkpoint
        self._checkpoint_writer: BackgroundCheckpointWriter | None = None  # rank 0, from its first background save
        self.preemption = PreemptionPolicy.from_argument(preemption)
        self.devices = 1
        self.num_nodes = 1

    # ------------------------------------------------------------------ configuration
    def configure(self, *, accelerator: str | None = None, devices: int = 1, num_nodes: int = 1) -> None:
        """Receive the world the user asked for from the Trainer (before any launch)."""
        if accelerator is not None:
            self.accelerator = accelerator
        self.accelerator = resolve_accelerator(self.accelerator)
        self.devices = devices
        self.num_nodes = num_nodes

    # ------------------------------------------------------------------ ranks
    @property
    def global_rank(self) -> int:
        return 0

    @property
    def local_rank(self) -> int:
        return 0

    @property
    def node_rank(self) -> int:
        return 0

    @property
    def world_size(self) -> int:
        return 1

    @property
    def is_global_zero(self) -> bool:
        return self.global_rank == 0

    @property
    def restarts_in_process(self) -> int:
        """How often this strategy's own launcher may restart a failed group inside this process (DDPStrategy's
        `max_restarts` when it starts the ranks itself). torch elastic's restarts start new processes instead.
        The Trainer keeps a fit's starting state only when this is > 0."""
        return 0

    @property
    def restart_count(self) -> int:
        """How often the launcher restarted this group after a failure (torch elastic sets it)."""
        return process_group.restart_count()

    @property
    def root_device(self) -> torch.device:
        if self.accelerator == "cuda":
            return torch.device("cuda", self.local_rank)
        return torch.device("cpu")

    # ------------------------------------------------------------------ lifecycle
    def launch(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """Run `fn` on every rank after `setup_environment`; return global rank 0's result (rank 0 runs in
        this process, on the objects it was given)."""
        self.setup_environment()
        return fn(*args, **kwargs)

    @abc.abstractmethod
    def setup_environment(self) -> None:
        """Prepare this process: ranks, device, process group. Called once per worker."""

    def setup_module(self, module: nn.Module, *, for_training: bool = True) -> nn.Module:
        """Move the module to this rank's device and make it ready for synchronised training
        (`for_training=False`, for validate/test/predict: only what evaluation needs)."""
        return module.to(self.root_device)

    def process_dataloader(self, dataloader: DataLoader, *, for_training: bool = True,
                           shuffle: bool | None = None, keep_sampler: bool = False) -> DataLoader:
        """Return the loader this rank iterates (a distributed strategy shards it). Training shards
        are padded to one length, so every rank takes the same number of steps; evaluation shards
        (`for_training=False`) cover each sample exactly once and may differ in length by one.
        `shuffle` orders the shards (None: as the loader itself would: its own shuffle setting).
        `keep_sampler` (prediction) shards what the loader's own sampler draws, whatever it is."""
        return dataloader

    def training_step(self, module: nn.Module, *args: Any, **kwargs: Any) -> Any:
        """Run `module.training_step`; a distributed strategy syncs buffers first (like DDP's forward)."""
        self.raise_failed_checkpoint_write()
        step: Callable[..., Any] = getattr(module, "training_step")
        return step(*args, **kwargs)

    def evaluation_step(self, module: nn.Module, step_name: str, *args: Any) -> Any:
        """Run `module.<step_name>` (validation_step, test_step, predict_step); a distributed strategy
        may sync buffers first, by the same rule as before a training step."""
        return getattr(module, step_name)(*args)

    def teardown(self) -> None:
        """Release what `setup_environment`/`setup_module` acquired. Safe to call twice. A checkpoint still
        being written in the background is finished first (its error raised, or logged when the stage
        is already failing)."""
        if self._checkpoint_writer is not None:
            self._checkpoint_writer.close()  # kept, idle: its counters stay readable, the next stage reuses it

    def compile_context(self, dynamo_ctx: Any) -> Any:
        """The dynamo context a `torch.compile`d module's code runs under with this strategy; the
        user's own by default. DDP replaces its backend with one that splits graphs at the bucket
        boundaries, so gradients become ready (and buckets launch) during backward."""
        return dynamo_ctx

    def stop_workers(self) -> None:
        """Stop the worker processes `launch` keeps for this strategy's next stage (none by
        default). They also stop when the strategy is garbage-collected or the process exits."""

    # ------------------------------------------------------------------ preemption
    def preemption_watch(self) -> PreemptionWatch:
        """A fit's watch for preemption notices (strategies/preemption.py): enter it around the
        training loop, ask `due(steps)` at every step boundary. Every rank must open one per fit."""
        return PreemptionWatch(self.preemption, self.agreement_store(), next_fit_key(self.restart_count),
                               self.global_rank, self.world_size, meet=lambda: self.barrier("preemption agreement"),
                               syncs=self.completed_gradient_syncs)

    def completed_gradient_syncs(self) -> int:
        """Synchronised backward passes so far in this process (every rank took part in each): a
        step without one gave no rank a reason to wait for the others (none by default)."""
        return 0

    def agreement_store(self) -> Any:
        """The key-value store every rank reaches (the rendezvous store), for agreements that must
        not cost a collective per step; None with one process."""
        return None

    # ------------------------------------------------------------------ gradients
    def backward(self, loss: torch.Tensor, run: BackwardPass | None = None) -> None:
        """Backpropagate `loss`; when this returns, gradients are synchronised (unless in `no_sync`).
        `run` performs the pass itself (the Trainer passes the module's `backward` hook, which its own
        hooks surround); default `loss.backward()`. A distributed strategy prepares its gradient sync
        before the pass and finishes it after: one route, whoever asked for the backward."""
        (run or torch.Tensor.backward)(loss)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip gradient synchronisation for backward passes inside (gradient accumulation)."""
        yield

    def setup_optimizers(self, optimizers: list[torch.optim.Optimizer], loss_scaling: bool = False) -> None:
        """Prepare the optimizers `configure_optimizers` returned, after `setup_module` and before a checkpoint's
        state is loaded into them (`loss_scaling`: a GradScaler will step them). DDP with `zero_stage=1` makes
        each step only this rank's shard; by default they stay as they are."""

    def optimizer_state_dict(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        """The optimizer's whole state for a checkpoint: every rank calls it (a strategy that shards the
        state gathers it here, to rank 0); by default `optimizer.state_dict()`."""
        return optimizer.state_dict()

    def gradient_buffers(self, grads: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """A few flat tensors that hold exactly `grads` (the optimizer's gradients) when the strategy
        keeps them so, else None. A check that reads every gradient (the non-finite check) then reads
        these: a model's many small gradients cost a kernel launch each (on the CPU, a kernel each),
        which is what a fast compiled step notices."""
        return None

    def reduced_gradients_finite(self, grads: list[torch.Tensor]) -> bool | None:
        """Whether `grads` were all finite when the strategy averaged them, when it saw that on the way and none
        has changed since; else None, and the caller reads them. Our DDP answers between CPU ranks of one host,
        where the shared-memory transport looks at each share it sums (strategies/finite_verdict.py): the
        non-finite check then costs no pass over the gradients."""
        return None

    def gradient_norm(self, optimizer: torch.optim.Optimizer) -> torch.Tensor | None:
        """The 2-norm of all of `optimizer`'s gradients when only the strategy can compute it, else None (the
        caller computes it from the gradients, or `gradient_buffers`). DDP with `zero_stage` 1 or 2 answers:
        each rank holds a shard of the averaged gradients, so the norm is a collective, which every rank
        calls at the same step."""
        return None

    def unwrap(self, module: nn.Module) -> nn.Module:
        """The user's module, without anything the strategy put around it."""
        return module

    # ------------------------------------------------------------------ collectives
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        """Reduce a tensor over the ranks of `group` (default: all) into a new tensor, with Lightning's
        signature and meaning; anything but a tensor comes back as it is."""
        check_group(group)
        resolve_reduce_op(reduce_op)
        return tensor

    def all_gather(self, tensor: torch.Tensor, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
        """Every rank's `tensor`, stacked along a new leading rank dimension when processes are
        distributed; on one process without a process group the tensor itself (Lightning's shapes).
        `sync_grads=True` lets gradients flow back through the gather."""
        check_group(group)
        return tensor

    def all_gather_ranks(self, tensor: torch.Tensor) -> torch.Tensor:
        """`all_gather` with the leading rank dimension always there (size 1 on one process without a
        process group): for bookkeeping indexed by rank (per-rank RNG states, weight checksums)."""
        gathered = self.all_gather(tensor)
        return gathered if gathered.dim() == tensor.dim() + 1 else gathered.unsqueeze(0)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Return rank `src`'s `obj` on every rank (any picklable object)."""
        return obj

    def reduce_boolean_decision(self, decision: bool, all: bool = True) -> bool:  # noqa: A002 (Lightning's name)
        """Agree on a flag across ranks: True if every rank says so (`all=True`) or any does. Lightning's
        own callbacks (EarlyStopping, ModelCheckpoint) call this on the strategy."""
        flags = self.reduce(torch.tensor(int(bool(decision)), device=self.root_device), reduce_op="sum")
        count = int(flags.item())
        return count == self.world_size if all else count > 0

    def barrier(self, name: str | None = None) -> None:
        """Wait until every rank reaches this point."""

    @contextlib.contextmanager
    def local_work(self, what: str) -> Iterator[None]:
        """Mark work that only some ranks do while the others wait for them in a collective
        (`prepare_data` on local rank 0, rank 0 writing a file): the hang guard must not take
        that wait for a stall. Use it around your own rank-0-only work, too."""
        with LEDGER.local_work_section(what):
            yield

    # ------------------------------------------------------------------ checkpoints
    def save_checkpoint(self, checkpoint: dict[str, Any], path: str | os.PathLike[str],
                        background: bool = False) -> None:
        """Every rank calls; global rank 0 writes atomically; everyone waits for the write. With
        `background=True` rank 0 copies the state (strategies/checkpoint_snapshot.py) and writes that
        copy on a thread (strategies/async_checkpoint.py): everyone waits only for the copy. Either
        way the previous background write is finished first (one in flight; files land in order)."""
        if self.is_global_zero:
            with self.local_work(f"saving checkpoint {path}"):
                if background:
                    self._background_writer().submit(checkpoint, os.fspath(path))
                else:
                    self.finish_checkpoints()
                    self.checkpoint_io.save(checkpoint, path)
        self.barrier("save_checkpoint")

    def finish_checkpoints(self) -> None:
        """Return once no checkpoint is being written in the background; raise the error of one that
        failed (naming the file). Only global rank 0 writes, so only there it may wait."""
        if self._checkpoint_writer is not None:
            with self.local_work("finishing a checkpoint write"):  # the other ranks may wait meanwhile
                self._checkpoint_writer.wait()

    def raise_failed_checkpoint_write(self) -> None:
        """Raise the error of a background checkpoint write that failed (cheap: called every step)."""
        if self._checkpoint_writer is not None:
            self._checkpoint_writer.raise_if_failed()

    def after_checkpoint_written(self, action: Callable[[], None]) -> None:
        """Global rank 0: run `action` once the checkpoint being written in the background is on disk,
        now when none is; never if that write fails (what `action` replaces must then stay)."""
        if self._checkpoint_writer is not None:
            self._checkpoint_writer.after_commit(action)
        else:
            action()

    @property
    def checkpoint_stats(self) -> CheckpointSaveStats:
        """Background saves so far on this rank: count, waits for the previous write, stall times."""
        writer = self._checkpoint_writer
        return writer.stats if writer is not None else CheckpointSaveStats()

    def _background_writer(self) -> BackgroundCheckpointWriter:
        if self._checkpoint_writer is None or self._checkpoint_writer.checkpoint_io is not self.checkpoint_io:
            self.finish_checkpoints()
            self._checkpoint_writer = BackgroundCheckpointWriter(self.checkpoint_io)
        return self._checkpoint_writer

    def load_checkpoint(self, path: str | os.PathLike[str], weights_only: bool = True) -> dict[str, Any]:
        """Every rank reads the file itself (weights only, which never executes pickled code, unless
        the user trusts the file: `weights_only=False`), onto the CPU: `load_state_dict` moves weights
        and optimizer state onto the parameters' devices, and what else a checkpoint holds (RNG
        states, step counters, callbacks' best scores) belongs on the CPU, as after a fresh start."""
        if weights_only:  # a CheckpointIO written before `weights_only` existed takes (path, map_location)
            return self.checkpoint_io.load(path, map_location="cpu")
        return self.checkpoint_io.load(path, map_location="cpu", weights_only=False)

    def remove_checkpoint(self, path: str | os.PathLike[str]) -> None:
        """Every rank calls; global rank 0 removes the file once a checkpoint being written in the
        background is committed (a top-k or `last` rotation never leaves no complete checkpoint)."""
        if self.is_global_zero:
            self.after_checkpoint_written(lambda: self.checkpoint_io.remove(path))
        self.barrier("remove_checkpoint")

    # ------------------------------------------------------------------ state in checkpoints
    def state_dict(self) -> dict[str, Any]:
        """What a resumed fit needs from this strategy to behave alike (saved in every full checkpoint;
        none by default)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take back `state_dict()` from a checkpoint, after `setup_module`."""

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict[str, Any]:
        """Facts worth logging about the strategy (bucket plan, overlap, ...)."""
        facts: dict[str, Any] = {"strategy": type(self).__name__, "world_size": self.world_size}
        if self.async_checkpoint or self._checkpoint_writer is not None:  # background saves: what they cost
            facts["checkpoint_saves"] = self.checkpoint_stats.as_dict()
        return facts

    def __getstate__(self) -> dict[str, Any]:
        # A copy for another process: configuration only (the writer's thread stays with this process).
        return {**self.__dict__, "_checkpoint_writer": None}
