"""GradReducer: average gradients across ranks while backward is still running.

Life of one synchronised backward pass:

1. `prepare_for_backward(outputs)` (optional work only with `find_unused_parameters`): params
   the outputs do not depend on are marked ready now, so their buckets need not wait.
2. Each parameter's post-accumulate-grad hook copies its gradient into its bucket slot (or
   finds it already there: with `gradient_as_bucket_view`, `param.grad` *is* the slot) and
   marks it ready. The first hook of the pass queues one end-of-backward callback.
3. When bucket *i* is complete and buckets *0..i-1* are launched, bucket *i* goes to the comm
   hook (async). Launching in strict index order on every rank is the invariant that makes
   mismatched collectives impossible, whatever order gradients arrive in.
4. The end-of-backward callback launches what is left (a parameter without a gradient
   contributes zeros), waits, and writes the averages back to `.grad`.
5. `finish_backward()` finalises a pass whose callback never ran (no gradient on this rank),
   so this rank still issues the collectives its peers are waiting for.

After the first synchronised pass the buckets are rebuilt once, in the order gradients
actually became ready on rank 0 (broadcast, so every rank builds the same buckets). With
`bucket_cap_mb="auto"` the next few passes then try candidate caps (strategies/autotune.py)
and keep the fastest. Step timing lives in strategies/telemetry.py.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from strategies.autotune import BucketAutotuner, autotuner_for, distinct_candidates
from strategies.buckets import MIB, build_buckets, plan_buckets, plan_buckets_in_order, trainable_parameters
from strategies.comm_hooks import CommHook, CommHookState, resolve_comm_hook
from strategies.graph import launch_used_map, reachable_parameter_ids
from strategies.hang_guard import LEDGER
from strategies.shm_transport import SharedMemoryAllReduce, check_transport, connect_shared_memory
from strategies.telemetry import ReducerTelemetry, StepTimes

_HISTORY_LIMIT = 1024  # launch orders kept; bounded so a long run does not grow without limit
_FIRST_STEP_CAP_MB = 25.0  # "auto": the plan of the first pass, which only observes readiness order
_log = logging.getLogger(__name__)


class GradReducer:
    """Bucketed, overlapped gradient averaging for one module on one process group.

    Call `prepare_for_backward(outputs)` right before and `finish_backward()` right after every
    `loss.backward()`; inside `no_sync()` gradients only accumulate locally.

    A parameter with no gradient on some rank never blocks or desynchronises anything: it
    contributes zeros. Without `find_unused_parameters`, one that no rank used ends with a zero
    `.grad`; with it (a graph walk plus one tiny all_reduce per step), its `.grad` stays as it
    was, like torch DDP, and its bucket can be sent before backward reaches it.
    """

    # State of the current backward pass, (re)set by _reset_pass.
    _ready: list[bool]
    _pending: list[int]  # params of each bucket not ready yet
    _futures: list[torch.futures.Future[torch.Tensor] | None]
    _next_bucket: int
    _ready_order: list[int]
    _launch_order: list[int]
    _pass_active: bool
    _callback_queued: bool

    def __init__(self, module: nn.Module, *, process_group: dist.ProcessGroup | None = None,
                 bucket_cap_mb: float | str = 25.0, first_bucket_cap_mb: float = 1.0,
                 gradient_as_bucket_view: bool = True, comm_hook: str | CommHook | None = None,
                 find_unused_parameters: bool = False, autotune_candidates_mb: Sequence[float] | None = None,
                 autotune_measure_steps: int = 3, transport: str = "auto",
                 timeout: timedelta = timedelta(minutes=10)) -> None:
        if not isinstance(module, nn.Module):
            raise TypeError(f"GradReducer expects an nn.Module; received {type(module).__name__}.")
        check_transport(transport)
        self._world_size = _world_size(process_group)
        self._group = process_group
        self._hook = resolve_comm_hook(comm_hook)
        self._params = trainable_parameters(module)
        self._shared_memory = self._connect_transport(transport, timeout)
        self._hook_state = CommHookState(process_group, self._world_size, self._shared_memory)
        # A hook that averages may receive buckets already divided by the world size (see _absorb_grad).
        self._prescale = self._world_size > 1 and getattr(self._hook, "accepts_prescaled", False)
        self._tuner = autotuner_for(bucket_cap_mb, autotune_candidates_mb, autotune_measure_steps)
        self._cap_mb = _FIRST_STEP_CAP_MB if self._tuner is not None else float(bucket_cap_mb)
        self._first_cap_mb = first_bucket_cap_mb
        self._as_view = gradient_as_bucket_view
        self._find_unused = find_unused_parameters
        self._sync = True
        self._rebuilt = False
        self._removed = False
        self._finalized_since_mark = False
        self._lock = threading.Lock()  # hooks of params on different devices run on different threads
        self.completed_syncs = 0  # synchronised backward passes so far: every rank met in each
        self._telemetry = ReducerTelemetry()
        self._order: list[int] = []  # readiness order the rebuilt plans follow (rank 0's, broadcast)
        self.launch_order_history: list[list[int]] = []
        self._install_buckets(plan_buckets(self._params, **self._caps()))  # validates the caps
        self._reset_pass()
        self._handles = [param.register_post_accumulate_grad_hook(self._make_hook(index))
                         for index, param in enumerate(self._params)]

    # ------------------------------------------------------------------ public interface
    @property
    def require_backward_grad_sync(self) -> bool:
        """Whether the next backward pass averages gradients (False inside `no_sync`)."""
        return self._sync

    @require_backward_grad_sync.setter
    def require_backward_grad_sync(self, value: bool) -> None:
        self._sync = bool(value)

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Let backward passes inside accumulate gradients locally, with no communication."""
        previous = self._sync
        self._sync = False
        try:
            yield
        finally:
            self._sync = previous  # the previous value, so nesting and exceptions are safe

    def prepare_for_backward(self, outputs: Any) -> None:
        """Start a pass; with `find_unused_parameters`, mark params `outputs` cannot reach as ready."""
        self._check_not_removed("prepare_for_backward")
        self._finalized_since_mark = False
        if not self._sync:
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
                    self._absorb_grad(index)
                    self._mark_ready(index)

    def finish_backward(self) -> None:
        """End a pass: no-op if the end-of-backward callback already ran, else flush every bucket."""
        self._check_not_removed("finish_backward")
        already_done, self._finalized_since_mark = self._finalized_since_mark, False
        if already_done or not self._sync:
            return
        self._finalize()

    def summary(self) -> dict[str, Any]:
        """Bucket plan and step telemetry (see strategies/telemetry.py for the timing keys)."""
        return {
            "world_size": self._world_size,
            "comm_hook": getattr(self._hook, "__name__", repr(self._hook)),
            "transport": "shared_memory" if self._shared_memory is not None else "process_group",
            "bucket_cap_mb": self._cap_mb,
            "autotune": self._tuner.summary() if self._tuner is not None else None,
            "buckets": len(self._buckets),
            "bucket_sizes_mib": [bucket.nbytes / MIB for bucket in self._buckets],
            "bucket_param_indices": [list(indexes) for indexes in self._plan],
            "rebuilt": self._rebuilt,
            "last_launch_order": list(self.launch_order_history[-1]) if self.launch_order_history else [],
            **self._telemetry.summary(),
        }

    @property
    def bucket_cap_mb(self) -> float:
        """The cap the current buckets were planned with (the tuned one once "auto" has decided)."""
        return self._cap_mb

    def adopt_bucket_cap(self, bucket_cap_mb: float) -> None:
        """Use a cap chosen earlier (a checkpoint's) instead of measuring; call between steps, on every rank."""
        if not float(bucket_cap_mb) > 0:
            raise ValueError(f"bucket_cap_mb={bucket_cap_mb!r} must be a positive number of MiB.")
        if self._pass_active:
            raise RuntimeError("adopt_bucket_cap() was called during a backward pass; call it between steps.")
        self._tuner = BucketAutotuner([float(bucket_cap_mb)])
        self._set_cap(float(bucket_cap_mb))

    def remove(self) -> None:
        """Detach from the module; every `.grad` becomes a standalone tensor again."""
        for handle in self._handles:
            handle.remove()
        self._handles = []
        if self._as_view:
            for param in self._params:
                if param.grad is not None:
                    param.grad = param.grad.clone()  # out of the bucket buffer we are about to drop
        self._install_buckets([])
        if self._shared_memory is not None:
            self._shared_memory.close()
            self._shared_memory = None
        self._removed = True

    # ------------------------------------------------------------------ transport
    def _connect_transport(self, transport: str, timeout: timedelta) -> SharedMemoryAllReduce | None:
        """Shared memory between CPU ranks of one host when possible ("auto"), else the process group."""
        if self._world_size == 1:
            return None
        devices = {param.device.type for param in self._params}
        if devices != {"cpu"}:
            if transport == "shared_memory":
                raise ValueError(f"transport='shared_memory' reduces CPU gradients only; these parameters live on "
                                 f"{sorted(devices)}. Use transport='auto' or 'process_group'.")
            return None
        return connect_shared_memory(self._group, transport=transport, timeout=timeout)

    # ------------------------------------------------------------------ buckets
    def _caps(self, bucket_cap_mb: float | None = None) -> dict[str, float]:
        return {"bucket_cap_mb": self._cap_mb if bucket_cap_mb is None else bucket_cap_mb,
                "first_bucket_cap_mb": self._first_cap_mb}

    def _install_buckets(self, plan: list[list[int]]) -> None:
        self._plan = plan
        self._buckets = build_buckets(self._params, plan)
        self._bucket_of = [0] * len(self._params)  # param index -> bucket index
        self._views: list[torch.Tensor] = [torch.empty(0)] * len(self._params)  # param index -> its slot
        for bucket_index, (indexes, bucket) in enumerate(zip(plan, self._buckets)):
            for param_index, view in zip(indexes, bucket.views()):
                self._bucket_of[param_index] = bucket_index
                self._views[param_index] = view

    def _replan(self, plan: list[list[int]]) -> None:
        """Switch to new buckets between steps, keeping the (already averaged) gradients."""
        self._install_buckets(plan)
        if self._as_view:  # the averaged grads live in the old buffers; move them into the new views
            for param, view in zip(self._params, self._views):
                if param.grad is not None:
                    view.copy_(param.grad)
                    param.grad = view

    def _rebuild(self) -> None:
        """Re-plan once in rank 0's observed readiness order, so buckets fill (and launch) sooner."""
        seen = set(self._ready_order)
        order = self._ready_order + [i for indexes in self._plan for i in indexes if i not in seen]
        if self._world_size > 1:
            box: list[Any] = [order]
            src = 0 if self._group is None else dist.get_global_rank(self._group, 0)
            LEDGER.begin("broadcast(bucket order)")
            dist.broadcast_object_list(box, src=src, group=self._group)
            order = box[0]
        self._order = order
        self._rebuilt = True
        if self._tuner is not None:
            if not self._tuner.done:  # try each distinct plan once
                plans = {mb: plan_buckets_in_order(self._params, order, **self._caps(mb))
                         for mb in self._tuner.candidates_mb}
                self._tuner.narrow(distinct_candidates(plans))
            self._cap_mb = self._tuner.current_mb
        self._replan(plan_buckets_in_order(self._params, order, **self._caps()))

    def _set_cap(self, bucket_cap_mb: float) -> None:
        """Plan with a new cap now if the order is known, else at the rebuild."""
        changed = bucket_cap_mb != self._cap_mb
        self._cap_mb = bucket_cap_mb
        if changed and self._rebuilt:
            self._replan(plan_buckets_in_order(self._params, self._order, **self._caps()))

    def _autotune_step(self, step: StepTimes) -> None:
        """Feed the tuner this pass's time; switch caps, or agree on the winner, when it says so."""
        tuner = self._tuner
        if tuner is None or tuner.done or not tuner.record(step.backward_s + step.exposed_comm_s):
            return
        if tuner.measured_all:
            chosen = tuner.agree(self._group, self._world_size)
            _log.info("bucket_cap_mb='auto' chose %s MiB (slowest-rank step ms per candidate %s: %s)",
                      chosen, tuner.candidates_mb, tuner.agreed_ms)
        self._set_cap(tuner.current_mb)

    # ------------------------------------------------------------------ one backward pass
    def _reset_pass(self) -> None:
        self._ready = [False] * len(self._params)
        self._scaled = [False] * len(self._params)  # slot already divided by the world size this pass
        self._pending = [len(indexes) for indexes in self._plan]
        self._futures = [None] * len(self._plan)
        self._next_bucket = 0
        self._ready_order = []
        self._launch_order = []
        self._pass_active = False
        self._callback_queued = False

    def _make_hook(self, index: int) -> Callable[[torch.Tensor], None]:
        def hook(param: torch.Tensor) -> None:
            if self._sync:
                with self._lock:
                    self._on_grad_ready(index)
        return hook

    def _on_grad_ready(self, index: int) -> None:
        self._telemetry.poll()
        if not self._callback_queued:
            # One callback per pass; it runs when the whole backward graph has finished.
            torch.autograd.Variable._execution_engine.queue_callback(self._on_backward_end)
            self._callback_queued = True
            self._telemetry.ensure_started()  # prepare_for_backward is optional
        self._pass_active = True
        if self._ready[index]:
            bucket_index = self._bucket_of[index]
            if self._futures[bucket_index] is not None:
                raise RuntimeError(
                    f"Parameter {index} received a gradient after its bucket was already sent. Either it "
                    "was marked unused (pass every output the loss depends on to prepare_for_backward) or "
                    "it got two gradients in one backward (reentrant checkpointing is not supported).")
            self._absorb_grad(index)  # marked unused up front but used after all: take the gradient
            return
        self._absorb_grad(index)
        self._mark_ready(index)

    def _absorb_grad(self, index: int) -> None:
        """Put this param's current gradient (zeros if none) into its bucket slot."""
        param, view = self._params[index], self._views[index]
        grad = param.grad
        if grad is None:
            view.zero_()
            self._scaled[index] = True  # zero divided is zero
            return
        if grad.is_sparse:
            raise RuntimeError(f"Parameter {index} has a sparse gradient, which GradReducer cannot bucket; "
                               "use dense gradients (e.g. nn.Embedding(sparse=False)).")
        if grad is not view and grad.data_ptr() != view.data_ptr():  # a fresh .grad (set_to_none=True)
            if self._prescale:  # divide on the way in: one pass over the gradient instead of two
                torch.div(grad, self._world_size, out=view)
                self._scaled[index] = True
            else:
                view.copy_(grad)
            if self._as_view:
                param.grad = view

    def _mark_ready(self, index: int) -> None:
        self._ready[index] = True
        self._ready_order.append(index)
        self._pending[self._bucket_of[index]] -= 1
        while self._next_bucket < len(self._buckets) and self._pending[self._next_bucket] == 0:
            self._launch(self._next_bucket)

    def _launch(self, bucket_index: int) -> None:
        bucket = self._buckets[bucket_index]
        if self._prescale:  # slots that accumulated in place (no_sync, set_to_none=False) are divided here
            for index, view in zip(self._plan[bucket_index], bucket.views()):
                if not self._scaled[index]:
                    view.div_(self._world_size)
            bucket.prescaled = True
        LEDGER.begin(f"gradient all-reduce, bucket {bucket_index}", bucket.buffer())
        future = self._hook(self._hook_state, bucket)
        self._futures[bucket_index] = future
        self._telemetry.bucket_launched(future)
        self._launch_order.append(bucket_index)
        self._next_bucket += 1

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
            used_future = launch_used_map(self._params, self._group, self._world_size) if self._find_unused else None
            results = [self._wait(future) for future in self._futures if future is not None]
            used = used_future.wait()[0].tolist() if used_future is not None else None
            step = self._telemetry.end_step()
            self._record_launch_order()
            self._write_back(results, used)
            self.completed_syncs += 1
            if not self._rebuilt:
                self._rebuild()
            else:
                self._autotune_step(step)
            self._reset_pass()

    def _wait(self, future: torch.futures.Future[torch.Tensor]) -> torch.Tensor:
        result = future.wait()
        self._telemetry.poll()
        return result

    def _write_back(self, results: list[torch.Tensor], used: list[int] | None) -> None:
        for indexes, bucket, result in zip(self._plan, self._buckets, results):
            if result.data_ptr() != bucket.buffer().data_ptr():  # the hook answered in a new tensor
                bucket.buffer().copy_(result.view_as(bucket.buffer()))
            for index, view in zip(indexes, bucket.views()):
                if used is not None and not used[index]:
                    continue  # no rank produced a gradient: leave .grad as it was (None)
                param = self._params[index]
                if self._as_view:
                    if param.grad is None:  # otherwise .grad already is the view (see _absorb_grad)
                        param.grad = view
                elif param.grad is None:
                    param.grad = view.clone()
                else:
                    param.grad.copy_(view)

    def _record_launch_order(self) -> None:
        self.launch_order_history.append(self._launch_order)
        del self.launch_order_history[:-_HISTORY_LIMIT]

    def _check_not_removed(self, method: str) -> None:
        if self._removed:
            raise RuntimeError(f"GradReducer.{method}() called after remove(); create a new GradReducer.")


def _world_size(process_group: dist.ProcessGroup | None) -> int:
    """World size of the group; 1 (no communication) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(process_group)
    if process_group is not None:
        raise RuntimeError("A process_group was passed but torch.distributed is not initialised; "
                           "call dist.init_process_group first.")
    return 1
