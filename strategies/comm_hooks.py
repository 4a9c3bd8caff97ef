"""Communication hooks: how one bucket's gradients are averaged across ranks.

A hook is a plain function `(state, bucket) -> Future[Tensor]`. It must launch its collective
asynchronously and return at once, so backward keeps computing while the bucket travels; the
future resolves to the averaged flat gradients (the reducer copies them into the bucket
buffer if the hook returns a different tensor). The reducer calls hooks for buckets in index
order on every rank, so a hook may issue collectives freely as long as it issues the same ones
for every bucket on every rank. `state.all_reduce_async(tensor)` sums over the reducer's
transport (shared memory between CPU ranks of one host, else the process group); a hook that
calls `torch.distributed` itself always uses the process group.

Division happens *before* the sum, as in torch's default hooks: it keeps the summed values in
the range of the gradients themselves, which matters most for the fp16 hook. For the built-in
mean hook the reducer divides while copying gradients into the bucket (`state.prescaled`), which
saves the hook a pass over the buffer; a custom hook always receives the undivided gradients.
Between CPU ranks of one host the built-in hooks get the gradients where autograd left them
(`bucket.in_place()`): the shared-memory transport divides them while copying them into its slots,
so no pass is spent on the bucket at all.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from strategies.buckets import GradBucket
from strategies.shm_transport import SharedMemoryAllReduce, check_transport, connect_shared_memory


@dataclass(frozen=True)
class CommHookState:
    """What the built-in hooks need: the group to reduce over, its size, the same-host
    shared-memory transport when `connect` could set one up (strategies/shm_transport.py), and
    whether the reducer already divided every bucket by the world size (`prescaled`, only ever
    True for the hook `prescales` names), so averaging must not divide again."""

    process_group: dist.ProcessGroup | None
    world_size: int
    shared_memory: SharedMemoryAllReduce | None = None
    prescaled: bool = False

    @classmethod
    def connect(cls, process_group: dist.ProcessGroup | None, params: Sequence[torch.Tensor], *, transport: str,
                timeout: timedelta, prescale: bool) -> CommHookState:
        """The state a reducer of `params` hands its hook; a collective when there are several ranks.

        `prescale`: the hook accepts buckets already divided by the world size (see
        `prescales`); it only takes effect where there is more than one rank.
        """
        check_transport(transport)
        world_size = _group_size(process_group)
        shared_memory = _connect_transport(process_group, world_size, params, transport, timeout)
        return cls(process_group, world_size, shared_memory, prescaled=prescale and world_size > 1)

    def close(self) -> None:
        """Release the shared-memory transport, if any (idempotent)."""
        if self.shared_memory is not None:
            self.shared_memory.close()

    def all_reduce_async(self, tensor: torch.Tensor,
                         wire_dtype: torch.dtype | None = None) -> torch.futures.Future[list[torch.Tensor]]:
        """Sum `tensor` in place over the ranks, asynchronously, by the reducer's transport.

        `wire_dtype` (shared memory only) sends the addends rounded to it, converting on the way
        into and out of the slots; the process group sends `tensor` as it is.
        """
        if self.shared_memory is not None:
            return self.shared_memory.all_reduce_async(tensor, wire_dtype)  # gloo's bits at 2 ranks
        if wire_dtype not in (None, tensor.dtype):
            raise ValueError(f"all_reduce_async(wire_dtype={wire_dtype}) needs the shared-memory transport; "
                             "over the process group, reduce a converted copy instead.")
        work = dist.all_reduce(tensor, group=self.process_group, async_op=True)
        if work is None:  # only with async_op=False; keeps the type checker honest
            raise RuntimeError("dist.all_reduce(async_op=True) returned no work handle.")
        return work.get_future()

    def reduce_scatter_async(self, tensor: torch.Tensor,
                             output: torch.Tensor) -> torch.futures.Future[list[torch.Tensor]]:
        """Sum `tensor` (world_size equal chunks) over the ranks into `output`, this rank's chunk of the sum
        (it may be that chunk of `tensor` itself), asynchronously, by the reducer's transport: ZeRO's gradients
        (strategies/zero_reducer.py). Over gloo it is an all-reduce of which this rank keeps its chunk: gloo's
        `reduce_scatter_single` (torch 2.13) has no future, so it could not overlap backward, and it took 2.4x
        an all-reduce's time (32 MiB, 2 ranks: 134 vs 56 ms, benchmarks/allreduce_micro.py); nccl's is used as it is."""
        if self.shared_memory is not None:
            return self.shared_memory.reduce_scatter_async(tensor, output)  # the all-reduce's bits
        if dist.get_backend(self.process_group) == "gloo":
            chunk = tensor.view(self.world_size, -1)[dist.get_rank(self.process_group)]

            def keep_my_chunk(summed: torch.futures.Future[list[torch.Tensor]]) -> list[torch.Tensor]:
                summed.value()  # raises the collective's error, if any
                if output.data_ptr() != chunk.data_ptr():
                    output.copy_(chunk)
                return [output]

            return self.all_reduce_async(tensor).then(keep_my_chunk)
        work = dist.reduce_scatter_single(output, tensor, group=self.process_group, async_op=True)
        if work is None:
            raise RuntimeError("dist.reduce_scatter_single(async_op=True) returned no work handle.")
        return work.get_future()


def _group_size(process_group: dist.ProcessGroup | None) -> int:
    """World size of the group; 1 (no communication) when torch.distributed is not initialised."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(process_group)
    if process_group is not None:
        raise RuntimeError("A process_group was passed but torch.distributed is not initialised; "
                           "call dist.init_process_group first.")
    return 1


def _connect_transport(process_group: dist.ProcessGroup | None, world_size: int, params: Sequence[torch.Tensor],
                       transport: str, timeout: timedelta) -> SharedMemoryAllReduce | None:
    """Shared memory between CPU ranks of one host when possible ("auto"), else the process group."""
    if world_size == 1:
        return None
    devices = {param.device.type for param in params}
    if devices != {"cpu"}:
        if transport == "shared_memory":
            raise ValueError(f"transport='shared_memory' reduces CPU gradients only; these parameters live on "
                             f"{sorted(devices)}. Use transport='auto' or 'process_group'.")
        return None
    return connect_shared_memory(process_group, transport=transport, timeout=timeout)


CommHook = Callable[[CommHookState, GradBucket], "torch.futures.Future[torch.Tensor]"]


def completed_future(tensor: torch.Tensor) -> torch.futures.Future[torch.Tensor]:
    """A future that already holds `tensor` (device-aware, so CUDA tensors are accepted)."""
    devices: list[int | str | torch.device] | None = [tensor.device] if tensor.device.type != "cpu" else None
    future: torch.futures.Future[torch.Tensor] = torch.futures.Future(devices=devices)
    future.set_result(tensor)
    return future


def allreduce_mean(state: CommHookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Average the bucket in place: divide by world size (unless the reducer already did, while
    copying the gradients in: `state.prescaled`), then sum over ranks."""
    if state.world_size == 1:  # the mean over one rank is the value itself: skip the collective
        return completed_future(bucket.buffer())
    return _mean_in_place(state, bucket)



def _mean_in_place(state: CommHookState, bucket: GradBucket,
                   wire_dtype: torch.dtype | None = None) -> torch.futures.Future[torch.Tensor]:
    gradients = bucket.in_place()
    if gradients is not None and state.shared_memory is not None:
        # The gradients where autograd left them (the reducer copied none): the transport divides each on the
        # way into its slot and writes the mean back over it, telling the reducer whether the means are finite.
        # Resolves to the buffer, so nothing is copied.
        summed = state.shared_memory.all_reduce_async(gradients, wire_dtype, divisor=state.world_size,
                                                      check_finite=True)

        def the_buffer(done: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            done.value()  # raises the transport's error, if any
            return bucket.buffer()

        return summed.then(the_buffer)
    buffer = bucket.buffer()
    if not state.prescaled:
        buffer.div_(state.world_size)
    return state.all_reduce_async(buffer, wire_dtype).then(lambda fut: fut.value()[0])


def _compressed_mean(dtype: torch.dtype) -> CommHook:
    def hook(state: CommHookState, bucket: GradBucket) -> torch.futures.Future[torch.Tensor]:
        buffer = bucket.buffer()
        if state.world_size == 1:  # nothing to send, so nothing to compress
            return completed_future(buffer)
        if state.shared_memory is not None:
            # Shared memory converts while copying into and out of the slots: no scratch copy and
            # no separate compress/decompress passes. Sums are rounded like gloo's at 2 ranks.
            return _mean_in_place(state, bucket, wire_dtype=dtype)
        # One reused low-precision buffer per bucket: a fresh one every step cost an allocation
        # and a page fault per 4 KiB. Rounded first, then divided, as torch's hooks (see `prescales`).
        compressed = bucket.scratch(dtype)
        compressed.copy_(buffer)
        if not state.prescaled:
            compressed.div_(state.world_size)

        def decompress(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
            buffer.copy_(fut.value()[0])
            return buffer

        return state.all_reduce_async(compressed).then(decompress)

    return hook


fp16_compress = _compressed_mean(torch.float16)
fp16_compress.__name__ = fp16_compress.__qualname__ = "fp16_compress"
fp16_compress.__doc__ = "Send the bucket as float16 (half the bytes); the average is written back in full precision."

bf16_compress = _compressed_mean(torch.bfloat16)
bf16_compress.__name__ = bf16_compress.__qualname__ = "bf16_compress"
bf16_compress.__doc__ = "Send the bucket as bfloat16 (half the bytes, fp32 range, fewer mantissa bits)."

COMM_HOOKS: dict[str, CommHook] = {
    "mean": allreduce_mean,
    "fp16": fp16_compress,
    "bf16": bf16_compress,
}


def accepts_prescaled(hook: CommHook) -> bool:
    """Whether `hook` is a built-in one, which knows to read `state.prescaled` and `bucket.in_place()` (the
    reducer then may hand it the gradients where autograd left them, or divided on the way in: `prescales`).
    Compared by identity, so a custom callable need not be hashable."""
    return any(hook is builtin for builtin in COMM_HOOKS.values())


def prescales(hook: CommHook) -> bool:
    """Whether the reducer divides while copying gradients into the buckets for `hook` (`state.prescaled`):
    for the built-in full-precision mean. A compressed hook divides after rounding to its wire dtype, as
    torch's do: dividing first rounds once instead of twice, other bits for fp16 values below 6e-5 (subnormal)
    or a world size that is no power of two."""
    return hook is allreduce_mean


def resolve_comm_hook(hook: str | CommHook | None) -> CommHook:
    """Turn a hook name (or None for the default "mean") into the hook function; pass callables through."""
    if hook is None:
        return allreduce_mean
    if isinstance(hook, str):
        if hook not in COMM_HOOKS:
            raise ValueError(f"comm_hook={hook!r} is not one of {sorted(COMM_HOOKS)}, None (the mean) or a callable "
                             "(state, bucket) -> torch.futures.Future[torch.Tensor].")
        return COMM_HOOKS[hook]
    if not callable(hook):
        raise TypeError(f"comm_hook must be a name, a callable or None; received {type(hook).__name__}.")
    return hook
