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

import torch
from torch import nn

MIB = 2**20

_GroupKey = tuple[torch.device, torch.dtype]


def trainable_parameters(module: nn.Module) -> list[nn.Parameter]:
    """Parameters that receive gradients, in registration order (shared ones once)."""
    return [param for param in module.parameters() if param.requires_grad]


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
    """

    def __init__(self, index: int, parameters: Sequence[torch.Tensor]) -> None:
        if not parameters:
            raise ValueError(f"bucket {index} has no parameters; a plan must not contain empty buckets.")
        first = parameters[0]
        for param in parameters:
            if (param.device, param.dtype) != (first.device, first.dtype):
                raise ValueError(f"bucket {index} mixes {first.device}/{first.dtype} with "
                                 f"{param.device}/{param.dtype}; plan with plan_buckets(), which groups them.")
        self.index = index
        # True when the reducer already divided every slot by the world size (hooks that declare
        # `accepts_prescaled` then skip their own division pass).
        self.prescaled = False
        self.parameters: list[torch.Tensor] = list(parameters)
        total = sum(param.numel() for param in parameters)
        self._buffer = torch.zeros(total, dtype=first.dtype, device=first.device)
        self._views: list[torch.Tensor] = []
        self._scratch: dict[torch.dtype, torch.Tensor] = {}
        self._position: dict[int, int] = {}
        offset = 0
        for position, param in enumerate(parameters):
            self._views.append(self._buffer[offset:offset + param.numel()].view(param.shape))
            self._position[id(param)] = position
            offset += param.numel()

    def buffer(self) -> torch.Tensor:
        """The flat 1-D gradient buffer of this bucket."""
        return self._buffer

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


def build_buckets(params: Sequence[torch.Tensor], plan: Iterable[Sequence[int]]) -> list[GradBucket]:
    """Allocate one zeroed flat buffer per planned bucket."""
    return [GradBucket(index, [params[i] for i in indexes]) for index, indexes in enumerate(plan)]
