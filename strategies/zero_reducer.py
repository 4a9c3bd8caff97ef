"""The reducer for `zero_stage` 1 and 2: each bucket is reduce-scattered, not all-reduced.

ZeRO (strategies/zero.py) steps on each rank only its even 1/N of every bucket, so a rank needs only
its shard of the averaged gradients. `ShardedGradReducer` is `GradReducer` with one thing swapped: a
complete bucket (its gradients divided by N on the way in, as the default "mean" hook's are) goes to a
reduce-scatter instead of the all-reduce, still launched in bucket order while backward runs, and this
rank's chunk of the sum lands in `gradient_shards[bucket]`. With the all-gather of the updated
parameters after the step, the bytes per step are an all-reduce's, as under `zero_stage=0`.

The shard's values are the all-reduce's: on CPU ranks of one host the shared-memory transport sums
each chunk in rank order either way; over gloo (an all-reduce of which the rank keeps its chunk: see
`CommHookState.reduce_scatter_async`) or nccl, with two ranks a + b has one order. Outside this rank's
shard a bucket then holds this rank's own (divided) gradient, not the average (over gloo, the average).

Stage 1 (`zero_stage=1`): `gradient_shards[b]` is this rank's chunk of bucket b's buffer itself (the
reduce-scatter writes in place), the buffers stay, and every parameter's `.grad` is its slot, as at
stage 0 (4 + 4 + 8/N bytes per parameter with Adam).

Stage 2 (`zero_stage=2`): `gradient_shards[b]` is a buffer of its own, the only gradient memory kept
between steps (4 + 12/N). A bucket's full buffer exists only while it is being filled and reduced: its
memory is allocated when its first gradient of a synchronised pass arrives and released (the storage
resized to nothing; the slot views keep their place) as soon as its reduce-scatter is done, on the
transport's thread, while backward goes on (the bucket's `.grad`s become memory-less expanded zeros
then, `_unlink_grads`). After the pass every reducer parameter's `.grad` is None:
the optimizer's segments hold the gradients (strategies/zero.py binds them). Inside an accumulation
window (`no_sync`) autograd accumulates each rank's full local gradient in plain `.grad` tensors, as
without ZeRO (4 bytes per parameter until the window's last micro-batch, whose backward moves them
into the buckets). `gradient_bytes()` reports what is held now and the peak of the bucket memory.
"""

from __future__ import annotations

import threading
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.buckets import GradBucket
from strategies.comm_hooks import CommHookState
from strategies.reducer import GradReducer


class ShardedGradReducer(GradReducer):
    """A `GradReducer` whose buckets are reduce-scattered into `gradient_shards` (see the module docstring).

    Built by `ReducerOptions.attach` for `zero_stage` 1 or 2 with the default "mean" comm hook (checked
    there: a hook all-reduces a whole bucket, which is what this replaces)."""

    def __init__(self, module: nn.Module, **options: Any) -> None:
        super().__init__(module, **options)
        self._releases = self.zero_stage >= 2 and self.world_size > 1
        self._bytes_lock = threading.Lock()  # the transport's thread releases buckets while backward allocates
        self._allocated = [True] * len(self.layout.buckets)
        self._zeros: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}  # what released `.grad`s expand
        self.gradient_shards = [self._shard_of(bucket) for bucket in self.layout.buckets]
        self._held = self._peak = sum(bucket.nbytes for bucket in self.layout.buckets)
        if self.world_size > 1:
            self._hook = self._reduce_scatter  # type: ignore[assignment]  # a bound method with the hook's signature
        if self._releases:
            for bucket in self.layout.buckets:
                self._release(bucket)
            self._peak = self._held

    def _shard_of(self, bucket: GradBucket) -> torch.Tensor:
        """Where this rank's chunk of the averaged bucket goes: the chunk itself (stage 1), or its own buffer."""
        buffer = bucket.buffer()
        size = buffer.numel() // self.world_size
        if not self._releases:
            rank = dist.get_rank(self.process_group) if self.world_size > 1 else 0
            return buffer[rank * size:(rank + 1) * size]
        return torch.zeros(size, dtype=buffer.dtype, device=buffer.device)

    # ------------------------------------------------------------------ one bucket
    def _reduce_scatter(self, state: CommHookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        """The bucket's hook: reduce-scatter it (already divided by N) into this rank's shard; at stage 2 its
        full buffer is released as soon as that is done. Resolves to the buffer, so nothing is copied back."""
        future = state.reduce_scatter_async(bucket.buffer(), self.gradient_shards[bucket.index])

        def done(finished: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            finished.value()  # raises the transport's error, if any
            if self._releases:
                self._release(bucket)
                self._unlink_grads(bucket)
            return bucket.buffer()

        return future.then(done)

    def _absorb_grad(self, index: int, more_may_come: bool = False) -> None:
        if self._releases:  # stage 2: the bucket's memory comes back with its first gradient of the pass
            bucket_index = self.layout.bucket_of[index]
            if not self._allocated[bucket_index]:
                self._allocate(self.layout.buckets[bucket_index])
        super()._absorb_grad(index, more_may_come)

    def _finalize(self) -> None:
        super()._finalize()  # its after_sync binds the optimizer's segments to `gradient_shards`
        if self._releases:  # the slots' memory is gone: the optimizer's segments hold the gradients now
            for param in self.parameters:
                param.grad = None

    # ------------------------------------------------------------------ stage 2's bucket memory
    def _allocate(self, bucket: GradBucket) -> None:
        buffer = bucket.buffer()
        buffer.untyped_storage().resize_(bucket.nbytes)
        filled = sum(view.numel() for view in bucket.views())
        buffer[filled:].zero_()  # the padding: every slot is written (or zeroed) before the bucket is sent
        self._allocated[bucket.index] = True
        with self._bytes_lock:
            self._held += bucket.nbytes
            self._peak = max(self._peak, self._held)

    def _unlink_grads(self, bucket: GradBucket) -> None:
        """No `.grad` may stay a view of released memory: autograd would write a second gradient of this pass
        (reentrant checkpointing; the reducer's hook names that error) into it. Each becomes a memory-less
        zero of its shape (an expanded scalar, into which autograd refuses to accumulate), not None: the
        unused-parameter map and the optimizer's binding, at the end of the pass, still see it had one."""
        for param in bucket.parameters:
            if param.grad is not None:
                key = (param.dtype, param.device)
                zero = self._zeros.get(key)
                if zero is None:
                    zero = self._zeros[key] = torch.zeros((), dtype=param.dtype, device=param.device)
                param.grad = zero.expand(param.shape)

    def _release(self, bucket: GradBucket) -> None:
        bucket.buffer().untyped_storage().resize_(0)
        self._allocated[bucket.index] = False
        with self._bytes_lock:
            self._held -= bucket.nbytes

    # ------------------------------------------------------------------ reporting
    def summary(self) -> dict[str, Any]:
        return {**super().summary(), "comm_hook": "reduce_scatter_mean", "gradient_bytes": self.gradient_bytes()}

    def gradient_bytes(self) -> dict[str, int]:
        """Gradient memory this reducer holds: now (between steps), at its peak so far (bucket buffers while
        backward runs; autograd's own transient `.grad` tensors are not counted), and the shards' part."""
        shards = sum(shard.numel() * shard.element_size() for shard in self.gradient_shards)
        own_shards = shards if self._releases else 0  # at stage 1 the shards are parts of the buffers
        with self._bytes_lock:
            return {"held": self._held + own_shards, "peak": self._peak + own_shards, "shards": shards}

    def reset_gradient_peak(self) -> None:
        """Start measuring the peak afresh (a benchmark, after warm-up)."""
        with self._bytes_lock:
            self._peak = self._held
