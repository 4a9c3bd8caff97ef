"""The order a GradReducer's buckets follow, and the one time it changes.

Buckets are planned (strategies/buckets.py) in the order gradients are expected to become ready:
reverse registration order at first, since the last layers' gradients come first. After the
first synchronised pass the order they actually became ready in is known; rank 0's is broadcast
and every rank re-plans in it once, so all ranks keep building the same buckets and launching
them in the same order. The cap can change between passes (bucket_cap_mb="auto").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from strategies.buckets import plan_buckets_in_order
from strategies.hang_guard import LEDGER


class BucketOrder:
    """The readiness order and cap a reducer's plans follow, for `params` (the reducer's trainable
    parameters) on `process_group` (None: the default group) of `world_size` ranks."""

    def __init__(self, params: Sequence[torch.Tensor], bucket_cap_mb: float, first_bucket_cap_mb: float,
                 process_group: dist.ProcessGroup | None, world_size: int) -> None:
        self._params, self._first_cap_mb = params, first_bucket_cap_mb
        self._process_group, self._world_size = process_group, world_size
        self.cap_mb = float(bucket_cap_mb)
        self.rebuilt = False  # the order is the observed one
        self._order = list(reversed(range(len(params))))

    def plan_for(self, bucket_cap_mb: float) -> list[list[int]]:
        """The buckets this cap gives in the current readiness order (validates the caps)."""
        return plan_buckets_in_order(self._params, self._order, bucket_cap_mb=bucket_cap_mb,
                                     first_bucket_cap_mb=self._first_cap_mb)

    def plan(self) -> list[list[int]]:
        """The buckets of the current cap and order."""
        return self.plan_for(self.cap_mb)

    def rebuild(self, ready_order: list[int], previous_plan: list[list[int]]) -> list[list[int]]:
        """Adopt rank 0's observed `ready_order` (parameters that never became ready keep their place
        in `previous_plan`, after it) and return the plan in it. Every rank calls it at the same pass."""
        seen = set(ready_order)
        order = ready_order + [i for indexes in previous_plan for i in indexes if i not in seen]
        if self._world_size > 1:
            box: list[Any] = [order]
            src = 0 if self._process_group is None else dist.get_global_rank(self._process_group, 0)
            LEDGER.begin("broadcast(bucket order)")
            dist.broadcast_object_list(box, src=src, group=self._process_group)
            order = box[0]
        self._order = order
        self.rebuilt = True
        return self.plan()
