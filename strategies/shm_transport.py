"""Same-host all-reduce through shared memory: the gradient transport for CPU ranks on one machine.

Why it exists: gloo moves every byte of a CPU all-reduce through the loopback TCP stack, so each
byte is copied into the kernel and out again on both sides, on the same cores that compute the
next gradients. On the 2-core project machine a 32 MiB all-reduce between two ranks costs gloo
~29 ms of wall time and ~20 ms of CPU; through shared memory ~6 ms of each
(`python -m benchmarks.allreduce_micro`). Gloo has no shared-memory transport (NCCL has one, for
GPUs), so this file is ours.

How: every rank owns one region of a single file in /dev/shm, mapped by all ranks:
`[flags page | data slot]`. A tensor is reduced in rounds of at most one slot; one round is

  1. wait until every peer finished reading my slot in the previous round (its DONE flag),
  2. copy my piece into my slot (all but my own chunk of it, which only I read, when I can read it from the
     piece itself), publish READY,
  3. when all are READY, sum my share of the piece (chunk `rank`) over every rank, in rank order,
     into my piece and my slot; publish REDUCED,
  4. when all have REDUCED, copy every other chunk from its owner's slot; publish DONE.

Every chunk is summed by exactly one rank, so all ranks end with bit-identical values.
`all_gather_async` (ZeRO's gather of updated parameter shards, strategies/zero.py) runs the same
rounds without the sum: each rank copies its piece in, then every peer's piece out (exact copies).
`reduce_scatter_async` (ZeRO's gradients, strategies/zero_reducer.py) runs them without the copy back:
each round carries the same stretch of every rank's shard, each rank sums only its own shard's stretch
(in rank order, as the all-reduce sums a chunk, so the same bits) into its output, and nobody reads
the sums back: half the all-reduce's copies, and what DDP's all-reduce moves once the all-gather of
the updated parameters is added. A flag is
written only by its owner and read by the others; x86-64's total store order makes the data
written before a flag visible no later than the flag, which is why "auto" uses this transport
only there. Rounds run on one worker thread per process, in the order tensors were submitted;
torch releases the GIL inside each copy and add, so the round overlaps backward like gloo's own
thread does. Waiting backs off to short sleeps, so a rank that waits does not steal the core its
peer computes on, and gives up after `timeout` naming the rank it waited for.
"""

from __future__ import annotations

import logging
import math
import mmap
import os
import queue
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from strategies.hang_guard import LEDGER
from strategies.scattered import Scattered
from strategies.shm_region import (DONE, FAILED, FLAGS_BYTES, NONFINITE, READY, REDUCED, SHAPE, Obstacle,
                                   create_region, first_obstacle, host_identity, local_obstacle, open_region,
                                   region_bytes, unlink_quietly)

TRANSPORTS = ("auto", "shared_memory", "process_group")
_DEFAULT_SLOT_BYTES = 2 * 2**20  # per rank; larger measured no faster, and every rank maps every slot (RSS)
_ALIGN_BYTES = 64  # chunk boundaries on cache lines, so two writers never share one
_CLOSE_WAIT_S = 30.0
# Flag checks before sleeping, each after a sched_yield (~1 us; `time.sleep(0)` costs ~90 us here,
# a timer-slack sleep), so a peer a few microseconds behind is met without a wake-up.
_QUICK_POLLS = 64
_LONGEST_PAUSE_S = 1e-3  # the longest sleep between two looks at a peer's flag
_DTYPE_CODES = {dtype: code for code, dtype in enumerate(
    (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int32, torch.int64, torch.uint8,
     torch.int8, torch.int16, torch.complex64, torch.complex128), start=1)}
_FUSED_DTYPES = (torch.float32, torch.float64)  # where addcdiv rounds each step as a division and a sum do
_GATHER_CODE = 32  # added to a gather round's SHAPE word (dtype codes stay below it)
_SCATTER_CODE = 16  # added to a reduce-scatter round's SHAPE word
_log = logging.getLogger(__name__)


class SharedMemoryTimeout(RuntimeError):
    """A peer did not reach the same stage of a shared-memory all-reduce within the timeout."""


def check_transport(transport: Any) -> None:
    """A ValueError listing the choices for anything but a known transport name."""
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r} is not one of {list(TRANSPORTS)} ('auto': shared memory "
                         "between CPU ranks on one x86-64 host, else the process group).")


class SharedMemoryAllReduce:
    """Sum-all-reduce of CPU tensors in place among the ranks of one host (see the module docstring).

    Create it with `connect_shared_memory`, a collective. `all_reduce_async(tensor)` returns a
    future resolving to `[tensor]` (the shape of a gloo work's future), after which `tensor` holds
    the sum over ranks. Every rank must submit the same sequence of shapes and dtypes.
    """

    def __init__(self, region: mmap.mmap, *, rank: int, world_size: int, slot_bytes: int,
                 timeout: timedelta) -> None:
        if slot_bytes <= 0 or slot_bytes % mmap.PAGESIZE:
            raise ValueError(f"slot_bytes={slot_bytes} must be a positive multiple of the page size "
                             f"({mmap.PAGESIZE}), so every rank's flags and slot stay aligned.")
        self.rank, self.world_size, self.slot_bytes = rank, world_size, slot_bytes
        self._timeout_s = timeout.total_seconds()
        self._region = region
        stride = FLAGS_BYTES + slot_bytes
        self._flags = [memoryview(region)[k * stride:k * stride + FLAGS_BYTES].cast("q")
                       for k in range(world_size)]
        self._slots = [torch.frombuffer(region, dtype=torch.uint8, count=slot_bytes,
                                        offset=k * stride + FLAGS_BYTES) for k in range(world_size)]
        self._generation = 0
        self._nonfinite = 0  # rounds whose share I summed held a NaN or inf (published as NONFINITE)
        self._failure: BaseException | None = None
        self._queue: queue.SimpleQueue[_Operation | None] = queue.SimpleQueue()
        self._scratch = torch.empty(0)  # where my chunk of a round is summed when it spans several tensors
        self._divide_by = torch.tensor(1.0)  # the divisor as a tensor, for addcdiv (_divisor_tensor)
        self._closed = False
        self._thread = threading.Thread(target=self._serve, name=f"ddp-shm-allreduce-{rank}", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ public
    def all_reduce_async(self, tensor: torch.Tensor | Sequence[torch.Tensor], wire_dtype: torch.dtype | None = None,
                         divisor: int = 1, check_finite: bool = False) -> torch.futures.Future[list[torch.Tensor]]:
        """Queue `tensor` (CPU, contiguous) for an in-place sum over the ranks; return at once.

        `tensor` may be a list of such tensors of one dtype, reduced as one flat run in order (a bucket's
        gradients where autograd left them: strategies/scattered.py); the future then resolves to the list.
        A `divisor` divides each addend on the way into the slot (the mean's division, in the pass that
        copies anyway). With a `wire_dtype` (bf16/fp16 compression), each rank's addend is rounded to it on
        the way into its slot and the sum is rounded to it once; the additions themselves run in the
        tensors' dtype, and every rank gets the same rounded values. `check_finite`: each rank also looks at
        the share it summed while it is still in cache, and `nonfinite_rounds()` counts those holding a NaN
        or inf (the non-finite check's verdict without another pass over the gradients).
        """
        run = Scattered([tensor] if isinstance(tensor, torch.Tensor) else tensor)
        if run.device.type != "cpu":
            raise ValueError(f"the shared-memory all-reduce takes contiguous CPU tensors; got {run.device}. "
                             "Use transport='process_group'.")
        return self._submit(run, wire_dtype or run.dtype, divisor=divisor, check_finite=check_finite)

    def nonfinite_rounds(self) -> int:
        """Shares so far (of operations queued with `check_finite`; one per rank and round) whose sums held a
        NaN or inf, over all ranks: it grew during an operation exactly when some mean was not finite. Read it
        after an operation's future resolved: every peer counted that operation's rounds before it let this
        rank finish them, and cannot count the next one's before this rank queues it."""
        return sum(flags[NONFINITE] for flags in self._flags)

    def all_gather_async(self, output: torch.Tensor) -> torch.futures.Future[list[torch.Tensor]]:
        """Queue an in-place all-gather: `output` (CPU, contiguous, world_size equal chunks) holds this rank's
        chunk at chunk `rank`; when the future resolves, every chunk holds its owner's values (bit for bit)."""
        if output.device.type != "cpu" or not output.is_contiguous() or output.numel() % self.world_size:
            raise ValueError(f"the shared-memory all-gather takes a contiguous CPU tensor of world_size="
                             f"{self.world_size} equal chunks; got {output.numel()} elements on {output.device}.")
        return self._submit(Scattered([output]), None)  # no wire dtype: a gather, not a sum

    def reduce_scatter_async(self, tensor: torch.Tensor,
                             output: torch.Tensor) -> torch.futures.Future[list[torch.Tensor]]:
        """Queue a sum-reduce-scatter: `tensor` (CPU, contiguous, world_size equal chunks) is this rank's addend;
        when the future resolves (to `[output]`), `output` holds the sum over ranks of chunk `rank`, summed in
        rank order (the all-reduce's bits). `output` may be chunk `rank` of `tensor` itself."""
        chunk = tensor.numel() // self.world_size
        if (tensor.device.type != "cpu" or not tensor.is_contiguous() or tensor.numel() % self.world_size
                or not output.is_contiguous() or output.numel() != chunk or output.dtype != tensor.dtype):
            raise ValueError(f"the shared-memory reduce-scatter takes a contiguous CPU tensor of world_size="
                             f"{self.world_size} equal chunks and a contiguous output of one chunk in its dtype; got "
                             f"{tensor.numel()} elements ({tensor.dtype}, {tensor.device}) into {output.numel()} "
                             f"({output.dtype}).")
        return self._submit(Scattered([tensor]), tensor.dtype, output)

    def _submit(self, run: Scattered, wire_dtype: torch.dtype | None, output: torch.Tensor | None = None,
                divisor: int = 1, check_finite: bool = False) -> torch.futures.Future[list[torch.Tensor]]:
        """Queue one operation for the worker thread (failed at once if the transport already failed)."""
        future: torch.futures.Future[list[torch.Tensor]] = torch.futures.Future()
        if self._failure is not None or self._closed:
            _fail(future, self._failure or RuntimeError("the shared-memory all-reduce was closed."))
            return future
        self._queue.put(_Operation(run, wire_dtype, future, output, divisor, check_finite))
        return future

    def close(self) -> None:
        """Finish the queued reductions, stop the worker and unmap the region.

        A worker still waiting for a peer after `_CLOSE_WAIT_S` is told to give up; one that still
        does not stop keeps the mapping (unmapping memory a thread may touch would be a crash).
        """
        if self._closed:
            return
        self._queue.put(None)
        self._thread.join(timeout=_CLOSE_WAIT_S)
        self._closed = True  # from here on, a wait gives up at its next poll
        self._thread.join(timeout=1.0)
        if self._thread.is_alive():
            _log.warning("the shared-memory all-reduce worker of rank %d did not stop; its mapping stays until "
                         "the process exits.", self.rank)
            return
        for flags in self._flags:
            flags.release()
        self._flags, self._slots = [], []
        self._region.close()

    # ------------------------------------------------------------------ worker thread
    def _serve(self) -> None:
        # One intra-op thread here. A new thread starts with the rank's own count (8 on a 16-core host
        # with 2 ranks), so every copy and add of a round would start a second OpenMP team beside the one
        # backward is computing with, twice the rank's share of the cores, spinning between rounds: the cnn
        # ran at 0.43x torch DDP that way (benchmarks/results/gpu_h100_r5). gloo's reductions are one thread
        # too, and a round is bounded by memory, not by arithmetic. The setting is this thread's alone.
        torch.set_num_threads(1)
        while True:
            item = self._queue.get()
            if item is None:
                return
            self._reduce_one(item)
            # Drop the tensor now, not when the next one arrives: after a bucket rebuild the old
            # buffer would otherwise live on next to the new ones (a peak of one bucket's size).
            del item

    def _reduce_one(self, operation: _Operation) -> None:
        future, run, output = operation.future, operation.run, operation.output
        if self._failure is not None:
            _fail(future, self._failure)
            return
        try:
            if output is not None:
                self._scatter(run.tensors[0].view(-1), output.view(-1))
            elif operation.wire_dtype is None:
                self._gather(run.tensors[0].view(-1))
            else:
                per_round = max(1, self.slot_bytes // operation.wire_dtype.itemsize)
                for start in range(0, run.numel, per_round):
                    self._round(run, start, min(per_round, run.numel - start), operation.wire_dtype,
                                operation.divisor, operation.check_finite)
        except BaseException as error:  # noqa: BLE001 - handed to the waiting rank's main thread
            self._failure = error  # the flags are mid-round now: every later reduction fails too
            self._publish(FAILED, 1)  # peers stop waiting for us at their next poll
            _fail(future, error)
        else:
            future.set_result([output] if output is not None else run.tensors)  # the output, for a reduce-scatter

    def _round(self, run: Scattered, start: int, count: int, wire_dtype: torch.dtype, divisor: int,
               check_finite: bool) -> None:
        """Elements [start, start + count) of `run` (at most one slot): in, my chunk summed, the others out."""
        generation = self._generation = self._generation + 1
        slots = [slot[:count * wire_dtype.itemsize].view(wire_dtype) for slot in self._slots]
        mine = slots[self.rank]
        low, high = self._chunk(count, self.rank, wire_dtype.itemsize)
        mine_from_run = wire_dtype == run.dtype and run.dtype in _FUSED_DTYPES  # see _sum_with_my_share
        self._wait_for_all(DONE, generation - 1, "finish reading the previous round")
        # Divided and rounded to the wire dtype on the way in, in the same pass. Only the peers read my slot, and
        # only their own chunks of it: my chunk goes in as its sum, unless it has to be read from the slot.
        if mine_from_run:
            run.read_into(start, mine[:low], divisor)
            run.read_into(start + high, mine[high:], divisor)
        else:
            run.read_into(start, mine, divisor)
        self._publish(SHAPE, count * 64 + _DTYPE_CODES.get(wire_dtype, 0))
        self._publish(READY, generation)
        self._wait_for_all(READY, generation, "copy its gradients in")
        self._check_same_shape(wire_dtype, generation)
        if high > low:
            addends = [slot[low:high] for slot in slots]
            summed = (self._sum_with_my_share(run, start + low, addends, divisor) if mine_from_run
                      else self._sum_my_chunk(run, start + low, addends))
            if check_finite and not _all_finite(summed):
                self._nonfinite += 1
                self._publish(NONFINITE, self._nonfinite)  # before REDUCED: a peer past it sees this count
        self._publish(REDUCED, generation)
        self._wait_for_all(REDUCED, generation, "sum its share")
        for peer in range(self.world_size):
            if peer != self.rank:
                low, high = self._chunk(count, peer, wire_dtype.itemsize)
                if high > low:
                    run.write_from(start + low, slots[peer][low:high])
        self._publish(DONE, generation)

    def _gather(self, flat: torch.Tensor) -> None:
        """All-gather in rounds of at most one slot per rank: my chunk's piece in, every peer's piece out."""
        chunk, dtype = flat.numel() // self.world_size, flat.dtype
        per_round = max(1, self.slot_bytes // dtype.itemsize)
        for start in range(0, chunk, per_round):
            count = min(per_round, chunk - start)
            generation = self._generation = self._generation + 1
            slots = [slot[:count * dtype.itemsize].view(dtype) for slot in self._slots]
            self._wait_for_all(DONE, generation - 1, "finish reading the previous round")
            low = self.rank * chunk + start
            slots[self.rank].copy_(flat[low:low + count])
            self._publish(SHAPE, count * 64 + _GATHER_CODE + _DTYPE_CODES.get(dtype, 0))  # a sum's round differs
            self._publish(READY, generation)
            self._wait_for_all(READY, generation, "copy its shard in")
            self._check_same_shape(dtype, generation)
            for peer in range(self.world_size):
                if peer != self.rank:
                    low = peer * chunk + start
                    flat[low:low + count].copy_(slots[peer])
            self._publish(REDUCED, generation)  # nothing to sum; the flag keeps the generations in step
            self._publish(DONE, generation)

    def _scatter(self, flat: torch.Tensor, output: torch.Tensor) -> None:
        """Reduce-scatter in rounds: each carries the same stretch of every rank's chunk (one strided copy into
        my slot); I sum my chunk's stretch over every slot into `output` and read nothing back."""
        dtype, chunk = flat.dtype, flat.numel() // self.world_size
        align = max(1, _ALIGN_BYTES // dtype.itemsize)
        per_rank = max(1, self.slot_bytes // dtype.itemsize // self.world_size)
        if per_rank >= align:  # each rank's stretch of a slot on whole cache lines
            per_rank -= per_rank % align
        by_rank = flat.view(self.world_size, chunk)
        for start in range(0, chunk, per_rank):
            count = min(per_rank, chunk - start)
            generation = self._generation = self._generation + 1
            slots = [slot[:self.world_size * per_rank * dtype.itemsize].view(dtype).view(self.world_size, per_rank)
                     for slot in self._slots]
            self._wait_for_all(DONE, generation - 1, "finish reading the previous round")
            slots[self.rank][:, :count].copy_(by_rank[:, start:start + count])
            self._publish(SHAPE, count * 64 + _SCATTER_CODE + _DTYPE_CODES.get(dtype, 0))
            self._publish(READY, generation)
            self._wait_for_all(READY, generation, "copy its gradients in")
            self._check_same_shape(dtype, generation)
            mine = output[start:start + count]  # may alias my chunk of `flat`: its stretch is in my slot already
            torch.add(slots[0][self.rank, :count], slots[1][self.rank, :count], out=mine)
            for slot in slots[2:]:
                mine.add_(slot[self.rank, :count])
            self._publish(REDUCED, generation)  # nobody reads the sums back; the flags keep the generations in step
            self._publish(DONE, generation)

    def _sum_my_chunk(self, run: Scattered, start: int, addends: list[torch.Tensor]) -> torch.Tensor:
        """Sum my chunk of every rank's slot into `run` from `start` and into my slot, for the peers; return
        the sums as every rank will hold them (in my slot or in private memory, still in cache).

        Compressed (a wire dtype narrower than `run`'s), two addends are added by the wire dtype's
        own kernel straight into my slot: on CPU it adds in fp32 and rounds once, the same bits as
        an fp32 sum rounded, without the mixed-dtype add that is 2.5x slower. More addends are
        accumulated in `run`'s dtype, so the sum is rounded once, not once per rank.
        """
        mine, count = addends[self.rank], addends[0].numel()
        if mine.dtype != run.dtype and len(addends) == 2:
            torch.add(addends[0], addends[1], out=mine)  # elementwise: writing an input in place is safe
            run.write_from(start, mine)
            return mine
        # Into private memory first (the destination itself when it is one tensor): my slot still holds my
        # addend until the sum is done.
        share = run.single(start, start + count)
        total = share if share is not None else self._scratch_of(run.dtype, count)
        torch.add(addends[0], addends[1], out=total)
        for addend in addends[2:]:
            total.add_(addend)
        mine.copy_(total)
        if mine.dtype != run.dtype:  # keep what the peers will read: the sum rounded to the wire dtype
            total.copy_(mine)
        if share is None:
            run.write_from(start, total)
        return total

    def _sum_with_my_share(self, run: Scattered, start: int, addends: list[torch.Tensor], divisor: int) -> torch.Tensor:
        """Sum my chunk over every rank into `run` from `start`, my own share read from `run` itself (divided on
        the way: `addcdiv` adds `share / divisor`, rounded, to the peers' sum so far), and copy the sums into my
        slot for the peers; return them.

        Why: my share copied into my slot only to be read back by me is a pass over half of a 2-rank round for
        nothing. The sums keep the rank order (the ranks before mine, mine, the ranks after) and each step's
        rounding, so the bits are those of `_sum_my_chunk`: `addcdiv` rounds the quotient, then the sum (float32
        and float64 only: a narrower dtype is computed wider and rounded once, other bits). One exception, NaN's
        sign and payload: where rank 0's and rank 1's shares are both NaN, rank 0 adds them the other way round
        and keeps its own NaN where `_sum_my_chunk` kept rank 1's (a NaN either way, the same on every rank)."""
        count, rank = addends[0].numel(), self.rank
        before, after = addends[:rank], addends[rank + 1:]
        if rank == 0:  # my share first: share + next == next + share, exactly (but which NaN, for two)
            partial, after = after[0], after[1:]
        elif rank == 1:
            partial = before[0]
        else:
            partial = self._scratch_of(run.dtype, count)
            torch.add(before[0], before[1], out=partial)
            for addend in before[2:]:
                partial.add_(addend)
        divide_by = self._divisor_tensor(run.dtype, divisor)
        for piece, offset in run.pieces(start, start + count):
            stop = offset + piece.numel()
            torch.addcdiv(partial[offset:stop], piece, divide_by, out=piece)  # elementwise: writing an input is safe
            for addend in after:
                piece.add_(addend[offset:stop])
        mine = addends[rank]
        run.read_into(start, mine)
        return mine

    def _divisor_tensor(self, dtype: torch.dtype, divisor: int) -> torch.Tensor:
        """`divisor` as a 0-dim tensor of `dtype` (what `addcdiv` divides by), kept between rounds."""
        if self._divide_by.dtype != dtype or int(self._divide_by) != divisor:
            self._divide_by = torch.tensor(float(divisor), dtype=dtype)
        return self._divide_by

    def _scratch_of(self, dtype: torch.dtype, count: int) -> torch.Tensor:
        """`count` elements of private memory in `dtype`, kept between rounds (a round is at most one slot)."""
        if self._scratch.dtype != dtype or self._scratch.numel() < count:
            self._scratch = torch.empty(max(count, self.slot_bytes // dtype.itemsize), dtype=dtype)
        return self._scratch[:count]

    def _check_same_shape(self, wire_dtype: torch.dtype, generation: int) -> None:
        mine = self._flags[self.rank][SHAPE]
        for peer in range(self.world_size):
            theirs = self._flags[peer][SHAPE]
            if theirs != mine:
                raise RuntimeError(
                    f"shared-memory all-reduce round {generation}: rank {self.rank} sends {mine // 64} elements "
                    f"({wire_dtype}) but rank {peer} sends {theirs // 64} (dtype code {theirs % 64}); every rank "
                    "must reduce the same gradients in the same order (are the models or the code different?).")

    def _chunk(self, count: int, owner: int, element_size: int) -> tuple[int, int]:
        align = max(1, _ALIGN_BYTES // element_size)
        per_rank = -(-count // self.world_size)
        per_rank = -(-per_rank // align) * align
        return min(count, owner * per_rank), min(count, (owner + 1) * per_rank)

    def _publish(self, flag: int, generation: int) -> None:
        self._flags[self.rank][flag] = generation

    def _wait_for_all(self, flag: int, generation: int, stage: str) -> None:
        started = None
        polls = 0
        for peer in range(self.world_size):
            flags = self._flags[peer]
            while flags[flag] < generation:
                started = time.monotonic() if started is None else started
                polls += 1
                self._pause(polls)
                if flags[flag] < generation:  # a peer may flag a failure right after arriving: arrival wins
                    self._check_still_waiting(peer, stage, generation, time.monotonic() - started)

    def _pause(self, polls: int) -> None:
        """Between two looks at a peer's flag: a few quick yields cover a peer that is microseconds
        behind; after that, sleep, so a waiting rank leaves the (possibly shared) core to the peer it
        waits for."""
        if polls < _QUICK_POLLS:
            os.sched_yield()
        else:
            time.sleep(min(_LONGEST_PAUSE_S, 2e-5 * (polls - _QUICK_POLLS + 1)))

    def _check_still_waiting(self, peer: int, stage: str, generation: int, waited: float) -> None:
        if self._flags[peer][FAILED]:
            raise RuntimeError(f"rank {peer} failed in shared-memory all-reduce round {generation} (its own error "
                               f"says why); rank {self.rank} stopped waiting for it to {stage}.")
        if self._closed:
            raise RuntimeError("the shared-memory all-reduce was closed while it waited.")
        if LEDGER.aborted is not None:
            raise RuntimeError(f"rank {self.rank} stopped waiting for rank {peer} in shared-memory all-reduce round "
                               f"{generation}: the stage was given up ({LEDGER.aborted}).")
        if waited > self._timeout_s:
            raise SharedMemoryTimeout(
                f"rank {self.rank} waited {waited:.0f} s for rank {peer} to {stage} in shared-memory "
                f"all-reduce round {generation}; rank {peer} is stuck, dead, or running different "
                "code (every rank must reduce the same gradients in the same order).")


@dataclass(frozen=True)
class _Operation:
    """One queued all-reduce (`output` None), all-gather (`wire_dtype` None) or reduce-scatter (into `output`)."""

    run: Scattered
    wire_dtype: torch.dtype | None
    future: torch.futures.Future[list[torch.Tensor]]
    output: torch.Tensor | None = None
    divisor: int = 1
    check_finite: bool = False


def _all_finite(values: torch.Tensor) -> bool:
    """Whether every element is finite. A sum is one pass that NaN and inf survive; only a sum of finite values
    that overflows needs the exact (allocating) test, and then it decides."""
    total = float(torch.sum(values, dtype=torch.float64 if values.dtype == torch.float64 else torch.float32))
    return math.isfinite(total) or bool(torch.isfinite(values).all())


def _fail(future: torch.futures.Future[list[torch.Tensor]], error: BaseException) -> None:
    future.set_exception(error)  # type: ignore[arg-type]  # torch's stub types it like set_result


# ---------------------------------------------------------------------- setup (a collective)
def connect_shared_memory(group: dist.ProcessGroup | None, *, transport: str, timeout: timedelta,
                          slot_bytes: int = _DEFAULT_SLOT_BYTES) -> SharedMemoryAllReduce | None:
    """Map one shared region among the ranks of `group`, or None to use the process group.

    Collective: every rank of `group` calls it. "process_group" returns None at once on every rank;
    "auto" returns None (and logs why) when shared memory cannot serve every rank;
    "shared_memory" raises instead, naming the rank and the reason.
    """
    check_transport(transport)
    world_size = dist.get_world_size(group)
    if transport == "process_group" or world_size == 1:
        return None
    rank = dist.get_rank(group)
    # Every local step turns its errors into an Obstacle, so every rank reaches every collective
    # below and all ranks reach the same verdict: no rank can be left waiting in one.
    reports = _gather(group, "hosts", (host_identity(), local_obstacle(region_bytes(world_size, slot_bytes))))
    obstacle = first_obstacle(reports)
    created: tuple[str, int] | Obstacle | None = None
    if obstacle is None:
        box: list[Any] = [create_region(world_size, slot_bytes) if rank == 0 else None]
        LEDGER.begin("broadcast(shared-memory region)")
        dist.broadcast_object_list(box, src=_global_rank(group, 0), group=group)
        created = box[0]
        obstacle = created if isinstance(created, Obstacle) else None
    region: mmap.mmap | None = None
    try:
        if isinstance(created, tuple):
            region, obstacle = open_region(created, rank, world_size, slot_bytes)
        results = _gather(group, "mapped", obstacle)  # also the barrier before the file is unlinked
    finally:
        if rank == 0 and isinstance(created, tuple):
            unlink_quietly(created[0])
    obstacle = next((result for result in results if result is not None), None)
    if obstacle is None and region is not None:
        return SharedMemoryAllReduce(region, rank=rank, world_size=world_size, slot_bytes=slot_bytes,
                                     timeout=timeout)
    if region is not None:
        region.close()
    message = f"the shared-memory gradient transport is unavailable: {obstacle}"
    if transport == "shared_memory":
        raise RuntimeError(message + ". Use strategy transport='auto' or 'process_group'.")
    _log.info("%s; gradients go through the process group instead.", message)
    return None


def _gather(group: dist.ProcessGroup | None, what: str, mine: Any) -> list[Any]:
    LEDGER.begin(f"all_gather(shared-memory {what})")
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, mine, group=group)
    return gathered


def _global_rank(group: dist.ProcessGroup | None, group_rank: int) -> int:
    return group_rank if group is None else dist.get_global_rank(group, group_rank)
