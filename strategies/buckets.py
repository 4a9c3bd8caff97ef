"""Pure bucket planning and the flat gradient buffers the reducer communicates.

Planning never touches a process group, so it is unit-tested on its own. A plan is a list of
buckets, each a list of parameter indexes (positions in `trainable_parameters(module)`).
Buckets follow the order gradients are expected to become ready (reverse registration order
at first, the observed order after the rebuild), are homogeneous in device and dtype (one
flat buffer, one collective each), and close at a size cap. The first bucket of each
device/dtype group has its own, smaller cap (`min(first_bucket_cap_mb, bucket_cap_mb)`) so that
communication starts early in backward.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, cast

import torch
from torch import nn

MIB = 2**20

_GroupKey = tuple[torch.device, torch.dtype]


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that receive gradients, in registration order (shared ones once)."""
    return [param for param in module.parameters() if param.requires_grad]


def copies_per_bucket(device: torch.device) -> bool:
    """Whether fresh gradients on `device` wait for the rest of their bucket and go into it together.

    On an accelerator every op is a kernel launch the host pays for, so a bucket's gradients are copied by
    one foreach op when its last one arrives (#30). On a CPU an op costs only its pass over memory, so each
    gradient goes into its slot as it arrives: one pass, spread over backward, nothing held back, and the
    bucket's collective starts the moment its last gradient lands (#37).
    """
    return device.type != "cpu"


def plan_buckets(params: Sequence[torch.Tensor], *, bucket_cap_mb: float = 25.0,
                 first_bucket_cap_mb: float = 1.0) -> list[list[int]]:
    """Plan for the first step: gradients of the last-registered layers are ready first."""
    order = list(reversed(range(len(params))))
    return plan_buckets_in_order(params, order, bucket_cap_mb=bucket_cap_mb,
                                 first_bucket_cap_mb=first_bucket_cap_mb)


def plan_buckets_in_order(params: Sequence[torch.Tensor], order: Sequence[int], *,
                          bucket_cap_mb: float = 25.0, first_bucket_cap_mb: float = 1.0) -> list[list[int]]:
    """Plan buckets from an explicit readiness order (a permutation of the parameter indexes).

    Used for the rebuild, where `order` is the order gradients actually became ready.
    Bucket `i` holds the earliest-ready parameters not in buckets `0..i-1` of its group,
    and buckets are sorted by their first parameter's position in `order`.
    """
    _check_caps(bucket_cap_mb, first_bucket_cap_mb)
    _check_permutation(order, len(params))
    # The first cap exists to start communication early, so it never exceeds the general cap:
    # bucket_cap_mb=0.001 alone must give small buckets everywhere.
    cap = bucket_cap_mb * MIB
    first_cap = min(first_bucket_cap_mb * MIB, cap)
    open_buckets: dict[_GroupKey, list[int]] = {}
    open_bytes: dict[_GroupKey, int] = {}
    closed_groups: set[_GroupKey] = set()  # groups whose first bucket has closed
    buckets: list[list[int]] = []
    for index in order:
        param = params[index]
        key = (param.device, param.dtype)
        nbytes = param.numel() * param.element_size()
        current = open_buckets.setdefault(key, [])
        limit = cap if key in closed_groups else first_cap
        # An empty bucket always takes the parameter, so an oversized one gets its own bucket.
        if current and open_bytes[key] + nbytes > limit:
            buckets.append(current)
            closed_groups.add(key)
            current = open_buckets[key] = []
            open_bytes[key] = 0
        current.append(index)
        open_bytes[key] = open_bytes.get(key, 0) + nbytes
    buckets.extend(bucket for bucket in open_buckets.values() if bucket)
    position = {index: pos for pos, index in enumerate(order)}
    return sorted(buckets, key=lambda bucket: position[bucket[0]])


def _check_caps(bucket_cap_mb: float, first_bucket_cap_mb: float) -> None:
    for name, value in (("bucket_cap_mb", bucket_cap_mb), ("first_bucket_cap_mb", first_bucket_cap_mb)):
        if not value > 0:
            raise ValueError(f"{name}={value!r} must be a positive number of MiB (e.g. 25.0).")


def _check_permutation(order: Sequence[int], count: int) -> None:
    if sorted(order) != list(range(count)):
        raise ValueError(f"order must list every parameter index 0..{count - 1} exactly once; "
                         f"got {len(order)} entries: {list(order)[:10]}...")


class GradBucket:
    """One bucket: a flat buffer whose slices hold the gradients of `parameters`.

    This is the object comm hooks receive. `buffer()` is what they reduce; with
    `gradient_as_bucket_view` each `param.grad` *is* `view_for(param)`, so reducing the
    buffer reduces the gradients in place with no copy in or out.

    One exception, the reducer's to make: between CPU ranks of one host the built-in hooks reduce the
    gradients where autograd left them (`in_place()`, a list in `parameters`' order; a slot where a
    gradient is missing or already in it), undivided, and `buffer()` holds only those slots.
    """

    def __init__(self, index: int, parameters: Sequence[torch.Tensor], pad_to: int = 1, *,
                 zero_fill: bool = True) -> None:
        if not parameters:
            raise ValueError(f"bucket {index} has no parameters; a plan must not contain empty buckets.")
        first = parameters[0]
        for param in parameters:
            if (param.device, param.dtype) != (first.device, first.dtype):
                raise ValueError(f"bucket {index} mixes {first.device}/{first.dtype} with "
                                 f"{param.device}/{param.dtype}; plan with plan_buckets(), which groups them.")
        self.index = index
        self.parameters: list[torch.Tensor] = list(parameters)
        total = sum(param.numel() for param in parameters)
        # ZeRO (strategies/zero.py) shards the buffer evenly over `pad_to` ranks: the tail past the
        # gradients stays zero, so reducing it changes nothing.
        padded = -(-total // pad_to) * pad_to
        # Without `zero_fill` every slot is written before it is read (gradients reduced in place use few
        # slots or none), and memory never written is never resident: no bucket's worth of RSS for nothing.
        make = torch.zeros if zero_fill else torch.empty
        self._buffer = make(padded, dtype=first.dtype, device=first.device)
        self._views: list[torch.Tensor] = []
        self._scratch: dict[torch.dtype, torch.Tensor] = {}
        self._in_place: list[torch.Tensor] | None = None
        self._position: dict[int, int] = {}
        offset = 0
        for position, param in enumerate(parameters):
            self._views.append(self._buffer[offset:offset + param.numel()].view(param.shape))
            self._position[id(param)] = position
            offset += param.numel()

    def buffer(self) -> torch.Tensor:
        """The flat 1-D gradient buffer of this bucket (with ZeRO, padded to a multiple of the ranks)."""
        return self._buffer

    def in_place(self) -> list[torch.Tensor] | None:
        """Where this pass's gradients are, when the reducer left them in place (see the class docstring),
        else None: then `buffer()` holds them all."""
        return self._in_place

    def leave_in_place(self, gradients: list[torch.Tensor] | None) -> None:
        """The reducer's: this pass's gradients are `gradients` (None: they are in `buffer()`)."""
        self._in_place = gradients

    def scratch(self, dtype: torch.dtype) -> torch.Tensor:
        """A flat buffer shaped like `buffer()` in `dtype`, allocated once and reused (for hooks
        that communicate a converted copy)."""
        found = self._scratch.get(dtype)
        if found is None:
            found = self._scratch[dtype] = torch.empty_like(self._buffer, dtype=dtype)
        return found

    def view_for(self, param: torch.Tensor) -> torch.Tensor:
        """The slice of the buffer that holds `param`'s gradient, shaped like `param`."""
        position = self._position.get(id(param))
        if position is None:
            raise KeyError(f"parameter of shape {tuple(param.shape)} is not in bucket {self.index}.")
        return self._views[position]

    def views(self) -> list[torch.Tensor]:
        """Views aligned with `parameters`."""
        return self._views

    @property
    def nbytes(self) -> int:
        return self._buffer.numel() * self._buffer.element_size()

    def __repr__(self) -> str:
        return (f"GradBucket(index={self.index}, params={len(self.parameters)}, "
                f"mib={self.nbytes / MIB:.3f}, {self._buffer.dtype}, {self._buffer.device})")


def build_buckets(params: Sequence[torch.Tensor], plan: Iterable[Sequence[int]], pad_to: int = 1, *,
                  zero_fill: bool = True) -> list[GradBucket]:
    """Allocate one flat buffer per planned bucket (its length a multiple of `pad_to`), zeroed unless not
    `zero_fill`."""
    return [GradBucket(index, [params[i] for i in indexes], pad_to, zero_fill=zero_fill)
            for index, indexes in enumerate(plan)]


class BucketLayout:
    """The buckets of one plan and, per parameter, its bucket and its slot (a view into that
    bucket's buffer): what the reducer looks up at every gradient hook."""

    def __init__(self, params: Sequence[torch.Tensor], plan: list[list[int]], pad_to: int = 1, *,
                 zero_fill: bool = True) -> None:
        self.plan = plan
        self.buckets = build_buckets(params, plan, pad_to, zero_fill=zero_fill)
        self.bucket_of = [0] * len(params)  # param index -> bucket index
        self.views: list[torch.Tensor] = [torch.empty(0)] * len(params)  # param index -> its slot
        for bucket_index, (indexes, bucket) in enumerate(zip(plan, self.buckets)):
            for param_index, view in zip(indexes, bucket.views()):
                self.bucket_of[param_index] = bucket_index
                self.views[param_index] = view
        self.slot_ids = frozenset(id(view) for view in self.views)  # the slots live as long as the layout
        self.batched_copies = [copies_per_bucket(bucket.buffer().device) for bucket in self.buckets]

    def buffers_holding(self, grads: Sequence[torch.Tensor]) -> list[torch.Tensor] | None:
        """The flat buffers, when `grads` are exactly the slots (every one, each once), so that a check
        reading every gradient can read a few large tensors instead; else None. Checked each call:
        a user may have replaced a `.grad` since the reduction put the slot there."""
        if len(grads) != len(self.views) or {id(grad) for grad in grads} != self.slot_ids:
            return None
        return [bucket.buffer() for bucket in self.buckets]

    def take_grads(self, params: Sequence[torch.Tensor], previous: BucketLayout) -> None:
        """Make every `.grad` that is a slot of the `previous` layout its slot here, value kept: after a re-plan
        with `gradient_as_bucket_view` the (averaged) gradients still live in the old buffers. A `.grad` with
        its own memory (averaged where autograd left it) stays where it is."""
        for param, view in zip(params, self.views):
            if param.grad is not None and id(param.grad) in previous.slot_ids:
                view.copy_(param.grad)
                param.grad = view

    def release_grads(self, params: Sequence[torch.Tensor]) -> None:
        """Give every `.grad` its own memory again: the buffers it may be a slot of are about to go."""
        for param in params:
            if param.grad is not None:
                param.grad = param.grad.clone()

    def copy_one(self, param: torch.Tensor, index: int, divisor: int, as_view: bool) -> None:
        """Copy `param`'s fresh gradient (parameter `index`) into its slot, divided by `divisor` on the way
        (1: as it is): one pass, no temporary. With `as_view` its `.grad` then becomes its slot."""
        view, grad = self.views[index], param.grad  # the caller saw the gradient is there
        if divisor == 1:
            view.copy_(grad)  # type: ignore[arg-type]  # (no typing.cast: a call per gradient on the hot path)
        else:
            torch.div(grad, divisor, out=view)  # type: ignore[arg-type]
        if as_view:
            param.grad = view

    def copy_in(self, params: Sequence[torch.Tensor], indexes: Sequence[int], divisor: int, as_view: bool) -> None:
        """Copy the fresh gradients of `params[indexes]` (a bucket's, on an accelerator: see `batched_copies`)
        into their slots at once: one foreach copy, then one in-place foreach divide when `divisor != 1` (no
        bucket of temporaries). One gradient alone goes by `copy_one`."""
        if len(indexes) == 1:
            self.copy_one(params[indexes[0]], indexes[0], divisor, as_view)
            return
        grads = [cast(torch.Tensor, params[index].grad) for index in indexes]  # the caller saw each is there
        views = [self.views[index] for index in indexes]
        torch._foreach_copy_(views, grads)
        if divisor != 1:
            torch._foreach_div_(views, divisor)
        if as_view:
            for index, view in zip(indexes, views):
                params[index].grad = view

    def write_back(self, params: Sequence[torch.Tensor], results: Sequence[torch.Tensor],
                   used: list[int] | None, as_view: bool) -> None:
        """Put each bucket's averaged `result` into its buffer and each parameter's slot into its `.grad`
        (as the slot itself with `as_view`, else copied), except parameters no rank used (`used`)."""
        for indexes, bucket, result in zip(self.plan, self.buckets, results):
            if result.data_ptr() != bucket.buffer().data_ptr():  # the hook answered in a new tensor
                bucket.buffer().copy_(result.view_as(bucket.buffer()))
            reduced = bucket.in_place() or bucket.views()
            bucket.leave_in_place(None)
            for index, view, where in zip(indexes, bucket.views(), reduced):
                if used is not None and not used[index]:
                    continue  # no rank produced a gradient: leave .grad as it was (None)
                if where is not view:
                    continue  # averaged where autograd left it: `.grad` holds the mean already
                param = params[index]
                if as_view:
                    if param.grad is None:  # otherwise .grad already is the view (the reducer put it there)
                        param.grad = view
                elif param.grad is None:
                    param.grad = view.clone()
                else:
                    param.grad.copy_(view)

    def summary(self) -> dict[str, Any]:
        return {"buckets": len(self.buckets), "bucket_sizes_mib": [bucket.nbytes / MIB for bucket in self.buckets],
                "bucket_param_indices": [list(indexes) for indexes in self.plan]}
