"""The collectives a distributed strategy offers its users (Lightning's `reduce`, `all_gather`,
`broadcast`, `barrier`), on the default process group.

Each is recorded in the hang guard's ledger (strategies/hang_guard.py), so a rank that stops
meeting the others in one is named with its call site. Without a process group each is the
identity, as on one process. Every rank must call them in the same order.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist

from strategies.base import ReduceOp
from strategies.hang_guard import LEDGER
from strategies.rank_zero import rank_prefixed_message

_TORCH_OPS = {"sum": dist.ReduceOp.SUM, "mean": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX,
              "min": dist.ReduceOp.MIN}


def all_reduce(tensor: torch.Tensor, op: ReduceOp, device: torch.device, group: Any = None) -> torch.Tensor:
    """A new tensor holding `tensor` reduced over the ranks (communicated on `device`); a mean of
    integers comes back as float64, since it is no integer."""
    if not dist.is_initialized():
        return tensor.clone()
    result = tensor.detach().clone().to(device)
    if op == "mean" and not (result.is_floating_point() or result.is_complex()):
        result = result.double()
    with LEDGER.collective(f"all_reduce({op})", result):
        dist.all_reduce(result, op=_TORCH_OPS[op], group=group)
    if op == "mean":
        result /= dist.get_world_size(group)
    return result.to(tensor.device)


def all_gather(tensor: torch.Tensor, device: torch.device, group: Any = None, sync_grads: bool = False) -> torch.Tensor:
    """Every rank's `tensor` stacked along a new leading dimension; the shapes are compared first,
    since a mismatch would corrupt or hang the gather. `sync_grads` lets gradients flow back."""
    if not dist.is_initialized():
        return tensor
    local = tensor.contiguous().to(device)
    shapes: list[Any] = [None] * dist.get_world_size(group)
    with LEDGER.collective("all_gather(shapes)"):
        dist.all_gather_object(shapes, tuple(local.shape), group=group)
    if len(set(shapes)) > 1:
        raise ValueError(rank_prefixed_message(
            f"all_gather needs the same shape on every rank, got {dict(enumerate(shapes))}; "
            f"pad the tensors to a common shape first.", dist.get_rank()))
    with LEDGER.collective("all_gather", local):
        if sync_grads:  # the autograd-aware gather: each rank's gradient flows back to its own input
            from torch.distributed.nn.functional import all_gather as differentiable_all_gather

            gathered = list(differentiable_all_gather(local, group=group or dist.group.WORLD))
        else:
            local = local.detach()
            gathered = [torch.empty_like(local) for _ in shapes]
            dist.all_gather(gathered, local, group=group)
    return torch.stack(gathered).to(tensor.device)


def broadcast_object(obj: Any, src: int = 0) -> Any:
    """Rank `src`'s `obj` (any picklable object) on every rank."""
    if not dist.is_initialized():
        return obj
    holder = [obj]
    with LEDGER.collective(f"broadcast(object, src={src})"):
        dist.broadcast_object_list(holder, src=src)
    return holder[0]


def barrier(device: torch.device, name: str | None = None) -> None:
    """Wait for every rank; NCCL's barrier is told this rank's device, else it guesses one."""
    if not dist.is_initialized():
        return
    with LEDGER.collective(f"barrier({name})" if name else "barrier"):
        if dist.get_backend() == "nccl":
            dist.barrier(device_ids=[device.index or 0])
        else:
            dist.barrier()
