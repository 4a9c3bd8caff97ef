"""GradReducer: average gradients across ranks while backward is still running.

Life of one synchronised backward pass:

1. `prepare_for_backward(outputs)` (optional work only with `find_unused_parameters`): params
   the outputs do not depend on are marked ready now, so their buckets need not wait.
2. Each parameter's post-accumulate-grad hook marks it ready. On a CPU its fresh gradient goes into its
   bucket slot at once (divided on the way when prescaled: one pass). On an accelerator it waits for the
   rest of its bucket, then one foreach op copies them all (one launch per bucket, not per parameter; at
   most a bucket of memory held meanwhile): `buckets.copies_per_bucket`. The first hook queues an
   end-of-backward callback.
3. When bucket *i* is complete and buckets *0..i-1* are launched, bucket *i* goes to the comm
   hook (async). Launching in strict index order on every rank is the invariant that makes
   mismatched collectives impossible, whatever order gradients arrive in.
4. The end-of-backward callback launches what is left (a parameter without a gradient
   contributes zeros), waits, and writes the averages back to `.grad`.
5. `finish_backward()` finalises a pass whose callback never ran (no gradient on this rank),
   so this rank still issues the collectives its peers are waiting for.

After the first synchronised pass the buckets are rebuilt once, in the order gradients
actually became ready on rank 0 (broadcast, so every rank builds the same buckets): that order
is kept by strategies/bucket_order.py. With `zero_stage` > 0 (strategies/zero.py) each bucket is padded to
a multiple of the world size and the buckets are never rebuilt: the optimizer's shards are cut from them,
and `ShardedGradReducer` (strategies/zero_reducer.py) reduce-scatters them instead of the all-reduce.
`replan(bucket_cap_mb)` changes the bucket size between passes and `after_sync` gets each pass's
times: `bucket_cap_mb="auto"` (strategies/autotune.py) uses both; timing is strategies/telemetry.py.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.bucket_order import BucketOrder
from strategies.buckets import BucketLayout, trainable_parameters
from strategies.comm_hooks import CommHook, CommHookState, accepts_prescaled, prescales, resolve_comm_hook
from strategies.finite_verdict import FiniteVerdict
from strategies.graph import launch_used_map, reachable_parameter_ids
from strategies.hang_guard import LEDGER
from strategies.shm_transport import SharedMemoryAllReduce
from strategies.telemetry import ReducerTelemetry, StepTimes


class GradReducer:
    """Bucketed, overlapped gradient averaging for one module on one process group.

    Call `prepare_for_backward(outputs)` right before and `finish_backward()` right after every
    `loss.backward()`; inside `no_sync()` gradients only accumulate locally.

    A parameter with no gradient on some rank never blocks or desynchronises anything: it
    contributes zeros. Without `find_unused_parameters`, one that no rank used ends with a zero
    `.grad`; with it (a graph walk plus one tiny all_reduce per step), its `.grad` stays as it
    was, like torch DDP, and its bucket can be sent before backward reaches it.
    """

    _pass_active: bool  # a synchronised pass has started reducing (see _reset_pass for the rest of its state)

    def __init__(self, module: nn.Module, *, process_group: dist.ProcessGroup | None = None,
                 bucket_cap_mb: float = 25.0, first_bucket_cap_mb: float = 1.0,
                 gradient_as_bucket_view: bool = True, comm_hook: str | CommHook | None = None,
                 find_unused_parameters: bool = False, transport: str = "auto",
                 timeout: timedelta = timedelta(minutes=10), zero_stage: int = 0) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"GradReducer expects an nn.Module; received {type(module).__name__}.")
        self._hook = resolve_comm_hook(comm_hook)
        self._params = trainable_parameters(module)
        # A built-in hook may receive buckets already divided by the world size (see _absorb_grad).
        self._state = CommHookState.connect(process_group, self._params, transport=transport, timeout=timeout,
                                            prescale=prescales(self._hook))
        self.process_group, self.world_size = process_group, self._state.world_size
        self.zero_stage = zero_stage  # > 0: buckets padded to whole shards and kept as first planned
        # Between CPU ranks of one host a built-in hook reduces each gradient where autograd left it, and the
        # transport divides it on the way (comm_hooks._mean_in_place): no copy into the bucket at all.
        self._in_place = (self._state.shared_memory is not None and accepts_prescaled(self._hook)
                          and not zero_stage)
        self._divides = self._state.prescaled and not self._in_place  # the reducer divides what it copies in
        self._verdict = FiniteVerdict()  # in place: whether the last pass's means were finite, for free
        self._nonfinite_seen = 0  # the transport's count of non-finite shares at the end of the last pass
        self._divisor = self.world_size if self._divides else 1  # applied while copying gradients in
        self._as_view, self._find_unused = gradient_as_bucket_view, find_unused_parameters
        self.require_backward_grad_sync = True  # False inside `no_sync()`, torch DDP's name
        self._removed = self._finalized_since_mark = False
        self._lock = threading.Lock()  # hooks of params on different devices run on different threads
        self.completed_syncs = 0  # synchronised backward passes so far: every rank met in each
        # Called on every rank after each synchronised pass, between passes (it may replan or issue
        # collectives, as every rank reaches it at the same pass): bucket_cap_mb="auto" lives there.
        self.after_sync: Callable[[StepTimes], None] | None = None
        self._telemetry = ReducerTelemetry()
        self._bucket_order = BucketOrder(self._params, bucket_cap_mb, first_bucket_cap_mb, process_group,
                                         self.world_size)
        self._install_buckets(self._bucket_order.plan())  # validates the caps
        self._handles = [param.register_post_accumulate_grad_hook(self._make_hook(index))
                         for index, param in enumerate(self._params)]

    # ------------------------------------------------------------------ public interface
    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Let backward passes inside accumulate gradients locally, with no communication."""
        previous = self.require_backward_grad_sync
        self.require_backward_grad_sync = False
        try:
            yield
        finally:
            self.require_backward_grad_sync = previous  # the previous value, so nesting and exceptions are safe

    def prepare_for_backward(self, outputs: Any) -> None:
        """Start a pass; with `find_unused_parameters`, mark params `outputs` cannot reach as ready."""
        self._check_not_removed("prepare_for_backward")
        self._finalized_since_mark = False
        if not self.require_backward_grad_sync:
            return
        if self._pass_active:
            raise RuntimeError("The previous synchronised backward started reducing gradients but never "
                               "finished (did loss.backward() raise, or was finish_backward() skipped?). "
                               "Call finish_backward() after every loss.backward().")
        self._telemetry.begin_backward()
        if not self._find_unused:
            return
        reachable = reachable_parameter_ids(outputs)
        with self._lock:
            for index, param in enumerate(self._params):
                if id(param) not in reachable:
                    self._pass_active = True
                    self._absorb_grad(index, more_may_come=True)
                    self._mark_ready(index)

    def finish_backward(self) -> None:
        """End a pass: no-op if the end-of-backward callback already ran, else flush every bucket."""
        self._check_not_removed("finish_backward")
        already_done, self._finalized_since_mark = self._finalized_since_mark, False
        if already_done or not self.require_backward_grad_sync:
            return
        self._finalize()

    def summary(self) -> dict[str, Any]:
        """Bucket plan and step telemetry (see strategies/telemetry.py for the timing keys)."""
        return {
            "world_size": self.world_size,
            "comm_hook": getattr(self._hook, "__name__", repr(self._hook)),
            "transport": "shared_memory" if self._state.shared_memory is not None else "process_group",
            "bucket_cap_mb": self._bucket_order.cap_mb,
            **self._layout.summary(),
            "rebuilt": self._bucket_order.rebuilt,
            **self._telemetry.summary(),
        }

    def gradient_buffers(self, grads: list[torch.Tensor]) -> list[torch.Tensor] | None:
        """The bucket buffers, when they hold exactly `grads` (see `BucketLayout.buffers_holding`): only
        with `gradient_as_bucket_view` (else each `.grad` is a copy a user may change apart from its
        slot) and between passes (during one, slots are half-reduced)."""
        if not self._as_view or self._pass_active:
            return None
        return self._layout.buffers_holding(grads)

    def reduced_finite(self, grads: list[torch.Tensor]) -> bool | None:
        """Whether `grads` were all finite as the last synchronised pass averaged them, when the transport saw
        that on the way (gradients averaged in place) and none has been replaced or written since; else None
        (strategies/finite_verdict.py)."""
        return self._verdict.finite(grads) if self._in_place else None

    @property
    def layout(self) -> BucketLayout:
        """The current buckets (the optimizer's shards are cut from them with `zero_stage` > 0)."""
        return self._layout

    @property
    def shared_memory(self) -> SharedMemoryAllReduce | None:
        """The same-host shared-memory transport the buckets travel by, if any (ZeRO's all-gather uses it too)."""
        return self._state.shared_memory

    @property
    def parameters(self) -> list[nn.Parameter]:
        """The parameters this reducer averages, by index (as in the bucket plan)."""
        return self._params

    @property
    def bucket_cap_mb(self) -> float:
        """The cap the current buckets were planned with (or, before the rebuild, will be)."""
        return self._bucket_order.cap_mb

    def plan_for(self, bucket_cap_mb: float) -> list[list[int]]:
        """The buckets this cap gives in the current readiness order (caps that give the same are one)."""
        return self._bucket_order.plan_for(bucket_cap_mb)

    def replan(self, bucket_cap_mb: float) -> None:
        """Use buckets of another cap from the next pass on: now if the readiness order is known, else
        at the rebuild (the first plan is thrown away then anyway). Between passes, on every rank."""
        if self._pass_active:
            raise RuntimeError("replan() was called during a backward pass; call it between steps.")
        plan = self.plan_for(float(bucket_cap_mb))  # validates the cap
        order = self._bucket_order
        changed, order.cap_mb = float(bucket_cap_mb) != order.cap_mb, float(bucket_cap_mb)
        if changed and order.rebuilt:
            self._move_to(plan)

    def remove(self) -> None:
        """Detach from the module; every `.grad` becomes a standalone tensor again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._as_view:
            self._layout.release_grads(self._params)
        self._install_buckets([])
        self._verdict.clear()
        self._state.close()
        self._removed = True

    # ------------------------------------------------------------------ buckets
    def _install_buckets(self, plan: list[list[int]]) -> None:
        self._layout = BucketLayout(self._params, plan, pad_to=self.world_size if self.zero_stage else 1,
                                    zero_fill=not self._in_place)
        self._reset_pass()  # the pass state is per bucket

    def _move_to(self, plan: list[list[int]]) -> None:
        """Switch to new buckets between steps, keeping the (already averaged) gradients."""
        previous = self._layout
        self._install_buckets(plan)
        if self._as_view:
            self._layout.take_grads(self._params, previous)

    # ------------------------------------------------------------------ one backward pass
    def _reset_pass(self) -> None:
        """The state of one backward pass, per parameter and per bucket of the current plan."""
        self._ready = [False] * len(self._params)
        self._scaled = [False] * len(self._params)  # slot already divided by the world size this pass
        self._pending = [len(indexes) for indexes in self._layout.plan]  # params of each bucket not ready yet
        self._arrived: list[list[int]] = [[] for _ in self._layout.plan]  # fresh grads not yet in their slots
        # In place: the `.grad` each parameter's bucket hands the transport as it is (None: its slot holds it),
        # decided once when the gradient was taken, so the slot handed over is always one that was written.
        self._left: list[torch.Tensor | None] = [None] * len(self._params)
        self._futures: list[torch.futures.Future[torch.Tensor] | None] = [None] * len(self._layout.plan)
        self._next_bucket = 0  # every bucket before it is launched
        self._ready_order: list[int] = []
        self._pass_active = False
        self._callback_queued = False

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if self.require_backward_grad_sync:
                with self._lock:
                    self._on_grad_ready(index)
        return hook

    def _on_grad_ready(self, index: int) -> None:
        self._telemetry.grad_ready()
        if not self._callback_queued:
            # One callback per pass; it runs when the whole backward graph has finished.
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
            self._callback_queued = True
        self._pass_active = True
        if self._ready[index] and self._futures[self._layout.bucket_of[index]] is not None:
            raise RuntimeError(
                f"Parameter {index} received a gradient after its bucket was already sent. Either it "
                "was marked unused (pass every output the loss depends on to prepare_for_backward) or "
                "it got two gradients in one backward (reentrant checkpointing is not supported).")
        self._absorb_grad(index)
        if not self._ready[index]:  # else marked unused up front but used after all: just take the gradient
            self._mark_ready(index)

    def _absorb_grad(self, index: int, more_may_come: bool = False) -> None:
        """Put this param's current gradient (zeros if none) into its bucket slot. `more_may_come`: it is
        marked unused up front but may still receive a gradient in this backward (a reentrant checkpoint
        hides parameters from the graph walk), so a fresh one waits for its bucket like on an accelerator."""
        grad, view = self._params[index].grad, self._layout.views[index]
        self._left[index] = None
        if grad is None:
            view.zero_()
            self._scaled[index] = True  # zero divided is zero
            return
        if grad.is_sparse:
            raise RuntimeError(f"Parameter {index} has a sparse gradient, which GradReducer cannot bucket; "
                               "use dense gradients (e.g. nn.Embedding(sparse=False)).")
        if grad is not view and grad.data_ptr() != view.data_ptr():  # a fresh .grad (set_to_none=True)
            if self._in_place and _reducible_where_it_is(grad, view):
                self._left[index] = grad  # the bucket's launch hands it to the transport as it is (_gradients_of)
                return
            bucket_index = self._layout.bucket_of[index]
            arrived = self._arrived[bucket_index]
            if (more_may_come or self._layout.batched_copies[bucket_index]) and not self._ready[index]:
                arrived.append(index)  # copied in with its bucket's others once that is complete (_mark_ready)
            elif index not in arrived:  # now: one pass on a CPU, or marked unused, used after all, bucket copied
                self._layout.copy_one(self._params[index], index, self._divisor, self._as_view)
                self._scaled[index] = self._divides

    def _mark_ready(self, index: int) -> None:
        self._ready[index] = True
        self._ready_order.append(index)
        bucket_index = self._layout.bucket_of[index]
        self._pending[bucket_index] -= 1
        if self._pending[bucket_index] == 0 and self._arrived[bucket_index]:
            indexes, self._arrived[bucket_index] = self._arrived[bucket_index], []
            self._copy_in(indexes)
        while self._next_bucket < len(self._pending) and self._pending[self._next_bucket] == 0:
            self._launch(self._next_bucket)

    def _copy_in(self, indexes: list[int]) -> None:
        """A bucket's fresh gradients into their slots, divided on the way in when prescaled."""
        self._layout.copy_in(self._params, indexes, self._divisor, self._as_view)
        for index in indexes:
            self._scaled[index] = self._divides

    def _launch(self, bucket_index: int) -> None:
        bucket = self._layout.buckets[bucket_index]
        if self._divides:  # slots that accumulated in place (no_sync, set_to_none=False) are divided here
            for index, view in zip(self._layout.plan[bucket_index], bucket.views()):
                if not self._scaled[index]:
                    view.div_(self.world_size)
        elif self._in_place:
            bucket.leave_in_place(self._gradients_of(bucket_index))
        LEDGER.begin(f"gradient all-reduce, bucket {bucket_index}", bucket.buffer())
        future = self._hook(self._state, bucket)
        self._futures[bucket_index] = future
        self._telemetry.bucket_launched(future)
        self._next_bucket += 1

    def _gradients_of(self, bucket_index: int) -> list[torch.Tensor]:
        """Where each gradient of the bucket is now: its own `.grad` when `_absorb_grad` left it there, else
        its slot (zeros for a missing gradient, a copy, or a `.grad` that already is the slot)."""
        return [left if (left := self._left[index]) is not None else self._layout.views[index]
                for index in self._layout.plan[bucket_index]]

    def _on_backward_end(self) -> None:
        self._telemetry.end_backward()
        self._finalize()
        self._finalized_since_mark = True

    def _finalize(self) -> None:
        """Launch what is left in index order, wait, write the averages back, reset for the next pass."""
        with self._lock, LEDGER.waiting():
            for index in range(len(self._params)):
                if not self._ready[index]:
                    self._absorb_grad(index)
                    self._mark_ready(index)
            used_future = launch_used_map(self._params, self.process_group, self.world_size) \
                if self._find_unused else None
            results = [self._telemetry.wait(future) for future in self._futures if future is not None]
            used = used_future.wait()[0].tolist() if used_future is not None else None
            step = self._telemetry.end_step()
            # Taken before write_back, which forgets them: the tensors this pass averaged in place.
            averaged = [bucket.in_place() or [] for bucket in self._layout.buckets] if self._in_place else []
            self._layout.write_back(self._params, results, used, as_view=self._as_view)
            if self._in_place and self._state.shared_memory is not None:
                self._settle_verdict(self._state.shared_memory.nonfinite_rounds(), averaged)
            self.completed_syncs += 1
            if not self._bucket_order.rebuilt and not self.zero_stage:  # re-plan once, in rank 0's readiness order
                self._move_to(self._bucket_order.rebuild(self._ready_order, self._layout.plan))
            self._reset_pass()
            if self.after_sync is not None:
                self.after_sync(step)

    def _settle_verdict(self, nonfinite_shares: int, averaged: list[list[torch.Tensor]]) -> None:
        """After a pass averaged in place: its means were finite unless a rank counted a non-finite share."""
        finite, self._nonfinite_seen = nonfinite_shares == self._nonfinite_seen, nonfinite_shares
        self._verdict.settle(finite, (tensor for tensors in averaged for tensor in tensors))

    def _check_not_removed(self, method: str) -> None:
        if self._removed:
            raise RuntimeError(f"GradReducer.{method}() called after remove(); create a new GradReducer.")


def _reducible_where_it_is(grad: torch.Tensor, slot: torch.Tensor) -> bool:
    """Whether the transport can read and write `grad` as it is: dense, contiguous, the slot's dtype (a
    channels-last or otherwise strided gradient is copied into its slot instead), and the only tensor on its
    memory. Autograd may make `.grad` the very gradient a backward op produced when nothing else references
    that tensor, even when it is a view of one another branch of the same backward still has to read (the
    gradient of `h + p.view_as(h)` is one tensor for both terms): the transport writes the means while
    backward runs, so such a gradient, or two gradients on one memory, is copied into its slot instead."""
    return (grad.is_contiguous() and grad.dtype == slot.dtype and grad.layout == torch.strided
            and _sole_owner(grad))


def _sole_owner(tensor: torch.Tensor) -> bool:
    """Whether no other tensor (a view, an alias made by an op's backward) shares `tensor`'s memory. The storage's
    holders are counted: `tensor` itself and the storage object held here for the count. A torch without the
    (private) counter gets the copy, which is always safe."""
    if _STORAGE_USE_COUNT is None:
        return False
    return _STORAGE_USE_COUNT(tensor.untyped_storage()._cdata) <= 2


_STORAGE_USE_COUNT: Callable[[int], int] | None = getattr(torch._C, "_storage_Use_Count", None)

