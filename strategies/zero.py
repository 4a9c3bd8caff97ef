"""ZeRO stages 1 and 2 inside our DDP: each rank keeps optimizer state for its own even 1/N of every bucket.

Adam keeps two fp32 moments per parameter; under plain DDP every rank holds all of them. Here the
reducer's buckets are padded to a multiple of the world size N, and rank r owns elements
`[r*S, (r+1)*S)` of every bucket (S = padded length / N): even shards, cut through parameters, not
whole parameters handed out. For each parameter, the part that falls in this rank's shard is one
*segment*: a 1-D view of those elements of the parameter itself (of its bucket's flat buffer); its `.grad` views the same elements
of this rank's shard of the averaged gradients, which the reducer reduce-scatters bucket by bucket
while backward runs (strategies/zero_reducer.py). So the optimizer reads its gradients and writes its
updates with no copy, and no second copy of the weights exists. With Adam, per parameter: stage 1
keeps the full gradient buffers (4 + 4 + 8/N bytes: weights, gradients, 1/N of the two moments);
stage 2 keeps only the shard of the gradients between steps (4 + 12/N).

The user's own optimizer object is kept and changed in place (`shard_optimizer`): each param group
lists this rank's segments instead of the parameters, so `optimizer.param_groups` stays the user's
dicts (lr, weight decay, betas per group; schedulers and run-time edits work as before) and
`optimizer.state` holds only this rank's shard. At every `optimizer.step()`:

  step:   the user's optimizer updates its segments (so the parameters' own elements), elementwise,
          exactly as it would the whole parameters (the same arithmetic on the same elements);
  after:  each bucket's flat parameter buffer is all-gathered in place (in bucket order on every
          rank, all queued before the first wait: through the reducer's shared-memory transport
          between CPU ranks of one host, else `all_gather_into_tensor`). At setup the parameters
          moved into one flat buffer per bucket, laid out as the bucket (`_adopt_parameters`), so
          this rank's updated shard is already where the gather reads it and the peers' shards land
          in the parameters: no pack or unpack copy.

The bytes on the wire per step are a reduce-scatter plus an all-gather: DDP's all-reduce. The shard
of the averaged gradients is bit-identical to what `zero_stage=0`'s all-reduce gives, and the update
is elementwise, so the weights are bit-identical to `zero_stage=0`'s, except where a step reads the
global gradient norm (`gradient_clip_val` by norm; the non-finite check reads only its finiteness):
each rank sums the squares of its shard, one tiny all-reduce adds them (`ZeroShards.global_norm`),
and that sum runs in another order than `zero_stage=0`'s norm of per-parameter norms, so the clip
factor may differ in its last bits: the weights then agree within 1e-6 relative (tested), not bit for bit.

Only optimizers whose update is elementwise can be cut through a parameter (`ELEMENTWISE`); any
other (LBFGS, one that needs whole matrices) is refused at setup, by name.

Checkpoints: `optimizer.state_dict()` is this rank's shard (no hidden collective).
`consolidated_state_dict` (a collective, every rank calls it; the strategy's checkpoint hook) gathers
the state bucket by bucket to rank 0, which returns an ordinary optimizer state dict, numbered as the
unsharded optimizer numbers its parameters: it loads into `zero_stage=0`, one process, another world
size, and back into a sharded optimizer, whose `load_state_dict` cuts a full dict into its shard.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
import torch.distributed as dist

from strategies.buckets import BucketLayout
from strategies.hang_guard import LEDGER
from strategies.shm_transport import SharedMemoryAllReduce

# torch's optimizers whose update of an element reads only that element's gradient and state (and
# scalars shared by the whole group): a parameter cut in two steps exactly as the whole one.
ELEMENTWISE = ("SGD", "Adam", "AdamW", "Adamax", "Adagrad", "Adadelta", "RMSprop", "Rprop", "NAdam", "RAdam", "ASGD")
SHARDABLE_ATTRIBUTE = "zero_shardable"  # a class attribute: a user's optimizer declares itself elementwise
_SHARD_MARK = "zero_shard"  # in a sharded optimizer's own state_dict(): whose shard it is


@dataclasses.dataclass(frozen=True)
class Segment:
    """The part of parameter `param_index` (reducer numbering) in this rank's shard of bucket `bucket`:
    its elements `[start, start + length)` (flattened), at `offset` in the rank's flat shard."""

    param_index: int
    bucket: int
    start: int
    length: int
    offset: int


class ZeroShards:
    """This rank's shard of every bucket of a reducer's `layout`: the segments the optimizers step (views of
    the parameters) and the gather that brings every rank's updated shards into the parameters."""

    def __init__(self, params: Sequence[torch.nn.Parameter], layout: BucketLayout, rank: int, world_size: int,
                 process_group: dist.ProcessGroup | None = None, shared_memory: SharedMemoryAllReduce | None = None,
                 gradient_shards: Sequence[torch.Tensor] | None = None, zero_stage: int = 1) -> None:
        self.params, self.layout = list(params), layout
        self.rank, self.world_size, self.process_group = rank, world_size, process_group
        self.zero_stage = zero_stage
        self.shared_memory = shared_memory  # CPU ranks of one host: gather through it, as the buckets travel
        # Per bucket, this rank's shard of the averaged gradients (the reducer's `gradient_shards`); by
        # default the shard's elements of the bucket buffer itself (stage 1).
        self.gradient_shards = list(gradient_shards) if gradient_shards is not None else [
            bucket.buffer().view(world_size, -1)[rank] for bucket in layout.buckets]
        self.shard_numel: list[int] = []  # per bucket: the elements of each rank's shard (padding included)
        self.segments: dict[int, Segment] = {}  # param index -> its segment here (at most one: shards are contiguous)
        self.tensors: dict[int, torch.Tensor] = {}  # param index -> the segment the optimizer steps
        self._grad_views: dict[int, torch.Tensor] = {}  # param index -> its elements of the averaged gradients
        # Per bucket, the flat buffer its parameters now live in (`_adopt_parameters`): the gather's target
        self.param_buffers: list[torch.Tensor] = []
        for bucket_index, (indexes, bucket) in enumerate(zip(layout.plan, layout.buckets)):
            self.param_buffers.append(self._adopt_parameters(indexes, bucket.buffer().numel()))
            self._cut(bucket_index, indexes, bucket.buffer().numel())
        self._adopted = [param.data_ptr() for param in self.params]  # where each parameter's elements live now
        self._bucket_params = [[self.params[index] for index in indexes] for indexes in layout.plan]  # per step
        self._index_of = {id(param): index for index, param in enumerate(self.params)}
        self.state_bytes_per_rank: list[int] | None = None  # measured after the first step
        # The reducer's gradient memory now and at its peak (`ShardedGradReducer.gradient_bytes`)
        self.gradient_bytes: Callable[[], dict[str, int]] | None = None

    def _adopt_parameters(self, indexes: Sequence[int], bucket_numel: int) -> torch.Tensor:
        """Move the bucket's parameters, values kept, into one flat buffer laid out as the bucket (padding
        zeroed at the end), each `.data` now its slice. Then this rank's shard of the parameters is already
        where the all-gather reads it and the peers' shards land where the parameters read them: no pack or
        unpack copy per step. The Parameter objects stay (optimizers, hooks and the user hold them); `.data`
        keeps dtype and device, so autograd keeps their gradient accumulators and the reducer's hooks.
        One bucket at a time, so setup holds at most one bucket's parameters twice."""
        first = self.params[indexes[0]]
        flat = torch.zeros(bucket_numel, dtype=first.dtype, device=first.device)
        offset = 0
        for index in indexes:
            param = self.params[index]
            if not param.is_contiguous():
                raise ValueError(f"zero_stage={self.zero_stage} keeps each bucket's parameters in one flat buffer "
                                 f"and steps slices of it, so parameters must be contiguous; parameter {index} of "
                                 f"shape {tuple(param.shape)} is not (a channels_last module?). Keep it contiguous, "
                                 "or use zero_stage=0.")
            slot = flat[offset:offset + param.numel()].view_as(param)
            slot.copy_(param.detach())
            param.data = slot
            offset += param.numel()
        return flat

    def _cut(self, bucket_index: int, indexes: Sequence[int], bucket_numel: int) -> None:
        size = bucket_numel // self.world_size
        low, high = self.rank * size, (self.rank + 1) * size
        self.shard_numel.append(size)
        offset = 0
        for index in indexes:
            param = self.params[index]
            numel = param.numel()
            first, last = max(low, offset), min(high, offset + numel)
            if last > first:
                segment = Segment(index, bucket_index, first - offset, last - first, first - low)
                self.segments[index] = segment
                self.tensors[index] = param.detach().view(-1)[segment.start:segment.start + segment.length]
                self._grad_views[index] = self.gradient_shards[bucket_index][first - low:last - low]
            offset += numel

    # ------------------------------------------------------------------ lookups
    def index_of(self, param: torch.Tensor) -> int | None:
        """The reducer's index of `param`, None when the reducer does not average it (frozen at setup)."""
        return self._index_of.get(id(param))

    def buckets_of(self, indexes: Iterable[int]) -> list[int]:
        """The buckets holding these parameters, in bucket order (the order every rank gathers in)."""
        return sorted({self.layout.bucket_of[index] for index in indexes})

    # ------------------------------------------------------------------ around a step
    def bind_grads(self) -> None:
        """Point each segment's `.grad` at its averaged gradient, or None where the parameter has none
        (unused with find_unused_parameters), so the optimizer skips it as it would the parameter."""
        for index, tensor in self.tensors.items():
            tensor.grad = self._grad_views[index] if self.params[index].grad is not None else None

    def global_norm(self, shard_grads: Sequence[torch.Tensor], whole_grads: Sequence[torch.Tensor]) -> torch.Tensor:
        """A collective (every rank, at the same step): the 2-norm of the whole averaged gradients, from this
        rank's `shard_grads` (its segments') and `whole_grads` (parameters every rank holds alike, added once):
        each rank's sum of squares (in float64), one all-reduce of a single number, the root."""
        like = self.gradient_shards[0] if self.gradient_shards else torch.zeros(())
        squares = _sum_of_squares(shard_grads, like.device)
        LEDGER.begin("ZeRO gradient norm (sum of squares over the shards)", squares)
        with LEDGER.waiting():
            if self.shared_memory is not None:
                self.shared_memory.all_reduce_async(squares).wait()
            else:
                dist.all_reduce(squares, group=self.process_group)
        total = squares + _sum_of_squares(whole_grads, like.device)
        return total.sqrt().reshape(()).to(shard_grads[0].dtype if shard_grads else like.dtype)

    def gather(self, buckets: Sequence[int]) -> None:
        """All-gather every rank's updated shard of `buckets` into the parameters, in place (each bucket's
        parameters are its flat buffer): issued in order on every rank, all queued before the first wait, so
        the transport runs them back to back."""
        self._check_parameters_in_place(buckets)
        LEDGER.begin(f"ZeRO all-gather of updated parameters, buckets {list(buckets)}",
                     *(self.param_buffers[index] for index in buckets))
        pending = [self._gather_async(self.param_buffers[index]) for index in buckets]
        with LEDGER.waiting():
            for work in pending:
                work.wait()
        # The gather wrote through the flat buffers, whose version counter is not the parameters': bump theirs,
        # so autograd refuses a graph saved before this step on every rank (as zero_stage=0 does), not only on
        # the rank whose own segment the optimizer wrote.
        torch.autograd.graph.increment_version([param for index in buckets for param in self._bucket_params[index]])

    def _check_parameters_in_place(self, buckets: Sequence[int]) -> None:
        """Refuse to go on when a parameter was given new storage after setup (`module.to(...)` to another device
        or dtype, `.data = ...`, a pruning callback's weight reset): the optimizer would step, and the gather
        fill, buffers the module no longer reads, and that parameter would silently stop training. Every
        parameter's pointer (a fraction of a microsecond each); raised on the ranks where it happened."""
        for index in buckets:
            for param_index in self.layout.plan[index]:
                if self.params[param_index].data_ptr() != self._adopted[param_index]:
                    raise RuntimeError(
                        f"zero_stage={self.zero_stage}: parameter {param_index} (bucket {index}, shape "
                        f"{tuple(self.params[param_index].shape)}) no longer lives in the buffer it was moved to at "
                        "setup (was the module moved or converted with .to()/.half(), or a parameter's .data "
                        "replaced, during fit?). Do it before fit, or use zero_stage=0.")

    def release_parameters(self) -> None:
        """Give every parameter its own storage again (the stage is over). A parameter that stays a view of its
        bucket's buffer pickles that whole buffer (plain pickle, cloudpickle: the next stage's payload, joblib)
        and keeps it alive; one bucket at a time, so this holds at most one bucket twice."""
        for indexes in self.layout.plan:
            for index in indexes:
                param = self.params[index]
                if param.data_ptr() != self._adopted[index]:
                    continue  # the user gave it other storage since
                param.data = param.detach().clone()
                segment = self.segments.get(index)
                if segment is not None:  # the optimizer's slice follows (it may still be read or stepped)
                    self.tensors[index].data = param.detach().view(-1)[segment.start:segment.start + segment.length]
        self.param_buffers, self._adopted = [], [-1] * len(self.params)

    def _gather_async(self, flat: torch.Tensor) -> Any:
        """One bucket's in-place all-gather: this rank's shard of `flat` in, every peer's shard out."""
        if self.shared_memory is not None:
            return self.shared_memory.all_gather_async(flat)
        mine = flat.view(self.world_size, -1)[self.rank]
        return dist.all_gather_into_tensor(flat, mine, group=self.process_group, async_op=True)

    # ------------------------------------------------------------------ reporting
    def measure_state(self, optimizers: Iterable[torch.optim.Optimizer]) -> None:
        """Every rank's optimizer-state bytes (one tiny all-gather; every rank calls it at the same step)."""
        mine = sum(state_bytes(optimizer) for optimizer in optimizers)
        LEDGER.begin("ZeRO optimizer state sizes")
        gathered: list[Any] = [None] * self.world_size
        dist.all_gather_object(gathered, mine, group=self.process_group)
        self.state_bytes_per_rank = [int(value) for value in gathered]

    def summary(self) -> dict[str, Any]:
        """The shard layout and the bytes each rank holds (state measured after the first step)."""
        element_bytes = [bucket.buffer().element_size() for bucket in self.layout.buckets]
        return {
            "zero_stage": self.zero_stage,
            "shard_elements_per_bucket": list(self.shard_numel),
            "padding_elements": sum(size * self.world_size - sum(self.params[i].numel() for i in indexes)
                                    for size, indexes in zip(self.shard_numel, self.layout.plan)),
            "segments_this_rank": len(self.segments),
            "shard_bytes_per_rank": sum(n * b for n, b in zip(self.shard_numel, element_bytes)),
            "optimizer_state_bytes_per_rank": self.state_bytes_per_rank,
            "optimizer_state_bytes_total": sum(self.state_bytes_per_rank) if self.state_bytes_per_rank else None,
            "gradient_bytes_this_rank": self.gradient_bytes() if self.gradient_bytes is not None else None,
        }


def _sum_of_squares(grads: Sequence[torch.Tensor], device: torch.device) -> torch.Tensor:
    """The sum of the squared elements of `grads`, in float64, as a 1-element tensor on `device`."""
    if not grads:
        return torch.zeros(1, dtype=torch.float64, device=device)
    norms = torch.stack(torch._foreach_norm(list(grads), 2.0)).to(device=device, dtype=torch.float64)
    return norms.square().sum().reshape(1)


def state_bytes(optimizer: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in `optimizer.state` (what ZeRO divides by the world size)."""
    return sum(value.numel() * value.element_size() for state in optimizer.state.values()
               for value in state.values() if isinstance(value, torch.Tensor))


def check_elementwise(optimizer: torch.optim.Optimizer) -> None:
    """Refuse, by name, an optimizer whose update of an element may read other elements."""
    cls = type(optimizer)
    known = cls.__module__.startswith("torch.optim") and cls.__name__ in ELEMENTWISE
    if known or getattr(cls, SHARDABLE_ATTRIBUTE, False) is True:
        return
    raise TypeError(f"ZeRO (zero_stage 1 or 2) cannot shard {cls.__module__}.{cls.__qualname__}: each rank steps an "
                    "even 1/N of every bucket, cut through parameters, which is exact only for an optimizer whose "
                    f"update of an element reads that element alone (torch.optim's {', '.join(ELEMENTWISE)}). Use "
                    f"zero_stage=0 for it, or, if its update is elementwise, set "
                    f"`{cls.__name__}.{SHARDABLE_ATTRIBUTE} = True`.")


class ShardedOptimizer:
    """What `shard_optimizer` did to one optimizer: its original param groups and the hooks that keep the
    shards in step. Kept on the optimizer as `optimizer.zero_shards` (`sharding_of` finds it)."""

    def __init__(self, optimizer: torch.optim.Optimizer, shards: ZeroShards) -> None:
        self.optimizer, self.shards = optimizer, shards
        self.original_groups = [list(group["params"]) for group in optimizer.param_groups]
        covered = [shards.index_of(param) for group in self.original_groups for param in group]
        self.indexes = [index for index in covered if index is not None]  # the reducer's params it steps
        self.buckets = shards.buckets_of(self.indexes)
        self.after_first_step: Any = None  # called once after the first step (the strategy measures state)

    def install(self) -> None:
        optimizer, full = self.optimizer, self.optimizer.state_dict()
        for group, params in zip(optimizer.param_groups, self.original_groups):
            group["params"] = self._shard_params(params)
        optimizer.state.clear()
        unsharded_zero_grad = optimizer.zero_grad

        def zero_grad(set_to_none: bool = True) -> None:
            unsharded_zero_grad(set_to_none)
            self._zero_module_grads(set_to_none)

        optimizer.zero_grad = zero_grad  # type: ignore[method-assign]
        optimizer.register_step_post_hook(lambda *_: self._after_step())
        optimizer.register_state_dict_post_hook(self._mark_shard)
        optimizer.register_load_state_dict_pre_hook(self._to_shard)
        optimizer.zero_shards = self  # type: ignore[attr-defined]
        if full["state"]:
            optimizer.load_state_dict(full)  # state it already had (a resumed optimizer) is cut like a checkpoint's

    def _shard_params(self, params: list[torch.Tensor]) -> list[torch.Tensor]:
        """A group's parameters as this rank steps them: a reducer's parameter by its segment here (none when
        its elements all lie in other ranks' shards), any other (frozen at setup) whole, as every rank does."""
        shards, listed = self.shards, []
        for param in params:
            index = shards.index_of(param)
            if index is None:
                listed.append(param)
            elif index in shards.tensors:
                listed.append(shards.tensors[index])
        return listed

    def grad_norm(self) -> torch.Tensor:
        """A collective: the 2-norm of all of this optimizer's (averaged) gradients across the shards."""
        segments = {id(self.shards.tensors[index]) for index in self.indexes if index in self.shards.tensors}
        grads = [(id(param), param.grad) for group in self.optimizer.param_groups for param in group["params"]
                 if param.grad is not None]
        return self.shards.global_norm([grad for key, grad in grads if key in segments],
                                       [grad for key, grad in grads if key not in segments])

    def _after_step(self) -> None:
        self.shards.gather(self.buckets)
        if self.after_first_step is not None:
            callback, self.after_first_step = self.after_first_step, None
            callback()

    def _zero_module_grads(self, set_to_none: bool) -> None:
        """The gradients the optimizer no longer lists: the parameters' own (torch's zero_grad rule)."""
        for index in self.indexes:
            param = self.shards.params[index]
            if param.grad is None:
                continue
            if set_to_none:
                param.grad = None
            else:
                param.grad.detach_() if param.grad.grad_fn is not None else param.grad.requires_grad_(False)
                param.grad.zero_()

    # ------------------------------------------------------------------ state dicts
    def _mark_shard(self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
        state_dict[_SHARD_MARK] = {"rank": self.shards.rank, "world_size": self.shards.world_size}
        return state_dict

    def _to_shard(self, optimizer: torch.optim.Optimizer, state_dict: dict[str, Any]) -> dict[str, Any]:
        """A full (ordinary) optimizer state dict cut to this rank's shard; this rank's own passes as it is."""
        mark = state_dict.get(_SHARD_MARK)
        if mark is not None:
            mine = {"rank": self.shards.rank, "world_size": self.shards.world_size}
            if mark != mine:
                raise ValueError(f"this optimizer state is the ZeRO shard of rank {mark['rank']} of "
                                 f"{mark['world_size']}, not of rank {mine['rank']} of {mine['world_size']}; "
                                 "load a consolidated checkpoint (the Trainer writes one) instead.")
            return {key: value for key, value in state_dict.items() if key != _SHARD_MARK}
        saved_groups = state_dict["param_groups"]
        if len(saved_groups) != len(self.original_groups) or any(
                len(saved["params"]) != len(params) for saved, params in zip(saved_groups, self.original_groups)):
            raise ValueError("the loaded optimizer state has param groups of sizes "
                             f"{[len(group['params']) for group in saved_groups]}, this optimizer "
                             f"{[len(params) for params in self.original_groups]}.")
        saved_state = state_dict["state"]
        state: dict[int, Any] = {}
        groups = []
        position = 0
        for saved, params in zip(saved_groups, self.original_groups):
            numbers = []
            for saved_number, param in zip(saved["params"], params):
                index = self.shards.index_of(param)
                if index is not None and index not in self.shards.tensors:
                    continue  # no element of it is stepped on this rank
                if saved_number in saved_state:
                    value = saved_state[saved_number]
                    state[position] = value if index is None else self._cut_state(index, param, value)
                numbers.append(position)
                position += 1
            groups.append({**saved, "params": numbers})
        return {"state": state, "param_groups": groups}

    def _cut_state(self, index: int, param: torch.Tensor, state: dict[str, Any]) -> dict[str, Any]:
        segment = self.shards.segments[index]
        return {key: value.reshape(-1)[segment.start:segment.start + segment.length].clone()
                if _per_element(value, param.shape) else value for key, value in state.items()}

    def consolidated_state_dict(self) -> dict[str, Any]:
        """A collective: the whole optimizer's state as an ordinary state dict on rank 0 (numbered like the
        unsharded optimizer), gathered one bucket at a time; the other ranks get the param groups only."""
        shards, optimizer = self.shards, self.optimizer
        local = optimizer.state_dict()
        by_tensor = {id(tensor): number for number, tensor in
                     enumerate(p for group in optimizer.param_groups for p in group["params"])}
        local_state = local["state"]
        gathered: dict[int, dict[str, Any]] = {}  # reducer index -> full state (rank 0)
        for bucket_index in self.buckets:
            pieces = {index: (shards.segments[index].start, local_state[by_tensor[id(shards.tensors[index])]])
                      for index in shards.layout.plan[bucket_index] if index in shards.tensors
                      and by_tensor.get(id(shards.tensors[index])) in local_state}
            received: list[Any] = [None] * shards.world_size if shards.rank == 0 else []
            LEDGER.begin(f"ZeRO optimizer state gather, bucket {bucket_index}")
            dist.gather_object(pieces, received if shards.rank == 0 else None, dst=_global_zero(shards.process_group),
                               group=shards.process_group)
            if shards.rank == 0:
                for index in shards.layout.plan[bucket_index]:
                    parts = sorted((piece[index] for piece in received if index in piece), key=lambda part: part[0])
                    if parts:
                        gathered[index] = _join(parts, shards.params[index].shape)
        state: dict[int, Any] = {}
        groups = []
        number = 0
        for group, params in zip(optimizer.param_groups, self.original_groups):
            numbers = []
            for param in params:
                reduced = shards.index_of(param)
                if reduced is None:
                    if by_tensor.get(id(param)) in local_state:  # a whole parameter every rank steps alike
                        state[number] = local_state[by_tensor[id(param)]]
                elif reduced in gathered:
                    state[number] = gathered[reduced]
                numbers.append(number)
                number += 1
            groups.append({**{key: value for key, value in group.items() if key != "params"}, "params": numbers})
        return {"state": state if shards.rank == 0 else {}, "param_groups": groups}


def _per_element(value: Any, shape: torch.Size) -> bool:
    """Whether a state entry holds one value per element of its parameter (momentum, moments)."""
    return isinstance(value, torch.Tensor) and value.dim() > 0 and value.shape == shape


def _join(parts: list[tuple[int, dict[str, Any]]], shape: torch.Size) -> dict[str, Any]:
    """One parameter's state from its segments' states, in element order: per-element entries joined and
    shaped like the parameter, the rest (the step count) taken from the first segment."""
    first = parts[0][1]
    joined: dict[str, Any] = {}
    for key, value in first.items():
        if isinstance(value, torch.Tensor) and value.dim() == 1 and sum(
                part[key].numel() for _, part in parts) == shape.numel():
            joined[key] = torch.cat([part[key] for _, part in parts]).view(shape)
        else:
            joined[key] = value
    return joined


def _global_zero(process_group: dist.ProcessGroup | None) -> int:
    return 0 if process_group is None else dist.get_global_rank(process_group, 0)


def sharding_of(optimizer: Any) -> ShardedOptimizer | None:
    """The ZeRO sharding of `optimizer` (or of the optimizer a wrapper holds), None when it is not sharded."""
    found = getattr(optimizer, "zero_shards", None)
    return found if isinstance(found, ShardedOptimizer) else None


def shard_optimizer(optimizer: torch.optim.Optimizer, shards: ZeroShards) -> ShardedOptimizer:
    """Make `optimizer` (the user's own object) step only this rank's shard; see the module docstring."""
    check_elementwise(optimizer)
    sharded = ShardedOptimizer(optimizer, shards)
    sharded.install()
    return sharded


def clip_grad_norm_(optimizer: Any, parameters: list[torch.Tensor], max_norm: float) -> None:
    """Clip the optimizer's gradients to a total norm of `max_norm`. Sharded, the norm is that of the whole
    averaged gradients, summed across the shards (a collective: every rank clips at the same step); its
    summation order differs from torch's, so the clip factor may differ from zero_stage=0's in the last bits."""
    sharded = sharding_of(optimizer)
    if sharded is None:
        torch.nn.utils.clip_grad_norm_(parameters, max_norm)
        return
    torch.nn.utils.clip_grads_with_norm_(parameters, max_norm, sharded.grad_norm())


def gradient_norm(optimizer: Any) -> torch.Tensor | None:
    """The 2-norm of a sharded optimizer's whole gradients (a collective), None for one that is not sharded."""
    sharded = sharding_of(optimizer)
    return sharded.grad_norm() if sharded is not None else None


# ---------------------------------------------------------------------- what a strategy calls
def attach_shards(reducer: Any, rank: int, world_size: int) -> ZeroShards | None:
    """This rank's shard of every bucket of a `ShardedGradReducer` (zero_stage 1 or 2), its segments' gradients
    bound after each synchronised pass; None when there is nothing to shard (stage 0, or one rank)."""
    if not reducer.zero_stage or world_size == 1:
        return None
    shards = ZeroShards(reducer.parameters, reducer.layout, rank, world_size, reducer.process_group,
                        reducer.shared_memory, reducer.gradient_shards, reducer.zero_stage)
    if reducer.after_sync is not None:  # bucket_cap_mb="auto" (its only other user) is refused with ZeRO
        raise RuntimeError("a ZeRO reducer already has an after_sync callback; bucket_cap_mb='auto' is not "
                           "supported with ZeRO.")
    reducer.after_sync = lambda _times: shards.bind_grads()
    shards.gradient_bytes = reducer.gradient_bytes
    return shards


def shard_optimizers(optimizers: Sequence[torch.optim.Optimizer], shards: ZeroShards, loss_scaling: bool) -> None:
    """Shard every optimizer that has parameters (`shard_optimizer`); the first one's first step also measures
    every rank's state bytes (`ZeroShards.summary`). `loss_scaling` (a GradScaler steps them) is refused."""
    if loss_scaling:
        raise ValueError(f"zero_stage={shards.zero_stage} cannot run with a loss scaler (precision='16-mixed'): each "
                         "rank would judge overflow on its own shard and skip steps alone. Use "
                         "precision='bf16-mixed' or '32-true', or zero_stage=0.")
    sharded = [shard_optimizer(optimizer, shards) for optimizer in optimizers
               if any(group["params"] for group in optimizer.param_groups)]
    if sharded:
        sharded[0].after_first_step = lambda: shards.measure_state(optimizers)


def optimizer_state_dict(optimizer: Any) -> dict[str, Any]:
    """The whole state of `optimizer` for a checkpoint: consolidated on rank 0 (a collective) when sharded."""
    sharded = sharding_of(optimizer)
    return sharded.consolidated_state_dict() if sharded is not None else optimizer.state_dict()


def shard_lightning_optimizers(optimizers: Sequence[torch.optim.Optimizer], shards: ZeroShards,
                               precision_plugin: Any) -> None:
    """`shard_optimizers` inside Lightning's Trainer (the plug-in, strategies/lightning/core.py): Lightning's
    precision plugin clips by the norm of the optimizer's gradients, which are now a shard; its
    `clip_grad_by_norm` is pointed at `clip_grad_norm_`, which takes the whole gradients' norm."""
    shard_optimizers(optimizers, shards, loss_scaling=getattr(precision_plugin, "scaler", None) is not None)

    def clip_grad_by_norm(optimizer: torch.optim.Optimizer, clip_val: float) -> None:
        clip_grad_norm_(optimizer, list(precision_plugin.main_params(optimizer)), float(clip_val))

    precision_plugin.clip_grad_by_norm = clip_grad_by_norm
