"""A comm hook that averages like the default one and records the order buckets reach it.

The reducer keeps no history of its launches; tests observe them here instead, as any comm hook
could: `passes[i]` lists the bucket indexes handed to the hook during the i-th synchronised pass.
"""

from __future__ import annotations

import torch

from strategies.buckets import GradBucket
from strategies.comm_hooks import CommHookState, allreduce_mean


class LaunchRecorder:
    """Pass it as `comm_hook`. A launch of bucket 0 opens a new pass: the reducer launches every
    bucket in index order, so a pass always starts with bucket 0 (a reducer that did otherwise
    shows up as a pass that is not 0, 1, 2, ...)."""

    def __init__(self) -> None:
        self.passes: list[list[int]] = []

    def __call__(self, state: CommHookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        if bucket.index == 0 or not self.passes:
            self.passes.append([])
        self.passes[-1].append(bucket.index)
        return allreduce_mean(state, bucket)
